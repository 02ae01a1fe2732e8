"""From journal rows to tables: one row per run (`runs_frame`), medians and spread per
configuration (`summarize`), the op profile per run (`profile_frame`) and its medians scaled
to add up (`additive_breakdown`).

Spread of a metric over the repeats of one configuration: min, max, and (max - min) / median,
the relative width a reader compares against the differences between configurations. With the
seed's 3-5 repeats, min and max say more than a standard deviation would.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from sdq.units import MIB

# figures a chat reports (DESIGN.md names), taken from its JSON
CHAT_METRICS = (
    "decode_tok_s",
    "prefill_tok_s",
    "ttft_ms",
    "hit_rate",
    "prefetch_hit_rate",
    "prefetch_accuracy",
    "guess_accuracy_d1",
    "guess_accuracy_d2",
    "reads_avoided",
    "ssd_mb_per_token",
    "prefetch_mb_per_token",
    "expert_io_ms_per_token",
    "expert_compute_ms_per_token",
    "total_ms_per_token",
    "slots",
    "slot_bytes",
    "n_prompt",
    "n_decode",
)


def run_record(row: dict) -> dict:
    """One journal row as a flat record: the configuration, how the run ended, its figures."""
    rec = {k: v for k, v in row.items() if k not in ("result", "command")}
    res = row.get("result") or {}
    for name in CHAT_METRICS:
        rec[name] = res.get(name)
    rec["cache_mode"] = res.get("cache_mode", rec.get("cache_mode"))
    rec["peak_rss_mb_reported"] = res.get("peak_rss_mb")  # the chat's own ru_maxrss figure
    rec["generated_digest"] = res.get("generated_digest")
    rec["cold"] = is_cold(row)
    plan = (res.get("settings") or {}).get("plan") or {}
    for src, dst in (
        ("ram_budget_bytes", "plan_budget_mb"),
        ("compute_bytes", "compute_mb"),
        ("kv_bytes", "kv_mb"),
        ("reserve_bytes", "plan_reserve_mb"),
        ("arena_bytes", "arena_mb"),
        ("rss_bytes", "plan_rss_mb"),
        ("data_bytes", "plan_data_mb"),
        ("process_bytes", "plan_process_mb"),
    ):
        rec[dst] = plan[src] / MIB if src in plan else None
    return rec


def is_cold(row: dict, share: float = 0.05) -> bool | None:
    """Did a run meant to be cold start with the model file out of the page cache (at most
    `share` of it cached)? None when it was not meant to be cold.

    Only the start is judged: `cached_after` (the experts' bytes cached right after the run) is
    recorded too, but it cannot tell another process's reads from pages the run itself left.
    """
    if row.get("file_cache") != "dropped":
        return None
    return (row.get("cached_before") or 0.0) <= share


def runs_frame(rows: Iterable[dict]):
    import pandas as pd

    return pd.DataFrame([run_record(r) for r in rows])


def spread(values: Sequence[float]) -> dict:
    """median, min, max and (max - min) / median of the finite values (NaN when none)."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        nan = float("nan")
        return {"median": nan, "min": nan, "max": nan, "spread": nan, "n": 0}
    med = statistics.median(v)
    rel = (max(v) - min(v)) / abs(med) if med else float("nan")
    return {"median": med, "min": min(v), "max": max(v), "spread": rel, "n": len(v)}


def summarize(records, by: Sequence[str], metrics: Sequence[str], spread_of: Sequence[str] = ()):
    """One row per configuration (grouped by the `by` columns, in first-seen order): runs, ok
    runs (a run meant to be cold that was not, column `not cold`, is left out of them and of the
    medians), runs sdq refused (its one-line error, e.g. PlanError), crashes (died: MemoryError,
    killed by the limit, timeout ...), the first error, the median of each metric over ok
    runs, and min / max / spread columns for the metrics in `spread_of`."""
    import pandas as pd

    df = records if isinstance(records, pd.DataFrame) else pd.DataFrame(list(records))
    out = []
    for keys, g in df.groupby(list(by), sort=False, dropna=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        row = dict(zip(by, keys, strict=True))
        ok = g[g["status"] == "ok"]
        if "cold" in g:  # a run meant to be cold that found the file cached is left out
            warm = ok["cold"].eq(False)
            row["not cold"] = int(warm.sum())
            ok = ok[~warm]
        row["runs"] = len(g)
        row["ok"] = len(ok)
        bad = g[g["status"] != "ok"]
        row["refused"] = int((g["status"] == "refused").sum())
        row["crashed"] = len(bad) - row["refused"]
        row["error"] = (
            f"{bad['error_kind'].iloc[0]}: {bad['error'].iloc[0]}" if len(bad) else ""
        ).strip(": ")
        for m in metrics:
            s = spread(ok[m].tolist() if m in ok else [])
            row[m] = s["median"]
            if m in spread_of:
                row[f"{m} min"] = s["min"]
                row[f"{m} max"] = s["max"]
                row[f"{m} spread"] = s["spread"]
        out.append(row)
    return pd.DataFrame(out)


PROFILE_CATEGORIES = (
    "attention",
    "router",
    "expert_compute",
    "io_wait",
    "barrier",
    "other",
    "total",
)


def profile_frame(rows: Iterable[dict]):
    """Long table: label, repeat, phase, category, ms per token (ok runs with a profile)."""
    import pandas as pd

    recs = []
    for r in rows:
        prof = (r.get("result") or {}).get("profile_ms_per_token") or {}
        for phase, cats in prof.items():
            for cat, ms in cats.items():
                recs.append(
                    {
                        "label": r["label"],
                        "repeat": r["repeat"],
                        "phase": phase,
                        "category": cat,
                        "ms_per_token": ms,
                    }
                )
    return pd.DataFrame(recs, columns=["label", "repeat", "phase", "category", "ms_per_token"])


def additive_breakdown(prof, by: Sequence[str] = ("label", "phase")):
    """Per group (`by`) of a `profile_frame`, a time breakdown whose parts add up to its total.

    Each run's categories add up to its total (sdq.run.generate), but the medians over runs
    of the categories do not add up to the median of the totals. Here the category medians
    are scaled by one factor per group, `scale` = median total / sum of the category
    medians, so that they sum to the median total; `median_ms` keeps the unscaled median and
    `scale` says how far the medians were from adding up (1.0: they did). A category that
    some runs of a group lack (a journal from before it was measured) counts 0 in them.

    -> one row per group and category (the categories in PROFILE_CATEGORIES order, `total`
    last): *by, category, ms_per_token (scaled; `total`: the median total), median_ms,
    share (ms_per_token / total), scale, runs."""
    import pandas as pd

    cols = [*by, "category", "ms_per_token", "median_ms", "share", "scale", "runs"]
    if prof.empty:
        return pd.DataFrame(columns=cols)
    run_keys = [*by, "repeat"] if "repeat" in prof else list(by)
    wide = prof.pivot_table(
        index=run_keys, columns="category", values="ms_per_token", aggfunc="first"
    )
    parts = [c for c in PROFILE_CATEGORIES if c != "total" and c in wide.columns]
    parts += [c for c in wide.columns if c not in PROFILE_CATEGORIES]
    out = []
    for keys, g in wide.groupby(level=list(range(len(by))), sort=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        g = g[g["total"].notna()] if "total" in g else g.iloc[0:0]
        if g.empty:
            continue
        total = float(g["total"].median())
        medians = {c: float(g[c].fillna(0.0).median()) for c in parts}
        covered = sum(medians.values())
        scale = total / covered if covered else float("nan")
        for c in [*parts, "total"]:
            ms = total if c == "total" else medians[c] * scale
            raw = total if c == "total" else medians[c]
            share = ms / total if total else float("nan")
            out.append([*keys, c, ms, raw, share, scale, len(g)])
    return pd.DataFrame(out, columns=cols)


IO_METRICS = (
    "decode_tok_s",
    "hit_rate",
    "prefetch_hit_rate",
    "reads_avoided",
    "ssd_mb_per_token",
    "expert_io_ms_per_token",
    "expert_compute_ms_per_token",
    "total_ms_per_token",
    "ttft_ms",
    "peak_rss_mb",
    "swap_mb",
    "slots",
)
MEMORY_METRICS = (
    "slots",
    "prefill_tok_s",
    "decode_tok_s",
    "hit_rate",
    "peak_rss_mb",
    "peak_anon_mb",
    "peak_file_mb",
    "peak_data_mb",
    "cgroup_peak_mb",  # memory.max_usage_in_bytes: what the group was charged at most
)
SUITE_COLUMNS = {
    "io": (["label", "io_mode", "io_threads", "split", "prefetch"], IO_METRICS),
    "threads": (["label", "io_mode", "io_threads", "split", "prefetch"], IO_METRICS),
    "split": (["label", "io_mode", "io_threads", "split", "prefetch", "page_cache"], IO_METRICS),
    "profile": (["label", "io_mode", "io_threads", "prefetch"], IO_METRICS),
    "pack": (["label", "source", "io_mode", "io_threads", "prefetch"], IO_METRICS),
    "depth": (
        ["label", "io_mode", "io_threads", "prefetch"],
        (*IO_METRICS, "prefetch_accuracy", "guess_accuracy_d1", "guess_accuracy_d2"),
    ),
    "memory": (
        ["label", "sizing", "ubatch", "compute_buffer_mb", "budget_mb", "limit_method"],
        MEMORY_METRICS,
    ),
    "reserve": (["label", "sizing", "reserve_mb", "budget_mb", "limit_method"], MEMORY_METRICS),
    "budgets": (["label", "reserve_mb", "budget_mb", "limit_method"], MEMORY_METRICS),
}


def layer_miss_frame(rows: Iterable[dict]):
    """One row per benchmark configuration and run (ok runs); `times_ms` holds the run's
    per-repetition times (one list per row)."""
    import pandas as pd

    recs = []
    for r in rows:
        for b in (r.get("result") or {}).get("rows", []):
            recs.append({"repeat": r["repeat"], **b})
    return pd.DataFrame(recs)


def suite_table(suite: str, rows: Sequence[dict]):
    """The suite's summary: medians over repeats (and their spread) per configuration."""
    if suite == "layer-miss":
        lm = layer_miss_frame(rows)
        if lm.empty:
            return lm
        by = ["misses", "label", "mode", "split", "io_threads", "cache_mode"]
        g = lm.groupby(by, sort=False)
        fio = {"fio_gb_s": ("fio_gb_s", "median"), "ratio_to_fio": ("ratio_to_fio", "median")}
        return g.agg(
            median_ms=("median_ms", "median"),
            min_ms=("min_ms", "min"),
            max_ms=("max_ms", "max"),
            gb_s=("gb_s", "median"),
            resident_before=("resident_before", "max"),
            **{k: v for k, v in fio.items() if v[0] in lm},
        ).reset_index()
    by, metrics = SUITE_COLUMNS[suite]
    spread_of = ("decode_tok_s", "expert_io_ms_per_token", "prefill_tok_s")
    return summarize(runs_frame(rows), by, metrics, [m for m in spread_of if m in metrics])
