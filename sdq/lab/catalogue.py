"""The table catalogue T1-T12 (DESIGN.md): what `make reproduce` regenerates, and from where."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableSpec:
    id: str
    seed: str  # section of the seed documents it reproduces
    table: str
    notebook: str  # the notebook's number: the stem starts with "<number>_"


CATALOGUE = (
    TableSpec(
        "T1",
        "000 §1",
        "read latency (median/mean/p90) and aggregate MB/s vs concurrency "
        "1…16 at expert-segment size; 4 KiB latency and IOPS at 1 and 16 threads",
        "01",
    ),
    TableSpec(
        "T2",
        "000 §2",
        "one expert's three segments: offset + bytes (L0E0 gate/up/down) and model anatomy",
        "00",
    ),
    TableSpec(
        "T3",
        "000 §2",
        "one layer, 1, 2, 4 and 8 experts missing: serial×8 threads vs "
        "segment-parallel×16 / ×24, paired repetitions",
        "03",
    ),
    TableSpec(
        "T4",
        "000 §0, §3",
        "decode tok/s, hit rate, SSD MB/token, peak RSS, swap: serial "
        "vs parallel, I/O threads sweep",
        "03",
    ),
    TableSpec(
        "T5",
        "000 §4.1, 003",
        "split sweep (1,2,4,8) on a cold and a warm page cache; with expert I/O "
        "ms, compute ms, total ms per token, TTFT",
        "03",
    ),
    TableSpec(
        "T6",
        "000 §4.2",
        "n-gram / prompt-lookup acceptance (n = 2,3,4,6,8; k = 8); U(k) "
        "reads saved by k-token batches; MTP/nextn tensors present",
        "02",
    ),
    TableSpec(
        "T7",
        "000 §4.3",
        "reuse distribution in a 48-token window; admission (min hits) effect",
        "02",
    ),
    TableSpec(
        "T8",
        "000 §4.4, §6",
        "static hot pin coverage vs LRU; LRU vs Belady hit rate across slot counts",
        "02",
    ),
    TableSpec(
        "T9",
        "000 §5.1",
        "ubatch sweep under a RAM limit: compute buffer, crash or not, prefill tok/s",
        "04",
    ),
    TableSpec("T10", "000 §5.2", "reserve sweep: slots, peak RSS vs budget, decode tok/s", "04"),
    TableSpec(
        "T11", "000 §6", "time per op category (attention, router, experts, I/O wait, idle)", "03"
    ),
    TableSpec(
        "T12",
        "—",
        "sdq vs llama.cpp on the same GGUF: resident and under the same memory cap",
        "05",
    ),
)
