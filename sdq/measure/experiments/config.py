"""What one experiment run is: a command, the RAM limit it runs under, and the page-cache state.

A `RunConfig` is one configuration of a suite (a column of the A/B): the `sdq` subcommand with
its flags, the memory limit, whether the model file's pages are dropped before the run, and
the table columns it stands for (`meta`). Its `key` is a digest of everything that changes
what is measured (command with the model named by file name and size, limit, cache state), so a
re-run of the same sweep finds its finished runs and a changed setting never reuses old ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from sdq.measure.limits import MemoryLimit

# the model file's pages before each run: dropped, warmed (the whole file read once), or left
# untouched (a benchmark that drops or warms them itself before every timed read)
FILE_CACHE = ("dropped", "warm", "untouched")


@dataclass(frozen=True)
class RunConfig:
    suite: str
    label: str  # short name shown in tables and the progress bar, e.g. "parallel x8"
    args: tuple[str, ...]  # `sdq` arguments after the program name, model path included
    model: str
    limit: MemoryLimit = field(default_factory=MemoryLimit)
    file_cache: str = "dropped"
    meta: tuple[tuple[str, object], ...] = ()  # table columns: (name, value)
    pack: str = ""  # the pack the run reads experts from (its pages dropped too), or ""

    def __post_init__(self):
        if self.file_cache not in FILE_CACHE:
            raise ValueError(f"file_cache {self.file_cache!r}: expected one of {FILE_CACHE}")

    @property
    def kind(self) -> str:
        """The sdq subcommand: chat, or bench layer-miss."""
        return self.args[0] if self.args[0] != "bench" else f"bench {self.args[1]}"

    @property
    def meta_dict(self) -> dict:
        return dict(self.meta)

    @property
    def key(self) -> str:
        model = Path(self.model)
        size = os.path.getsize(model) if model.exists() else -1
        shown = [model.name if a == self.model else a for a in self.args]
        blob = json.dumps(
            {
                "args": shown,
                "model_bytes": size,
                "limit": [self.limit.method, self.limit.limit_bytes],
                "file_cache": self.file_cache,
            },
            sort_keys=True,
        )
        return f"{self.label}|{hashlib.sha1(blob.encode()).hexdigest()[:12]}"

    def describe(self) -> dict:
        """The configuration as journal fields."""
        return {
            "suite": self.suite,
            "label": self.label,
            "kind": self.kind,
            "command": ["sdq", *self.args],
            "limit_method": self.limit.method,
            "limit_mb": self.limit.limit_mb,
            "file_cache": self.file_cache,
            **self.meta_dict,
        }
