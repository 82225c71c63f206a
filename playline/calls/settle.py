"""The one rule from a call's outcome to its receipt, for single calls and bulk requests.

:func:`settle` takes a :data:`~playline.calls.outcome.CallOutcome` and a
:class:`ReceiptTarget` (one receipt, :class:`SingleReceipt`; or a bulk request's
aggregate with its members, :class:`BatchReceipt`) and records the outcome as the
table in :mod:`playline.calls.outcome` says. A paid answer is written *durably*
(retried while the store fails, then journalled), never dropped; a failure or a
release is best effort (losing it costs nothing: the lease expires and the call is
claimed again, or found ambiguous if it was sent to a tool that does not de-duplicate).
"""

from __future__ import annotations

import logging
from typing import Protocol

from playline.calls.attempt import Attempt
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import Settled
from playline.calls.outcome import Ambiguous, Answered, CallOutcome, Failed, Parked
from playline.errors import CallAmbiguous
from playline.stores.journal import JournalEntry, record_entry

__all__ = ["BatchReceipt", "ReceiptTarget", "SingleReceipt", "settle"]

logger = logging.getLogger("playline.calls")


class ReceiptTarget(Protocol):
    """Where an outcome is recorded: one receipt, or a bulk request and its members."""

    key: str
    #: the calls it answers (1, or a bulk request's members): what the stats count
    calls: int

    async def complete(self, answer: Answered) -> bool: ...

    def journal_entry(self, answer: Answered) -> JournalEntry: ...

    async def fail(self, error: str, *, charged: bool) -> None: ...

    async def release(self) -> None: ...

    async def ambiguous(self, reason: str) -> None: ...


async def settle(
    attempt: Attempt, target: ReceiptTarget, outcome: CallOutcome, tool: ToolSpec
) -> Settled:
    """Record ``outcome`` on ``target``; the answer and what this attempt recorded it
    cost, or the outcome's error raised.

    An answer's credits (priced by the dispatcher) are counted here, once: the
    attempt's stats and the credits metric say what was paid. A receipt taken over
    before the answer was recorded is the new owner's to record and to count (it
    re-sends under the same key and is answered free), so the answer is returned
    with 0 credits and the stats give them back.
    """
    tool_id = tool.id
    match outcome:
        case Answered(data=data, credits=credits, source=source):
            attempt.stats.credits += credits
            if not await _record_answer(attempt, target, outcome):
                attempt.stats.credits -= credits
                return Settled(data, 0.0, source, recorded=False)
            if credits:  # a fixture's answer, or a miss a provider does not bill: none
                attempt.metrics.credits(tool.provider, tool.id, credits)
                # One charge per recorded answer (a bulk request's is one), as billed.
                attempt.stats.account(tool.provider).charge(credits)
            return Settled(data, credits, source)
        case Failed(error=error):
            attempt.stats.failed += target.calls
            charged = getattr(error, "may_have_charged", False)
            await attempt.best_effort(
                lambda: target.fail(str(error), charged=charged), what=f"failure of {target.key}"
            )
            raise error
        case Parked(error=error):
            await attempt.best_effort(target.release, what=f"release of {target.key}")
            raise error
        case Ambiguous(error=error):
            attempt.stats.ambiguous += target.calls
            reason = str(error)
            await attempt.best_effort(
                lambda: target.ambiguous(reason), what=f"ambiguous mark of {target.key}"
            )
            raise CallAmbiguous(tool_id, _short(reason))


async def _record_answer(attempt: Attempt, target: ReceiptTarget, answer: Answered) -> bool:
    """Write a paid answer, retrying; past the attempt's patience, journal it and stop.
    False when the receipt was taken over (its new owner records the call)."""
    try:
        recorded = await attempt.durably(
            lambda: target.complete(answer), what=f"recording {target.key}"
        )
    except Exception:
        if attempt.journal is None:
            raise attempt.latch.error() from None
        await attempt.journal.keep(target.journal_entry(answer))
        raise attempt.latch.error() from None
    if not recorded:
        # The lease was taken over (only a tool that may be re-sent loses it while its
        # call is in flight): the new owner records the same call. The answer is still
        # good for this row.
        logger.info("receipt %s was taken over before its answer was recorded", target.key)
    return bool(recorded)


def _short(reason: str) -> str:
    """An error's message without the tool id it starts with (CallAmbiguous adds it)."""
    _, sep, rest = reason.partition(": ")
    return rest if sep else reason


class _Receipt:
    """What both receipt targets share: the attempt whose lease they are under, the
    key, and recording an answer exactly as its journal entry would be replayed."""

    def __init__(self, attempt: Attempt, key: str) -> None:
        self._attempt = attempt
        self.key = key

    async def complete(self, answer: Answered) -> bool:
        return bool(await record_entry(self._attempt.receipts, self.journal_entry(answer)))

    def journal_entry(self, answer: Answered) -> JournalEntry:
        raise NotImplementedError


class SingleReceipt(_Receipt):
    """One call's receipt, under the attempt's lease."""

    calls = 1

    def __init__(self, attempt: Attempt, key: str, payer: str | None = None) -> None:
        super().__init__(attempt, key)
        self._payer = payer

    def journal_entry(self, answer: Answered) -> JournalEntry:
        return JournalEntry(
            self.key,
            self._attempt.lease_id,
            result=answer.data,
            credits=answer.credits,
            credits_source=answer.source,
            paid_by=self._payer,
        )

    async def fail(self, error: str, *, charged: bool) -> None:
        attempt = self._attempt
        await attempt.receipts.fail(self.key, lease_id=attempt.lease_id, error=error)

    async def release(self) -> None:
        attempt = self._attempt
        await attempt.receipts.release([self.key], lease_id=attempt.lease_id)

    async def ambiguous(self, reason: str) -> None:
        attempt = self._attempt
        await attempt.receipts.mark_ambiguous(self.key, lease_id=attempt.lease_id, reason=reason)


class BatchReceipt(_Receipt):
    """A bulk request's aggregate receipt and its members.

    ``complete`` takes the bulk answer already split per member (``{key: result}``,
    each member's credits in ``member_credits``); a failure that may have been charged
    keeps the membership, so the next attempt re-sends exactly this request (under the
    same key, for a tool that de-duplicates).
    """

    def __init__(
        self, attempt: Attempt, agg: str, *, calls: int, payers: dict[str, str] | None = None
    ) -> None:
        super().__init__(attempt, agg)
        self.calls = calls
        self._payers = payers or {}

    def journal_entry(self, answer: Answered) -> JournalEntry:
        return JournalEntry(
            self.key,
            self._attempt.lease_id,
            credits=answer.credits,
            credits_source=answer.source,
            results=dict(answer.data),
            member_credits=dict(answer.member_credits or {}),
            member_paid_by=dict(self._payers),
        )

    async def fail(self, error: str, *, charged: bool) -> None:
        attempt = self._attempt
        await attempt.receipts.fail_batch(
            self.key, lease_id=attempt.lease_id, error=error, release_members=not charged
        )

    async def release(self) -> None:
        attempt = self._attempt
        await attempt.receipts.fail_batch(
            self.key, lease_id=attempt.lease_id, error="parked", release_members=True
        )

    async def ambiguous(self, reason: str) -> None:
        attempt = self._attempt
        await attempt.receipts.mark_batch_ambiguous(
            self.key, lease_id=attempt.lease_id, reason=reason
        )
