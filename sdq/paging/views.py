"""An expert's (gate, up, down) matrices as views of the arena slot that holds it.

A view is cut per expert and token on the decode path, so the cut is made cheap: per table row
the parts' positions in a slot are computed once as Python ints, and the views last cut from a
slot are reused while the same expert stays in it.
"""

from __future__ import annotations

import numpy as np

from sdq.paging.arena import Arena
from sdq.paging.reads import SlotLayout

Views = tuple[np.ndarray, np.ndarray, np.ndarray]  # gate, up, down: uint8 [rows, row_bytes]


class ExpertViews:
    """Cuts the raw quantized bytes of an expert in a slot into one view per part."""

    def __init__(self, arena: Arena, table, layout: SlotLayout):
        self.arena = arena
        self.table = table
        self.layout = layout
        self._parts: list[list | None] = [None] * len(table.layers)  # see _parts_of
        # slot -> (row, expert, views) last cut from it
        self._last: list[tuple[int, int, Views] | None] = [None] * arena.n_slots

    def of(self, layer: int, expert: int, slot: int) -> Views:
        """(gate, up, down) of `expert` of model layer `layer`, which is in `slot`."""
        row = self.table.row(layer)
        last = self._last[slot]
        if last is not None and last[0] == row and last[1] == expert:
            return last[2]  # the expert is still in this slot: same bytes, same views
        (g0, gn, gr, gc), (u0, un, ur, uc), (d0, dn, dr, dc) = self._parts_of(row)[expert]
        buf, base = self.arena.buf, slot * self.arena.slot_bytes
        views = (
            buf[base + g0 : base + g0 + gn].reshape(gr, gc),
            buf[base + u0 : base + u0 + un].reshape(ur, uc),
            buf[base + d0 : base + d0 + dn].reshape(dr, dc),
        )
        self._last[slot] = (row, expert, views)  # a plain store: no lock needed
        return views

    def _parts_of(self, row: int) -> list:
        """Per expert of table row `row`, per part: (start in the slot, bytes, rows, row
        bytes), built on first use."""
        parts = self._parts[row]
        if parts is None:
            t = self.table
            parts = [
                tuple(
                    (
                        self.layout.view_offset(int(t.offsets[row, e, p]), p, row),
                        int(t.nbytes[row, e, p]),
                        int(t.shapes[p][0]),
                        int(t.nbytes[row, e, p]) // int(t.shapes[p][0]),
                    )
                    for p in range(3)
                )
                for e in range(t.n_expert)
            ]
            self._parts[row] = parts
        return parts

    def close(self) -> None:
        self._last = [None] * len(self._last)
