"""A run's spend in words: credits by provider and column, each waterfall's hit rates.

Kept free of imports so workflow code (current details) and the CLI can both use it;
the tally itself is built by :mod:`playline.calls.provenance` from cells' provenance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NO_STEP", "spend_lines"]

#: The name a waterfall's rows without a value are counted under.
NO_STEP = "none"


def spend_lines(spend: Mapping[str, Any]) -> list[str]:
    """A spend tally (``SpendTally.as_dict()``) in words, one line per fact."""
    lines: list[str] = []
    by_provider = spend.get("by_provider") or {}
    if by_provider:
        parts = ", ".join(f"{p} {c:g}" for p, c in sorted(by_provider.items()))
        lines.append(f"credits by provider: {parts}")
    by_column = spend.get("by_column") or {}
    paid_columns = {c: v for c, v in by_column.items() if v}
    if paid_columns:
        parts = ", ".join(f"{c} {v:g}" for c, v in sorted(paid_columns.items()))
        lines.append(f"credits by column: {parts}")
    for column, counts in sorted((spend.get("steps") or {}).items()):
        rows = sum(counts.values())
        if not rows:
            continue
        ordered = sorted(counts.items(), key=lambda kv: (kv[0] == NO_STEP, -kv[1]))
        shares = ", ".join(f"{name} {100 * n / rows:.0f} %" for name, n in ordered)
        per_row = float(by_column.get(column, 0.0)) / rows
        lines.append(f"{column}: {shares}; {per_row:.2f} credits/row")
    return lines
