"""The receipt store: which provider calls were made, and what they returned.

Every tool call is identified by a content address (tool id, tool version, canonical
input, auth-scope digest). Before a call is dispatched the caller *claims* its receipt
with a lease; only the lease holder may complete it (completion is fenced by lease
id). A completed receipt is a cache hit for every later call with the same address,
which is what makes a rerun, a retried chunk or a crashed worker free: nothing is
paid twice.

States: ``running`` (claimed; ``lease_id`` and ``lease_expires_at`` set), ``completed``
(``result`` set), ``failed`` (``error`` set; a later claim retries it) and
``ambiguous`` (sent to a tool whose provider does not de-duplicate, with no definitive
answer: it may have been charged, so only an explicit ``retry_ambiguous`` claim sends it
again). A running receipt whose lease has expired is reclaimable; that is how a new
attempt takes over from a crashed worker, unless it is marked *sent* (``sent_at``,
written just before a non-de-duplicated request goes out) and its tool does not
de-duplicate: then the claim finds it ``ambiguous`` instead of sending it again.

``generation`` counts the times a completed receipt was claimed again for a fresh
answer (``force``, ``stale_after_seconds``); the ``Idempotency-Key`` derives from the key and
the generation, so a crashed forced call is re-sent under the same key, and a fresh
answer never under the key of the answer it replaces. ``forced_by`` names the run that
forced the receipt, so a retry of that run reuses the answer it already paid for.

The interface (:class:`ReceiptStore`) and the claim rule (:func:`decide_claim`) are
backend-neutral; :class:`~playline.stores.receipts_ledger.ReceiptLedger` implements
them on SQLite (the embedded default) and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from playline.freshness import stricter, within_age


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def receipt_key(tool_id: str, tool_version: str, tool_input: Any, auth_scope: str) -> str:
    """The content address of one tool call."""
    material = canonical_json(
        {"tool": tool_id, "version": tool_version, "input": tool_input, "scope": auth_scope}
    )
    return f"{tool_id}:{hashlib.sha256(material.encode()).hexdigest()[:32]}"


def stored_json(value: Any) -> str:
    """How a result is stored: canonical JSON, non-ASCII escaped.

    Escaped, a stored result is plain ASCII whatever a provider sent (lone
    surrogates, control characters), so no store can refuse to write a paid answer
    for its encoding. (Receipt keys hash :func:`canonical_json`, which this does not
    change.)
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def idempotency_key(key: str, generation: int = 0) -> str:
    """The ``Idempotency-Key`` sent to the provider.

    Derived from the receipt key, so a retried attempt after a crash presents the
    same key and the provider does not charge again. A receipt claimed again for a
    fresh answer (forced or stale) is in a new generation: its key differs from the
    one of the answer it replaces, which must not be deduplicated away, and stays
    the same across the attempts that fetch it.
    """
    material = key if generation == 0 else f"{key}|{generation}"
    return hashlib.sha256(material.encode()).hexdigest()


class ReceiptStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"  # the caller holds the lease and must call the provider
    HIT = "hit"  # a completed receipt answers the call
    HELD = "held"  # another live owner holds the lease; wait for it
    AMBIGUOUS = "ambiguous"  # sent earlier, no answer recorded: may have been charged


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One call's claim.

    Attributes:
        key: the receipt key.
        tool_id: the tool (stored with a new receipt).
        force: a fresh, paid answer is wanted even if a completed receipt exists.
        stale_after_seconds: a completed receipt older than this is not an answer.
        ambiguous_if_sent: the tool's provider does not de-duplicate
            (``idempotency = "none"``): a receipt sent by an owner that never
            recorded its answer is ambiguous, not re-sent.
        retry_ambiguous: claim an ambiguous receipt anyway (the user asked to
            re-send such calls).
        force_token: the run a forced call belongs to: a receipt that run already
            forced and completed is its answer.
        max_age: the tool's freshness rule judged on a completed receipt's answer: how
            old that receipt may be (``None``: for ever). Combined with
            ``stale_after_seconds``, the stricter wins.
    """

    key: str
    tool_id: str
    force: bool = False
    stale_after_seconds: float | None = None
    ambiguous_if_sent: bool = False
    retry_ambiguous: bool = False
    force_token: str | None = None
    max_age: Callable[[Any], float | None] | None = field(default=None, compare=False)

    def age_limit(self, result: Any) -> float | None:
        """How old a completed receipt answering ``result`` may be for this claim."""
        rule = self.max_age(_loaded(result)) if self.max_age is not None else None
        return stricter(rule, self.stale_after_seconds)


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    key: str
    status: ClaimStatus
    result: Any = None
    lease_expires_at: float | None = None
    owner: str | None = None
    batch_key: str | None = None  # CLAIMED member of an unfinished batch: resume it
    #: CLAIMED: the generation the call is sent in (its ``Idempotency-Key``)
    generation: int = 0
    #: AMBIGUOUS: why the call may have been charged
    reason: str | None = None
    #: AMBIGUOUS: this claim found the receipt sent and unsettled, and marked it
    became_ambiguous: bool = False
    #: HIT: when the answering receipt was completed, so a reused value can say its date
    completed_at: float | None = None
    #: HIT: the credits the answering receipt cost when it was paid (reusing it costs 0)
    credits: float | None = None
    #: HIT: where that figure came from (``"provider"`` or ``"rule"``)
    credits_source: str | None = None
    #: HIT: who paid for the answer (a dataset row, see ``complete``'s ``paid_by``)
    paid_by: str | None = None
    #: CLAIMED: the call was sent before at this generation and never answered; this
    #: claim sends it again (a provider that de-duplicates, or ``retry_ambiguous``).
    #: Counted on the receipt (``resends``) so a run's audit can say so.
    resent: bool = False


class StoredState(NamedTuple):
    """What the claim rule reads of a stored receipt (both backends select these)."""

    status: str
    result: Any
    owner: str | None
    lease_id: str | None
    lease_expires_at: float | None
    completed_at: float | None
    batch_key: str | None
    sent_at: float | None
    generation: int
    error: str | None
    forced_by: str | None
    #: what the receipt was charged (reported on a HIT); defaulted for rows built by hand
    credits: float | None = None
    credits_source: str | None = None
    paid_by: str | None = None


#: The columns a claim reads, in :class:`StoredState`'s order.
STATE_COLUMNS = (
    "status, result, owner, lease_id, lease_expires_at, completed_at, batch_key, sent_at,"
    " generation, error, forced_by, credits, credits_source, paid_by"
)

#: Where a receipt's credits figure came from: the provider reported the charge.
CREDITS_FROM_PROVIDER = "provider"
#: ... or it was computed from the catalog's billing rule (the default).
CREDITS_FROM_RULE = "rule"


@dataclass(frozen=True, slots=True)
class Receipt:
    key: str
    tool_id: str
    status: str
    result: Any
    error: str | None
    owner: str | None
    lease_id: str | None
    lease_expires_at: float | None
    completed_at: float | None
    attempts: int
    credits: float
    sent_at: float | None = None
    generation: int = 0
    #: ``"provider"`` (the provider reported the charge) or ``"rule"`` (computed from
    #: the billing rule); ``None`` for receipts recorded before it was kept
    credits_source: str | None = None


@dataclass(frozen=True, slots=True)
class BatchClaim:
    """What claiming an aggregate receipt found: the stored request and its members."""

    status: ClaimStatus
    member_keys: list[str]
    request: dict[str, Any]
    #: AMBIGUOUS: why the batch may have been charged
    reason: str | None = None
    #: AMBIGUOUS: this claim found it sent and unsettled, and marked it (and its members)
    became_ambiguous: bool = False


def batch_sent_reason(owner: str | None) -> str:
    """Why a batch its sender never settled is ambiguous."""
    return f"bulk request sent by {owner}, which stopped before recording an answer"


@dataclass(frozen=True, slots=True)
class ToolReceipts:
    """What one play run's rows did with one tool, as its receipts record it (the
    audit's view; see :meth:`ReceiptStore.run_receipts`).

    Attributes:
        tool_id: the tool.
        paid: receipts whose latest paid answer this run's rows paid for.
        credits: what those answers were charged (each answer's own charge, not the
            receipt's total over earlier generations).
        ambiguous: receipts this run sent that may have been charged and have no answer.
        resent: calls this run sent again after an earlier send went unanswered.
        outside_rows: of ``credits``, what calls outside a dataset's rows paid
            (``ctx.tool`` and ``ctx.waterfall`` in the play itself).
    """

    tool_id: str
    paid: int
    credits: float
    ambiguous: int
    resent: int
    outside_rows: float = 0.0


@dataclass(frozen=True, slots=True)
class RunCall:
    """One receipt of a play run, as the reconciliation names a call (see
    :meth:`ReceiptStore.run_calls`): never the answer, never an API key.

    Attributes:
        key: the receipt key (the call's content address).
        tool_id: the tool.
        status: the receipt's status (``completed``, ``ambiguous``, ...).
        credits: what the run paid for its answer (0 unless the run's rows paid it).
        credits_source: ``"provider"`` (reported) or ``"rule"``; ``None`` if unknown.
        paid_by: the row that paid (``{run_ref}#{seq}``), else ``None``.
        owner: the attempt that last sent it (``{workflow id}/{activity}#{attempt}``).
    """

    key: str
    tool_id: str
    status: str
    credits: float
    credits_source: str | None
    paid_by: str | None
    owner: str | None


class ReceiptStore(Protocol):
    """What the tool runner needs from a receipt backend. All methods are atomic."""

    async def claim(
        self, requests: Sequence[ClaimRequest], *, owner: str, lease_id: str, ttl_s: float
    ) -> list[ClaimOutcome]:
        """Claim many receipts in one transaction; one outcome per request, in order."""
        ...

    async def renew(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        """Extend the lease on each key; False where this lease no longer holds it."""
        ...

    async def mark_sent(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        """Record that these calls are about to be sent, and extend their leases.

        Written just before a request to a tool that does not de-duplicate goes out;
        False where this lease no longer holds the key (then it must not be sent).
        """
        ...

    async def complete(
        self,
        key: str,
        *,
        lease_id: str,
        result: Any,
        credits: float,
        credits_source: str = CREDITS_FROM_RULE,
        paid_by: str | None = None,
    ) -> bool:
        """Record a result; False (and nothing written) if the lease was lost.

        ``paid_by`` names who paid for the call (a dataset row: ``<run ref>#<seq>``):
        when the same payer claims the receipt again (its chunk retried after a
        crash) the answer reads as paid by it, so its credits are not lost.

        A receipt this lease sent that was since marked ``ambiguous`` is completed
        too: the answer is known after all. ``credits_source`` says where ``credits``
        came from (``"provider"`` or ``"rule"``), so a reader can tell a charge the
        provider reported from an estimate.
        """
        ...

    async def fail(self, key: str, *, lease_id: str, error: str) -> bool:
        """Record a failure; False if the lease was lost."""
        ...

    async def mark_ambiguous(self, key: str, *, lease_id: str, reason: str) -> bool:
        """Record that the call was sent and got no definitive answer; False if the
        lease was lost."""
        ...

    async def release(self, keys: Sequence[str], *, lease_id: str) -> None:
        """Give back leases of calls that were never dispatched."""
        ...

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        """Current receipts for these keys (missing keys are absent)."""
        ...

    async def sample(self, tool_id: str, limit: int = 1000) -> list[tuple[Any, float | None]]:
        """``(result, credits)`` of the latest ``limit`` completed receipts of a tool.

        Read-only, from an index on ``(tool_id, completed_at)`` of completed receipts:
        an estimate reads what a tool's answers looked like and cost (its hit rates
        and prices) without scanning the table.
        """
        ...

    async def open_batch(
        self,
        agg_key: str,
        *,
        tool_id: str,
        member_keys: Sequence[str],
        request: dict[str, Any],
        owner: str,
        lease_id: str,
        ttl_s: float,
    ) -> bool:
        """Record a batch's exact request and point its members (held by this lease) at
        it, before it is sent; False if a member is no longer held."""
        ...

    async def claim_batch(
        self,
        agg_key: str,
        *,
        owner: str,
        lease_id: str,
        ttl_s: float,
        ambiguous_if_sent: bool = False,
        retry_ambiguous: bool = False,
    ) -> BatchClaim:
        """Take over an unfinished batch: the aggregate and all its unfinished members.

        A batch of a tool that does not de-duplicate (``ambiguous_if_sent``) that was
        sent and never settled is ``AMBIGUOUS`` with its members, unless
        ``retry_ambiguous``.
        """
        ...

    async def complete_batch(
        self,
        agg_key: str,
        *,
        lease_id: str,
        results: dict[str, Any],
        member_credits: Mapping[str, float],
        credits_source: str = CREDITS_FROM_RULE,
        member_paid_by: Mapping[str, str] | None = None,
    ) -> bool:
        """Complete the aggregate and every unfinished member in one transaction (fenced
        by the aggregate's lease; a member already completed is left as it is).

        Each member is credited its own ``member_credits`` entry (0 when absent): a
        bulk answer's members need not cost the same. The aggregate is credited the
        sum over the members this call completed, so a resumed batch does not count
        again what an earlier attempt recorded.
        """
        ...

    async def fail_batch(
        self, agg_key: str, *, lease_id: str, error: str, release_members: bool
    ) -> None:
        """Record a batch failure; ``release_members`` frees them for a new batch."""
        ...

    async def mark_batch_ambiguous(self, agg_key: str, *, lease_id: str, reason: str) -> bool:
        """The batch was sent and got no definitive answer: it and its unfinished
        members are ambiguous. False if the lease was lost."""
        ...

    async def run_receipts(self, prefix: str) -> list[ToolReceipts]:
        """Per tool, the receipts paid for (``paid_by``) or last sent (``owner``) by
        rows and attempts whose id starts with ``prefix`` (a play run's workflow id and
        ``/``): what the run paid, left ambiguous and re-sent."""
        ...

    async def run_calls(self, prefix: str) -> list[RunCall]:
        """Each receipt paid for or last sent by the run ``prefix`` names (as
        :meth:`run_receipts`, call by call), in key order."""
        ...

    async def close(self) -> None: ...


def decide_claim(
    req: ClaimRequest,
    row: StoredState | None,
    *,
    now: float,
    lease_id: str,
    ttl_s: float,
) -> ClaimOutcome:
    """What a claim finds, and so what the backend writes.

    Shared by every backend so the rules are stated once:

    * a live lease held by someone else is waited on (``HELD``);
    * an ``ambiguous`` receipt, or a *sent* one whose owner stopped before recording
      an answer, of a tool that does not de-duplicate, is ``AMBIGUOUS`` (the latter
      is marked so, ``became_ambiguous``) unless the caller asks to retry those;
    * a fresh completed receipt is a ``HIT`` unless forced (a forced call whose run
      already forced it, ``force_token``, gets that answer: it is paid for);
    * anything else (missing, failed, stale, forced, expired lease) is ``CLAIMED``:
      the backend takes the lease; a completed receipt claimed again goes to a new
      generation and leaves its old batch.
    """
    expires = now + ttl_s
    if row is None:
        return ClaimOutcome(req.key, ClaimStatus.CLAIMED, lease_expires_at=expires)
    status = row.status
    if status == "running" and row.lease_id != lease_id and (row.lease_expires_at or 0) > now:
        return ClaimOutcome(
            req.key, ClaimStatus.HELD, lease_expires_at=row.lease_expires_at, owner=row.owner
        )
    if not req.retry_ambiguous:
        if status == "ambiguous":
            return ClaimOutcome(req.key, ClaimStatus.AMBIGUOUS, reason=row.error)
        if (
            status == "running"
            and row.sent_at is not None
            and req.ambiguous_if_sent
            and row.lease_id != lease_id
        ):
            return ClaimOutcome(
                req.key,
                ClaimStatus.AMBIGUOUS,
                reason=f"sent by {row.owner}, which stopped before recording an answer",
                became_ambiguous=True,
            )
    if status == "completed":
        if req.force:
            if req.force_token is not None and row.forced_by == req.force_token:
                return _hit(req.key, row)
        else:
            limit = req.age_limit(row.result)
            if within_age(row.completed_at, limit, now):
                return _hit(req.key, row)
        return ClaimOutcome(
            req.key, ClaimStatus.CLAIMED, lease_expires_at=expires, generation=row.generation + 1
        )
    return ClaimOutcome(
        req.key,
        ClaimStatus.CLAIMED,
        lease_expires_at=expires,
        batch_key=row.batch_key,
        generation=row.generation,
        resent=row.sent_at is not None or status == "ambiguous",
    )


def _hit(key: str, row: StoredState) -> ClaimOutcome:
    """A completed receipt answering a claim, with its date and original cost."""
    return ClaimOutcome(
        key,
        ClaimStatus.HIT,
        result=_loaded(row.result),
        completed_at=row.completed_at,
        credits=None if row.credits is None else float(row.credits),
        credits_source=row.credits_source,
        paid_by=row.paid_by,
    )


def _loaded(result: Any) -> Any:
    return json.loads(result) if isinstance(result, str) else result
