"""The comparison itself: one provider's figures side by side, and the calls behind a gap.

Pure functions of their arguments (no store, no network) so the rule is unit-tested on
its own: the balance moved by ``spent`` credits while the run's receipts say
``playline``; the difference ``spent - playline`` is what is unexplained. A positive
difference (the provider took more) is looked for among the run's *ambiguous* calls
(sent, no answer: a charge playline never saw); a negative one (playline counted more)
among the answers priced by the catalog's rule rather than reported by the provider.
Neither found: the account was used by someone else meanwhile, or the rule is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from playline.stores.balances import BalanceReading
from playline.stores.receipts import RunCall

__all__ = [
    "TOLERANCE",
    "ProviderReconciliation",
    "Reconciliation",
    "balance_spent",
    "reconcile_provider",
    "reconciliation",
]

#: Credits closer than this are equal (sums of floats).
TOLERANCE = 1e-6
#: The most calls named per provider (the JSON document lists them all).
MAX_NAMED = 20

Verdict = Literal["reconciled", "difference", "no balance", "unread"]


def balance_spent(before: BalanceReading | None, after: BalanceReading | None) -> float | None:
    """The credits the account lost between two readings (``None``: not both read).

    A ``remaining`` balance goes down as credits are spent, a ``used`` counter up."""
    if before is None or after is None or before.value is None or after.value is None:
        return None
    if after.kind == "used":
        return after.value - before.value
    return before.value - after.value


def _call_line(call: RunCall, why: str) -> str:
    """A call as the reconciliation names it: tool, receipt key, and the row or attempt."""
    where = f"row {call.paid_by}" if call.paid_by else f"sent by {call.owner or 'unknown'}"
    return f"{call.tool_id} receipt {call.key} ({where}): {why}"


@dataclass(frozen=True, slots=True)
class ProviderReconciliation:
    """One provider's figures for one run, and what explains a difference.

    Attributes:
        provider: the catalog's provider name.
        playline: the credits the run's receipts record for its paid answers.
        reported: of those, what the provider reported with its answers.
        reported_answers: answers whose charge the provider reported.
        rule_answers: paid answers whose charge the catalog's rule computed.
        cells: the credits the run's cells show for the provider (``None``: not read).
        before: the balance reading before the run (``None``: none).
        after: the balance reading after it.
        spent: what the balance moved by (``None``: not both read).
        verdict: ``reconciled``, ``difference``, ``no balance`` (none declared or read)
            or ``unread`` (a read failed).
        calls: the calls behind a difference (tool, receipt key, row), when found.
        note: one line saying what the verdict means.
    """

    provider: str
    playline: float
    reported: float
    reported_answers: int
    rule_answers: int
    cells: float | None
    before: BalanceReading | None
    after: BalanceReading | None
    spent: float | None
    verdict: Verdict
    calls: tuple[str, ...] = ()
    note: str = ""

    @property
    def difference(self) -> float | None:
        """What the provider took beyond what playline records (negative: less)."""
        return None if self.spent is None else self.spent - self.playline

    def as_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "playline_credits": self.playline,
            "reported_credits": self.reported,
            "reported_answers": self.reported_answers,
            "rule_answers": self.rule_answers,
            "cells_credits": self.cells,
            "balance_before": self.before.as_dict() if self.before else None,
            "balance_after": self.after.as_dict() if self.after else None,
            "balance_spent": self.spent,
            "difference": self.difference,
            "verdict": self.verdict,
            "calls": list(self.calls),
            "note": self.note,
        }


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """A run's reconciliation, provider by provider."""

    run: str
    providers: tuple[ProviderReconciliation, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """No provider shows a difference (providers without a balance do not count)."""
        return all(p.verdict != "difference" for p in self.providers)

    @property
    def balances_read(self) -> bool:
        """Whether any provider's balance was read (else there is nothing to compare)."""
        return any(p.before is not None or p.after is not None for p in self.providers)

    def lines(self) -> list[str]:
        """The reconciliation as a person reads it."""
        if not self.providers:
            return [f"reconciliation of {self.run}: no provider was called or read"]
        if not self.ok:
            verdict = "A BALANCE DOES NOT MATCH"
        elif self.balances_read:
            verdict = "every balance read matches"
        else:
            verdict = "no balance was read (no provider it called declares one)"
        out = [f"reconciliation of {self.run}: {verdict}"]
        for p in self.providers:
            out.append(
                f"  {p.provider}: playline {p.playline:g} credits "
                f"({p.reported:g} reported by the provider on {p.reported_answers} answers, "
                f"{p.rule_answers} priced by rule); balance {_figure(_value(p.before))} -> "
                f"{_figure(_value(p.after))}, spent {_figure(p.spent)}; "
                f"difference {_figure(p.difference)}: {p.verdict}"
            )
            if p.note:
                out.append(f"    {p.note}")
            out.extend(f"    {call}" for call in p.calls[:MAX_NAMED])
            if len(p.calls) > MAX_NAMED:
                out.append(f"    ... and {len(p.calls) - MAX_NAMED} more")
        return out

    def markdown(self) -> list[str]:
        """The reconciliation as a Markdown table (the Temporal UI's details)."""
        if not self.providers:
            return []
        lines = [
            "| provider | playline | reported | balance before | after | spent | difference |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for p in self.providers:
            lines.append(
                f"| {p.provider} | {p.playline:g} | {p.reported:g} | {_figure(_value(p.before))}"
                f" | {_figure(_value(p.after))} | {_figure(p.spent)} | "
                f"{_figure(p.difference)} ({p.verdict}) |"
            )
        for p in self.providers:
            lines.extend(f"- {p.provider}: {call}" for call in p.calls[:MAX_NAMED])
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "ok": self.ok,
            "providers": {p.provider: p.as_dict() for p in self.providers},
        }


def _value(reading: BalanceReading | None) -> float | None:
    return reading.value if reading is not None else None


def reconcile_provider(
    provider: str,
    calls: Sequence[RunCall],
    before: BalanceReading | None,
    after: BalanceReading | None,
    *,
    cells: float | None = None,
) -> ProviderReconciliation:
    """One provider's reconciliation from the run's calls to it and its two readings."""
    paid = [c for c in calls if c.status == "completed" and c.paid_by is not None]
    playline = sum(c.credits for c in paid)
    reported_calls = [c for c in paid if c.credits_source == "provider"]
    reported = sum(c.credits for c in reported_calls)
    rule_answers = len(paid) - len(reported_calls)
    spent = balance_spent(before, after)
    base = ProviderReconciliation(
        provider=provider,
        playline=playline,
        reported=reported,
        reported_answers=len(reported_calls),
        rule_answers=rule_answers,
        cells=cells,
        before=before,
        after=after,
        spent=spent,
        verdict="reconciled",
    )
    failed = [r for r in (before, after) if r is not None and r.error is not None]
    if failed:
        note = "; ".join(f"the {r.phase} read failed: {r.error}" for r in failed)
        return replace(base, verdict="unread", note=note)
    if spent is None:
        if before is not None and after is None:
            note = "read before the run, not after it yet (it is still going)"
        else:
            note = "no balance read before and after the run (the catalog declares none)"
        return replace(base, verdict="no balance", note=note)
    difference = spent - playline
    if abs(difference) <= TOLERANCE:
        return base
    named = _behind(difference, calls, paid)
    if difference > 0:
        note = f"the provider took {difference:g} credits more than playline records"
    else:
        note = f"the provider took {-difference:g} credits less than playline records"
    if not named:
        note += (
            "; no call of the run explains it: another user of the account meanwhile, "
            "or a charge playline never saw"
        )
    return replace(base, verdict="difference", calls=named, note=note)


def _behind(
    difference: float, calls: Sequence[RunCall], paid: Sequence[RunCall]
) -> tuple[str, ...]:
    """The calls that may explain ``difference``: sent and unanswered when the provider
    took more; priced by rule (not reported) when it took less."""
    if difference > 0:
        unanswered = [c for c in calls if c.status == "ambiguous"]
        return tuple(
            _call_line(c, "sent, no answer recorded: charged by the provider, not by playline")
            for c in unanswered
        )
    by_rule = [c for c in paid if c.credits_source != "provider" and c.credits > 0]
    return tuple(
        _call_line(c, f"{c.credits:g} credits by the catalog's rule, not reported") for c in by_rule
    )


def reconciliation(
    run: str,
    calls: Iterable[RunCall],
    provider_of: Mapping[str, str],
    readings: Iterable[BalanceReading],
    *,
    cells: Mapping[str, float] | None = None,
) -> Reconciliation:
    """The run's reconciliation: every provider it called or read a balance of.

    Args:
        run: the play run's workflow id.
        calls: its receipts (:meth:`~playline.stores.receipts.ReceiptStore.run_calls`).
        provider_of: each tool's provider (a tool the catalog no longer has is its own).
        readings: its balance readings (the latest run of the id's, when several).
        cells: the credits the run's cells show per provider, if read.
    """
    by_provider: dict[str, list[RunCall]] = {}
    for call in calls:
        by_provider.setdefault(provider_of.get(call.tool_id, call.tool_id), []).append(call)
    phases: dict[tuple[str, str], BalanceReading] = {}
    for reading in readings:
        phases[(reading.provider, reading.phase)] = reading
    names = sorted(set(by_provider) | {provider for provider, _ in phases})
    return Reconciliation(
        run=run,
        providers=tuple(
            reconcile_provider(
                name,
                by_provider.get(name, []),
                phases.get((name, "before")),
                phases.get((name, "after")),
                cells=(cells or {}).get(name),
            )
            for name in names
        ),
    )
