"""A run's spend in words: credits by provider and column, each waterfall's hit rates,
and its account with each provider (:mod:`playline.calls.accounting` counts it).

Kept free of imports so workflow code (current details) and the CLI can both use it;
the tally itself is built by :mod:`playline.calls.provenance` from cells' provenance.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ALWAYS_SHOWN",
    "NO_STEP",
    "TERMS",
    "account_lines",
    "account_markdown",
    "exact_accounts",
    "spend_lines",
]

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
        measured = (spend.get("tried") or {}).get(column) or {}
        if measured:
            lines.append(
                f"{column} by step: " + "; ".join(_step(t, f) for t, f in measured.items())
            )
    return lines


def _step(tool: str, figures: list[float]) -> str:
    """One waterfall step as measured: hit rate over the calls it made, credits per hit."""
    tries, hits, credits = figures
    rate = f"{100 * hits / tries:.0f} % of {tries:g}" if tries else "not called"
    per_hit = f"{credits / hits:.2f} credits/hit" if hits else f"{credits:g} credits, no hit"
    return f"{tool} hit {rate}, {per_hit}"


#: Each term and its column heading, in the order every table shows them.
TERMS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("charged", "charged"),
    ("replays", "replays"),
    ("hits", "receipt hits"),
    ("shared", "shared"),
    ("followers", "followers"),
    ("credits", "credits"),
    ("saved", "saved"),
)


def _figure(value: Any) -> str:
    """A count or credits as written: ``1218``, ``1.5``, ``1234567`` (never ``1.23e+06``:
    the figure is compared with the provider's ledger)."""
    number = float(value or 0)
    if number.is_integer():
        return str(int(number))
    return f"{number:.6f}".rstrip("0").rstrip(".")


def _cells(counts: Mapping[str, Any]) -> list[str]:
    return [_figure(counts.get(term)) for term, _ in TERMS]


def account_lines(accounts: Mapping[str, Any]) -> list[str]:
    """The accounts as a plain-text table, one row per provider (none: no line)."""
    if not accounts:
        return []
    rows = [["provider", *(heading for _, heading in TERMS)]]
    rows += [[provider, *_cells(accounts[provider])] for provider in sorted(accounts)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


#: Terms every account shows, even at 0 (the ones that equal the provider's ledger);
#: the others only when they count something.
ALWAYS_SHOWN = ("requests", "charged", "credits")
#: What Markdown would read as markup in a provider's name.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~-])")


def account_markdown(accounts: Mapping[str, Any]) -> list[str]:
    """The accounts as Markdown for the Temporal UI's current details: a heading line,
    then one list item per provider, ``**acme**: 472 requests · 472 charged · 708
    credits``.

    A list, not a table: the UI renders Markdown tables without cell padding or
    scrolling, so a table's headings ran together ("requestschargedreplays") and its
    last columns were cut off in a narrow panel. A list item wraps like any text; terms
    at 0 other than ``ALWAYS_SHOWN`` are left out, so the items stay short.
    """
    if not accounts:
        return []
    lines = ["**accounts with the providers**", ""]
    for provider in sorted(accounts):
        counts = accounts[provider]
        terms = [
            f"{_figure(counts.get(term))} {heading}"
            for term, heading in TERMS
            if term in ALWAYS_SHOWN or float(counts.get(term) or 0)
        ]
        name = _MARKDOWN_SPECIAL.sub(r"\\\1", provider)
        lines.append(f"- **{name}**: " + " · ".join(terms))
    return lines


def exact_accounts(accounts: Mapping[str, Any], spend: Mapping[str, Any] | None) -> dict[str, Any]:
    """The accounts with each provider's credits as the store's cells sum them.

    The chunks' counts lose what a SIGKILLed worker counted since its last heartbeat;
    the cells' provenance (``spend``, summed from the sheet store) does not, so where
    the store is at hand its figure is the one shown.
    """
    by_provider = (spend or {}).get("by_provider")
    if not isinstance(by_provider, Mapping):
        return dict(accounts)
    exact = {provider: dict(counts) for provider, counts in accounts.items()}
    for provider, credits in by_provider.items():
        exact.setdefault(provider, {})["credits"] = credits
    return exact
