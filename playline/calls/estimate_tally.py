"""What an estimate counted: per column, tool and provider, the calls a run would make.

An estimate (:mod:`playline.calls.estimate`) runs a play's resolvers without calling
any provider. Each distinct call it meets is one of three kinds:

``cached``         a fresh completed receipt answers it: the run reuses it for free
``to_pay``         the run would send it (no receipt, a stale one, ``force``...)
``unknown_input``  a *dependent* call whose input holds an unpaid call's answer: it
                   cannot be looked up, so it counts as a call to pay

and the credits of the calls to pay come as two figures:

``worst_credits``     every call that may happen at the tool's highest price
                      (``ToolSpec.max_credits``): every waterfall step and validation,
                      every ``run_if`` taken, every dependent call, and every declared
                      tool of a column that met an unknown answer but did not call it
                      (a fallback the run may take: ``if not found.get(...)``, ``a or b``)
``expected_credits``  what the receipts' history says such calls cost on average,
                      weighted by the chance the call happens at all; with fewer than
                      ``MIN_HISTORY`` receipts of a tool it is the worst case, and the
                      line's ``basis`` says ``"worst case"`` instead of ``"receipts"``

A tally is a small JSON-able dict, ``{"rows", "rows_failed", "lines": {column: {tool:
{provider: figures}}}}``, so chunks' tallies add up with
:func:`playline.contract.merge_spend` exactly as their spend does. :class:`Estimate`
is the typed report a client reads (``playline.estimate_play``, ``playline estimate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, Field

from playline.money import money_text

__all__ = [
    "BASIS_RECEIPTS",
    "BASIS_STATED",
    "BASIS_WORST_CASE",
    "PLAY_COLUMN",
    "Estimate",
    "EstimateLine",
    "EstimateTally",
    "EstimateTotals",
]

#: The expected figure comes from the receipts' history (or exact receipt hits).
BASIS_RECEIPTS: Final = "receipts"
#: Too few receipts of the tool: the expected figure is the worst case.
BASIS_WORST_CASE: Final = "worst case"
#: Too few receipts, but the catalog states the tool's typical hit rate: the expected
#: figure is priced at that rate until receipts exist.
BASIS_STATED: Final = "stated hit rate"
Basis = Literal["receipts", "worst case", "stated hit rate"]
#: The column name of scalar calls (``ctx.tool``, ``ctx.waterfall``) of a play.
PLAY_COLUMN = "(play)"

_COUNTS = ("calls", "cached", "to_pay", "unknown_input")
_CREDITS = ("worst_credits", "expected_credits")


def _new_line() -> dict[str, Any]:
    line: dict[str, Any] = {name: 0 for name in _COUNTS}
    line.update({name: 0.0 for name in _CREDITS})
    line["basis"] = BASIS_RECEIPTS
    return line


class EstimateTally:
    """The figures one estimate attempt counted (see the module docstring)."""

    def __init__(self) -> None:
        self.rows = 0
        self.rows_failed = 0
        self._lines: dict[tuple[str, str, str], dict[str, Any]] = {}

    def line(self, column: str, tool: str, provider: str) -> dict[str, Any]:
        """The figures of ``(column, tool, provider)``, created empty on first use."""
        key = (column, tool, provider)
        found = self._lines.get(key)
        if found is None:
            found = self._lines[key] = _new_line()
        return found

    def cached(self, column: str, tool: str, provider: str) -> None:
        """A call a fresh receipt answers: free."""
        line = self.line(column, tool, provider)
        line["calls"] += 1
        line["cached"] += 1

    def to_pay(
        self,
        column: str,
        tool: str,
        provider: str,
        *,
        worst: float,
        expected: float,
        basis: Basis,
        unknown_input: bool = False,
    ) -> dict[str, Any]:
        """A call the run would pay for (``unknown_input``: a dependent call whose input
        is not known); the line it was counted on."""
        line = self.line(column, tool, provider)
        line["calls"] += 1
        line["unknown_input" if unknown_input else "to_pay"] += 1
        line["worst_credits"] += worst
        line["expected_credits"] += expected
        # The least-informed figure counted on the line names its basis.
        if basis == BASIS_WORST_CASE or (basis == BASIS_STATED and line["basis"] == BASIS_RECEIPTS):
            line["basis"] = basis
        return line

    def as_dict(self) -> dict[str, Any]:
        """The tally as ``ChunkStats.estimate`` carries it."""
        lines: dict[str, Any] = {}
        for (column, tool, provider), figures in self._lines.items():
            lines.setdefault(column, {}).setdefault(tool, {})[provider] = dict(figures)
        return {"rows": self.rows, "rows_failed": self.rows_failed, "lines": lines}


class EstimateTotals(BaseModel):
    """Calls and credits added up (over a provider, or over everything)."""

    calls: int = 0
    cached: int = 0
    to_pay: int = 0
    unknown_input: int = 0
    worst_credits: float = 0.0
    expected_credits: float = 0.0

    def add(self, line: EstimateTotals) -> None:
        """Add ``line``'s figures (a line or other totals) to these."""
        for name in type(self).model_fields:
            setattr(self, name, getattr(self, name) + getattr(line, name))


class EstimateLine(EstimateTotals):
    """One column's calls of one tool (and its provider)."""

    column: str
    tool: str
    provider: str
    basis: Basis = "receipts"


class Estimate(BaseModel):
    """What a play would cost, without a provider call: ``playline.estimate_play``'s answer.

    ``lines`` per column, tool and provider; ``by_provider`` and ``total`` add them up.
    ``worst_credits`` bounds what the run can charge (dependent calls whose input is
    unknown are counted in it); ``expected_credits`` is the receipts' history's guess.
    """

    play: str
    workflow_id: str | None = None
    #: rows the estimate ran (every admitted row of every dataset run)
    rows: int = 0
    #: rows whose resolvers failed for a reason an unpaid answer does not explain
    rows_failed: int = 0
    lines: list[EstimateLine] = Field(default_factory=list)
    by_provider: dict[str, EstimateTotals] = Field(default_factory=dict)
    total: EstimateTotals = Field(default_factory=EstimateTotals)
    #: what a credit costs with each provider whose catalog entry says,
    #: ``{provider: {"credit_price", "currency"}}`` (``playline.money``)
    prices: dict[str, Any] = Field(default_factory=dict)

    def money(self, which: str) -> str | None:
        """``which`` (``worst`` or ``expected``) in money, ``≈ 12.34 USD``, where priced."""
        credits = {
            provider: getattr(totals, f"{which}_credits")
            for provider, totals in self.by_provider.items()
        }
        return money_text(credits, self.prices)

    @classmethod
    def from_tally(
        cls,
        tally: Mapping[str, Any],
        *,
        play: str,
        workflow_id: str | None = None,
        prices: Mapping[str, Any] | None = None,
    ) -> Estimate:
        """The report of a (merged) tally, lines sorted by column, tool and provider."""
        lines: list[EstimateLine] = []
        for column, tools in sorted((tally.get("lines") or {}).items()):
            for tool, providers in sorted(tools.items()):
                for provider, figures in sorted(providers.items()):
                    lines.append(
                        EstimateLine(column=column, tool=tool, provider=provider, **figures)
                    )
        by_provider: dict[str, EstimateTotals] = {}
        total = EstimateTotals()
        for line in lines:
            by_provider.setdefault(line.provider, EstimateTotals()).add(line)
            total.add(line)
        return cls(
            play=play,
            workflow_id=workflow_id,
            rows=int(tally.get("rows", 0)),
            rows_failed=int(tally.get("rows_failed", 0)),
            lines=lines,
            by_provider=dict(sorted(by_provider.items())),
            total=total,
            prices=dict(prices or {}),
        )
