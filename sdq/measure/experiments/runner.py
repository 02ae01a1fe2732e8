"""A sweep: every configuration `repeat` times, alternating, journaled, resumable.

Order: repeat-major, configurations in the same order within each repeat (A B C A B C ...), so
slow drift of the machine (other load, thermal state, a growing page cache) falls on every
configuration alike instead of on whichever ran last. With `rotate`, repeat r runs them rotated
by r // 2 and reversed when r is odd (A B C, C B A, B C A, A C B, ...; two: A B, B A, B A, A B):
over each two repeats every two configurations run in both orders, and none always runs first.
Every finished run is appended to the journal before the next starts; a re-run skips the
(key, repeat) pairs the journal already holds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from sdq.measure.experiments.config import RunConfig
from sdq.measure.experiments.execute import run_config
from sdq.measure.experiments.journal import Journal


def schedule(
    configs: Sequence[RunConfig], repeat: int, rotate: bool = False
) -> list[tuple[int, RunConfig]]:
    """(repeat index, configuration) in the order they run."""
    n = len(configs)
    if not rotate or n == 0:
        return [(r, c) for r in range(repeat) for c in configs]
    out = []
    for r in range(repeat):
        order = [configs[(r // 2 + i) % n] for i in range(n)]
        out += [(r, c) for c in (order[::-1] if r % 2 else order)]
    return out


def run_sweep(
    configs: Sequence[RunConfig],
    repeat: int,
    journal: Journal,
    *,
    progress: bool = True,
    timeout_s: float = 900.0,
    system_drop: bool = False,
    cold_wait_s: float = 60.0,
    execute: Callable[..., dict] = run_config,
    desc: str = "",
    rotate: bool = False,
) -> list[dict]:
    """Runs what the journal does not hold yet; returns this sweep's rows (old and new) in
    schedule order."""
    from tqdm import tqdm

    keys = [c.key for c in configs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"two configurations of the sweep have the same key {dup}")
    plan = schedule(configs, repeat, rotate)
    done = journal.done()
    todo = [(r, c) for r, c in plan if (c.key, r) not in done]
    bar = tqdm(
        total=len(plan),
        initial=len(plan) - len(todo),
        desc=desc or (configs[0].suite if configs else "sweep"),
        unit="run",
        disable=not progress,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    try:
        for r, c in todo:
            bar.set_postfix_str(f"repeat {r + 1}/{repeat}: {c.label}", refresh=True)
            row = execute(
                c, r, timeout_s=timeout_s, system_drop=system_drop, cold_wait_s=cold_wait_s
            )
            journal.append(row)
            bar.update(1)
    finally:
        bar.close()
    wanted = {(c.key, r): i for i, (r, c) in enumerate(plan)}
    rows = {}
    for row in journal.read():
        k = (row["key"], int(row["repeat"]))
        if k in wanted:
            rows[k] = row  # a later duplicate (a re-run by hand) replaces an earlier one
    return sorted(rows.values(), key=lambda row: wanted[(row["key"], int(row["repeat"]))])
