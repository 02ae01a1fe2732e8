"""The child process of sdq.run.jit_warm: one short generation of a model, so that every
kernel a paged run of it calls is compiled and cached.

    python -m sdq.run.jit_warm_child MODEL THREADS

A prompt of N_UBATCH + EXTRA_TOKENS tokens (a full ubatch, then a short one: the parallel and
the serial variant of each size-dependent kernel), DECODE_TOKENS generated (two decode steps,
with the prefetch), the smallest arena, the context just large enough; the experts are read
with cache mode dontneed, so a run that follows finds none of them in the page cache (its cold
start stays cold). Exit status 0: done;
jit_warm.REFUSED: the model was refused (an SdqError, its message on stderr).
"""

from __future__ import annotations

import sys

N_UBATCH = 128
EXTRA_TOKENS = 3
DECODE_TOKENS = 3


def warm(model_path: str, threads: int) -> None:
    from sdq.format.model import open_model
    from sdq.paging.policies import min_slots
    from sdq.paging.prefetch import prefetch_width
    from sdq.run.session import RunSettings, Session

    spec = open_model(model_path).spec
    K = spec.n_expert_used
    n_prompt = N_UBATCH + EXTRA_TOKENS
    settings = RunSettings(
        model=model_path,
        n_ctx=n_prompt + DECODE_TOKENS + 1,
        n_ubatch=N_UBATCH,
        threads=threads,
        n_predict=DECODE_TOKENS,
        stop_at_eos=False,
        max_slots=min_slots("lrfu_bypass", K, prefetch_width(K)),
        cache_mode="dontneed",  # leaves no expert pages cached for the run that follows
        pack="none",
    )
    session = Session(settings)
    try:
        session.generate([(7 + 13 * i) % spec.n_vocab for i in range(n_prompt)])
    finally:
        session.close()


def main() -> int:
    from sdq.errors import SdqError
    from sdq.run.jit_warm import REFUSED

    try:
        warm(sys.argv[1], int(sys.argv[2]))
    except SdqError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
