"""The route log: which experts the router chose, one JSON line per token and layer.

    {"phase": "prefill" | "decode", "pos": int, "layer": int, "experts": [int, ...],
     "weights": [float, ...]}

pos is the token's position in the sequence (0-based), layer the model layer number, experts
the router's top-k ids in router order and weights their mixing weights (same order, rounded to
6 digits; [] when unknown). The file is written to PATH.tmp and renamed to PATH on close, so a
run that dies leaves no half log under the final name. sdq.analysis reads these files.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from sdq.errors import ParamsError


class RouteLog:
    """Writes route records as JSON lines (format in the module docstring)."""

    def __init__(self, path):
        self.path = str(path)
        self._tmp = self.path + ".tmp"
        try:
            self._file = open(self._tmp, "w", encoding="utf-8")
        except OSError as exc:
            raise ParamsError(f"route log {self.path}: cannot write ({exc.strerror})") from None
        self._lock = threading.Lock()

    def write(self, phase: str, pos: int, layer: int, experts, weights=()) -> None:
        record = {
            "phase": phase,
            "pos": int(pos),
            "layer": int(layer),
            "experts": [int(e) for e in experts],
            "weights": [round(float(w), 6) for w in weights],
        }
        line = json.dumps(record, separators=(", ", ": ")) + "\n"
        with self._lock:
            self._file.write(line)

    def write_batch(self, phase: str, pos0: int, layer: int, ids, weights=None) -> None:
        """One record per token: ids int [T, K], weights float [T, K] or None; token t is at
        position pos0 + t."""
        ids = np.asarray(ids)
        for t in range(ids.shape[0]):
            self.write(phase, pos0 + t, layer, ids[t], () if weights is None else weights[t])

    def close(self, keep: bool = True) -> None:
        """Finish the log: renamed to its path, or (`keep` False: the run failed) removed."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
                if keep:
                    os.replace(self._tmp, self.path)
                else:
                    os.unlink(self._tmp)
