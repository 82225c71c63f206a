"""A run's audit: the four money invariants, read from the stores after (or during) a run.

Every feature that moves money (receipts, budgets, waterfalls, provider jobs,
schedules, cancellation) keeps its own promise; these four are what must hold when
they meet, whatever way the run ended (completed, failed, cancelled, terminated):

``reservations``  no budget reservation of the run is left open: each was settled at
                  what its call cost or released when nothing was sent.
``credits``       the credits the run's cells show equal what its calls were charged,
                  as the receipts record each paid answer (and, for a run with a cap
                  of its own, what the budget ledger says it spent).
``unread``        no answer the provider may have billed was left unread: no call of
                  the run is ambiguous (sent, possibly charged, no answer) and no job
                  it submitted is still running or finished without its members read.
``sent_twice``    no call was sent again after an unanswered send, except to a provider
                  that de-duplicates it (``idempotency = "key"``/``"natural"``) or under
                  ``--retry-ambiguous``; no job member was submitted twice.

``playline runs audit ID`` prints them, the summary of a finished run carries them, and
the end-to-end tests check them against the provider's own ledger. The audit reads the
stores only; it never changes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from playline.calls.provenance import run_spend
from playline.stores.backends import Stores
from playline.stores.budget_ids import RunBudgetId
from playline.stores.budgets import TOLERANCE
from playline.stores.receipts import ToolReceipts

__all__ = ["Check", "RunAudit", "audit_run"]

#: Credits closer than this are equal (sums of floats).
CREDIT_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant: whether it holds, a one-line reason, and what breaks it."""

    name: str
    ok: bool
    detail: str
    items: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, "items": list(self.items)}


@dataclass(frozen=True, slots=True)
class RunAudit:
    """The four invariants of one play run (see the module docstring)."""

    run: str
    ended: bool
    checks: tuple[Check, ...]
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def check(self, name: str) -> Check:
        return next(check for check in self.checks if check.name == name)

    def lines(self) -> list[str]:
        """The audit as a person reads it: a verdict, then one line per invariant."""
        state = "ended" if self.ended else "still running: figures may still move"
        verdict = "every invariant holds" if self.ok else "AN INVARIANT DOES NOT HOLD"
        out = [f"audit of {self.run} ({state}): {verdict}"]
        for check in self.checks:
            out.append(f"  {'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
            out.extend(f"         {item}" for item in check.items[:20])
            if len(check.items) > 20:
                out.append(f"         ... and {len(check.items) - 20} more")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "ended": self.ended,
            "ok": self.ok,
            "checks": {check.name: check.as_dict() for check in self.checks},
            "figures": dict(self.figures),
        }


async def audit_run(
    stores: Stores,
    run: str,
    run_refs: Sequence[str],
    *,
    ended: bool,
    retry_ambiguous: bool = False,
    resend_safe: Mapping[str, bool] | None = None,
    waiters: Sequence[str] = (),
    budget_run: str | None = None,
) -> RunAudit:
    """Audit the play run ``run`` (its workflow id) from the stores.

    Args:
        stores: the workers' stores (opened read-only by a client).
        run: the play run's workflow id (its budget run and the prefix of its rows).
        run_refs: its dataset runs (the play's ``playline_run_refs`` memo).
        ended: whether the run has ended (open reservations of a running run are not
            a fault).
        retry_ambiguous: the run was started with ``--retry-ambiguous``.
        resend_safe: per tool id, whether its provider de-duplicates re-sends (the
            catalog's idempotency contract); a tool not named is judged by the store.
        waiters: the run's dataset-run workflow ids (whose provider jobs are its own).
        budget_run: the id its reservations carry (the play's Temporal run id);
            default ``run``.
    """
    budget_run = budget_run or run
    prefix = f"{run}/"
    receipts = await stores.receipts.run_receipts(prefix)
    spend: float = 0.0
    for ref in run_refs:
        spend += (await run_spend(stores.sheet, ref)).credits
    checks = (
        await _reservations(stores, budget_run, ended),
        await _credits(stores, budget_run, spend, receipts),
        await _unread(stores, receipts, waiters, ended),
        await _sent_twice(stores, receipts, waiters, retry_ambiguous, resend_safe or {}),
    )
    figures = {
        "cells_credits": spend,
        "receipts": {
            t.tool_id: {
                "paid": t.paid,
                "credits": t.credits,
                "ambiguous": t.ambiguous,
                "resent": t.resent,
                "outside_rows": t.outside_rows,
            }
            for t in receipts
        },
    }
    return RunAudit(run=run, ended=ended, checks=checks, figures=figures)


async def _reservations(stores: Stores, run: str, ended: bool) -> Check:
    opened = await stores.budgets.open_reservations(run)
    if not opened:
        return Check("reservations", True, "no reservation of the run is open")
    total = sum(item.credits for item in opened)
    items = tuple(f"{item.key} on {item.budget}: {item.credits:g} credits" for item in opened)
    if not ended:
        return Check(
            "reservations",
            True,
            f"{len(opened)} open ({total:g} credits) while the run goes on",
            items,
        )
    return Check(
        "reservations",
        False,
        f"{len(opened)} left open ({total:g} credits) after the run ended; "
        f"`playline budgets release --run {run}` frees them",
        items,
    )


async def _credits(
    stores: Stores, run: str, cells: float, receipts: Iterable[ToolReceipts]
) -> Check:
    tools = list(receipts)
    paid = sum(t.credits for t in tools)
    outside = sum(t.outside_rows for t in tools)
    in_rows = paid - outside
    detail = f"cells {cells:g} credits, receipts {in_rows:g}"
    if outside:
        detail += f" (+ {outside:g} paid by the play's own calls)"
    items = [f"{t.tool_id}: {t.paid} answers paid, {t.credits:g} credits" for t in tools]
    ok = abs(cells - in_rows) <= CREDIT_TOLERANCE
    state = await stores.budgets.state(RunBudgetId(run))
    if state is not None:
        detail += f"; the run's budget spent {state.spent:g}"
        ok = ok and abs(state.spent - paid) <= max(CREDIT_TOLERANCE, TOLERANCE)
    return Check("credits", ok, detail, tuple(items))


async def _unread(
    stores: Stores, receipts: Iterable[ToolReceipts], waiters: Sequence[str], ended: bool
) -> Check:
    items: list[str] = []
    for tool in receipts:
        if tool.ambiguous:
            items.append(
                f"{tool.tool_id}: {tool.ambiguous} calls sent with no answer recorded "
                "(possibly charged; `--retry-ambiguous` re-sends them)"
            )
    unread = await stores.jobs.unread(waiters) if waiters else []
    for job in unread:
        items.append(f"job {job}")
    if not items:
        return Check("unread", True, "every answer the run paid for was read")
    if not ended and not any(tool.ambiguous for tool in receipts):
        return Check("unread", True, "jobs still running while the run goes on", tuple(items))
    return Check("unread", False, f"{len(items)} paid answers may be unread", tuple(items))


async def _sent_twice(
    stores: Stores,
    receipts: Iterable[ToolReceipts],
    waiters: Sequence[str],
    retry_ambiguous: bool,
    resend_safe: Mapping[str, bool],
) -> Check:
    items: list[str] = []
    allowed: list[str] = []
    for tool in receipts:
        if not tool.resent:
            continue
        line = f"{tool.tool_id}: {tool.resent} calls sent again after an unanswered send"
        if retry_ambiguous or resend_safe.get(tool.tool_id, False):
            why = "--retry-ambiguous" if retry_ambiguous else "the provider de-duplicates"
            allowed.append(f"{line} ({why})")
        elif tool.tool_id in resend_safe:
            items.append(line)
        else:
            allowed.append(f"{line} (the store re-sends only where the contract allows)")
    twice = await stores.jobs.submitted_twice(waiters) if waiters else []
    items.extend(f"job member {member} submitted in more than one job" for member in twice)
    if items:
        return Check("sent_twice", False, f"{len(items)} sent twice", tuple(items))
    detail = "no call or job member was sent twice"
    if allowed:
        detail = "no call was paid twice; re-sends allowed by contract"
    return Check("sent_twice", True, detail, tuple(allowed))
