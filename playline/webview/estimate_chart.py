"""The estimate beside what was spent, per provider: credits and money, and bars.

The estimate is the one the desk matched to the run
(:class:`~playline.webview.desk.RunEstimate`: worst case and expected credits per
provider); the spend is the run's own account (``RunSummary.providers``: the credits
each provider charged, the figure the provider's ledger holds). Every provider of
either side has a row: one the estimate did not foresee shows an estimate of 0, one
the run has not called yet a spend of 0. Money is each side's credits at the prices
the workers report (the run's), else the estimate's.

Pure: figures in, rows and bar widths (SVG units) out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from playline.money import money_text
from playline.webview.desk import RunEstimate

__all__ = ["BAR_WIDTH", "EstimateRow", "beside"]

#: The longest bar, SVG units.
BAR_WIDTH = 360


@dataclass
class EstimateRow:
    provider: str
    worst: float
    expected: float
    spent: float
    worst_money: str | None
    expected_money: str | None
    spent_money: str | None
    #: bar lengths on one scale (the largest figure of all rows is ``BAR_WIDTH``)
    worst_w: float = 0.0
    expected_w: float = 0.0
    spent_w: float = 0.0

    @property
    def over(self) -> bool:
        """Whether the run spent more than the estimate's worst case."""
        return self.spent > self.worst + 1e-9


def beside(
    estimate: RunEstimate, providers: dict[str, dict[str, Any]], prices: dict[str, Any]
) -> list[EstimateRow]:
    """One row per provider of the estimate or the run's account, in name order."""
    priced = {**estimate.prices, **prices}
    rows = []
    for name in sorted(estimate.by_provider.keys() | providers.keys()):
        said = estimate.by_provider.get(name)
        worst = said.worst if said is not None else 0.0
        expected = said.expected if said is not None else 0.0
        spent = float((providers.get(name) or {}).get("credits") or 0.0)
        rows.append(
            EstimateRow(
                name,
                worst,
                expected,
                spent,
                money_text({name: worst}, priced),
                money_text({name: expected}, priced),
                money_text({name: spent}, priced),
            )
        )
    largest = max((max(r.worst, r.expected, r.spent) for r in rows), default=0.0)
    if largest > 0:
        for row in rows:
            row.worst_w = BAR_WIDTH * row.worst / largest
            row.expected_w = BAR_WIDTH * row.expected / largest
            row.spent_w = BAR_WIDTH * row.spent / largest
    return rows
