"""The Python API: `sdq.load(path, ram_budget_mb=..., **settings)` -> a Model ready to generate.

    import sdq
    with sdq.load("model.gguf", ram_budget_mb=4000, temp=0) as m:
        print(m.generate("The capital of France is", n=16).text)
        for event in m.generate([{"role": "user", "content": "Hi"}], stream=True):
            print(event.text, end="", flush=True)
        chat = m.chat(system="You are terse.")
        chat.send("Hello").text
        m.stats()  # the last run's figures, as `sdq chat --json` reports them

The settings are `sdq chat`'s run flags under their names in sdq.run.settings.RunSettings and
SamplerSettings (n_ctx, n_ubatch, threads, n_predict, temp, top_k, top_p, seed, stop_at_eos,
reserve_mb, max_slots, io_threads, io_mode, cache_policy, resident, route_log, ...), with the same
defaults and the same checks; a misspelt or mistyped one is a ParamsError. The Model and its
methods are sdq.run.runtime's.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path

from sdq.errors import ParamsError
from sdq.run.runtime import Chat, Completion, Model, TokenEvent

__all__ = ["Chat", "Completion", "Model", "TokenEvent", "load"]


def load(model: str | Path, *, ram_budget_mb: float | None = None, **settings) -> Model:
    """Open `model` (a GGUF file) for generation: the memory plan for `ram_budget_mb` (MiB the
    whole process may use; None: the memory available now), the pager, the engine. `settings`
    as in the module docstring. Close the Model (or use `with`) to release the pager."""
    from sdq.commands.run_flags import checked_settings
    from sdq.run.settings import RunSettings

    args = _run_flag_defaults()
    given = {"ram_budget_mb": ram_budget_mb, **settings}
    for key, value in given.items():
        _check(key, value)
        setattr(args, key, value)
    args.model = str(model)
    return Model(checked_settings(RunSettings.from_args(args)))


def _run_flag_defaults() -> argparse.Namespace:
    """The run flags' defaults, as `sdq chat` has them, under their settings names."""
    from sdq.commands.run_flags import add_run_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_run_arguments(parser)
    return parser.parse_args([])


def _check(key: str, value) -> None:
    """ParamsError unless `key` is a run setting and `value` has its type."""
    hints = _setting_types()
    if key not in hints:
        raise ParamsError(f"sdq.load: unknown setting {key!r} (known: {', '.join(sorted(hints))})")
    allowed = hints[key]
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
        raise ParamsError(f"sdq.load: {key}={value!r} must be {names}")


def _setting_types() -> dict[str, tuple[type, ...]]:
    """Setting name -> the types its value may have, from RunSettings' and SamplerSettings'
    annotations (an int is accepted where a float is)."""
    from sdq.run.sampler import SamplerSettings
    from sdq.run.settings import RunSettings

    out = {}
    for cls in (RunSettings, SamplerSettings):
        for name, hint in typing.get_type_hints(cls).items():
            if name in ("model", "sampler"):
                continue
            kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
            if float in kinds:
                kinds = (*kinds, int)
            out[name] = tuple(kinds)
    return out
