"""Numbers and tables as text: the one place that decides how a figure is printed in the docs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def to_json_value(v: Any) -> Any:
    """A plain JSON value for `v`: numpy scalars unwrapped, NaN/inf -> None, others as str."""
    if v is None or isinstance(v, bool | str):
        return v
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 0) == 0:
        v = v.item()  # numpy / pandas scalar
    if isinstance(v, bool | str):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if hasattr(v, "isoformat"):
        return v.isoformat()
    try:
        import pandas as pd

        if pd.isna(v):
            return None
    except (ImportError, TypeError, ValueError):
        pass
    return str(v)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def format_value(v: Any, spec: str | None = None) -> str:
    """Text for one cell or quoted value.

    Integers get thousands separators (1,180,930,528); floats keep about three significant
    digits (7.58, 0.0123, 12.6, 1,234); None is an em dash; booleans are yes/no. `spec` (a
    format spec such as ".1%" or "d") overrides the rule for numbers.
    """
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if spec is not None and is_number(v):
        return format(v, spec)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def markdown_table(
    columns: Sequence[str],
    records: Sequence[Mapping[str, Any]],
    formats: Mapping[str, str] | None = None,
) -> str:
    """A GitHub markdown table; numeric columns are right-aligned."""
    formats = formats or {}

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(cell(str(c)) for c in columns) + " |"
    aligns = []
    for c in columns:
        values = [r.get(c) for r in records if r.get(c) is not None]
        aligns.append("---:" if values and all(is_number(v) for v in values) else "---")
    rule = "| " + " | ".join(aligns) + " |"
    rows = [
        "| " + " | ".join(cell(format_value(r.get(c), formats.get(c))) for c in columns) + " |"
        for r in records
    ]
    return "\n".join([head, rule, *rows]) + "\n"
