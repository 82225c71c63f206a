"""Bulk endpoints: many member calls, one provider request, never paid twice.

A tool whose catalog entry declares ``batch`` has its claimed calls compiled into
bulk requests. Before a bulk request is sent, its membership is made durable: one
*aggregate receipt* (key derived from the sorted member keys) stores the exact
request, and every member receipt points at it. The ``Idempotency-Key`` comes from
the aggregate key. So if a worker dies after the provider charged a batch but
before the members were recorded, the next attempt that claims any member finds
the aggregate and re-sends the *same* request with the *same* key, which the
provider answers from its idempotency store instead of charging again. Re-forming
a different batch from the same members (and paying for them again) cannot happen.

Results are split back to the member receipts in the order of the request (or, for
a provider answering matches only, by the ``id_field`` playline set on each item), all
in one transaction with the aggregate's completion, each member with its own credits:
the tool's billing rule applies per member, and a total the provider reports is
spread over them (:func:`playline.calls.billing.bulk_charges`). A tool whose provider does not
de-duplicate has its aggregate marked *sent* before the request goes out: an attempt
that finds such a batch sent and unsettled marks it and its members ambiguous instead
of sending it again.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from playline.calls.attempt import Attempt, until_released
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import ClaimedCall, Request, Settled
from playline.calls.outcome import Ambiguous, Answered, CallOutcome, Failed
from playline.calls.queueing import QueueingDispatcher
from playline.calls.settle import BatchReceipt, settle
from playline.errors import CallAmbiguous, LeaseLost, ProviderTransientError
from playline.stores.receipts import BatchClaim, ClaimStatus


def aggregate_key(tool_id: str, members: list[tuple[str, int]]) -> str:
    """The aggregate receipt key of a batch: the same members give the same key.

    ``members`` are ``(receipt key, generation)``: a member claimed again for a fresh
    answer (forced, stale) is in a new generation, so its next batch is a new
    aggregate with a new ``Idempotency-Key``, never the old answer replayed.
    """
    names = sorted(key if generation == 0 else f"{key}#{generation}" for key, generation in members)
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:32]
    return f"{tool_id}#batch:{digest}"


def bulk_items(tool: ToolSpec, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items of a bulk request: the members' inputs, each with its position in
    ``id_field`` when the tool's results are matched by it."""
    assert tool.batch is not None
    field_name = tool.batch.id_field
    if field_name is None:
        return list(payloads)
    return [{**payload, field_name: str(at)} for at, payload in enumerate(payloads)]


def split_results(tool: ToolSpec, response: Any, count: int) -> list[Any]:
    """The member results of a bulk response, in request order, or a provider error.

    With ``id_field``, results are matched by it and a member without one is a miss
    (``None``): such providers list matches only; a ``None`` response (a status in the
    tool's ``no_match_status``) is a miss of every member. Otherwise a response with the wrong
    number of results was answered (and maybe charged) but cannot be used:
    ``may_have_charged``.
    """
    assert tool.batch is not None
    if response is None:
        # The whole request answered with one of the tool's no_match_status: no member
        # was found.
        return [None] * count
    results = response.get(tool.batch.results_field) if isinstance(response, dict) else None
    if tool.batch.id_field is not None and isinstance(results, list):
        by_id = {
            str(r.get(tool.batch.id_field)): r
            for r in results
            if isinstance(r, dict) and r.get(tool.batch.id_field) is not None
        }
        return [by_id.get(str(at)) for at in range(count)]
    if not isinstance(results, list) or len(results) != count:
        got = len(results) if isinstance(results, list) else "no"
        raise ProviderTransientError(
            f"{tool.id}: bulk response had {got} results for {count} items",
            tool_id=tool.id,
            may_have_charged=True,
        )
    return results


@dataclass
class _Pending:
    key: str
    payload: dict[str, Any]
    generation: int
    future: asyncio.Future[Settled] = field(repr=False)
    payer: str | None = None


class BulkSender(Protocol):
    """Sends one request through the governor, with retries (``PacedSender``)."""

    async def send(self, request: Request) -> CallOutcome: ...


class BulkDispatcher(QueueingDispatcher[_Pending]):
    """Compiles one chunk attempt's claimed calls of bulk tools into bulk requests.

    Bulk requests run as tasks of their own (a batch fills from many rows); the
    attempt waits for them in :meth:`aclose` before it reports, so a bulk request in
    flight finishes and records its answer inside the attempt that sent it, and none
    is sent after the attempt ended. Cancelled, the attempt cancels the bulk requests
    running (a request already sent to a tool that does not de-duplicate was marked
    sent first, so its next claimant records it ambiguous; one that does is re-sent
    under the same key).
    """

    def __init__(self, attempt: Attempt, sender: BulkSender) -> None:
        super().__init__()
        self._attempt = attempt
        self._sender = sender
        self._resuming: dict[str, asyncio.Future[dict[str, Settled]]] = {}
        self.requests = 0  # bulk requests that produced results

    async def settle(self, call: ClaimedCall) -> Settled:
        """A claimed call of a bulk tool: joins a new batch, or finishes its old one."""
        if call.batch_key is not None:
            return await self.resume(call.tool, call.batch_key, call.key, call.payer)
        return await self.submit(call.tool, call.key, call.payload, call.generation, call.payer)

    async def submit(
        self,
        tool: ToolSpec,
        key: str,
        payload: dict[str, Any],
        generation: int = 0,
        payer: str | None = None,
    ) -> Settled:
        """Queue a claimed member; resolves with its own result."""
        assert tool.batch is not None
        future: asyncio.Future[Settled] = asyncio.get_running_loop().create_future()
        pending = _Pending(key, payload, generation, future, payer)
        self._queue(tool, pending, tool.batch.max_items, tool.batch.linger_ms)
        try:
            return await future
        except asyncio.CancelledError:
            # The row is gone (its chunk attempt cancelled): a member still waiting for
            # its batch to fill is withdrawn, so no batch is sent for it after the
            # attempt, and a linger timer with nothing left to send is stopped.
            self._withdraw(tool.id, pending)
            raise

    async def resume(
        self, tool: ToolSpec, agg_key: str, key: str, payer: str | None = None
    ) -> Settled:
        """Finish the unfinished batch ``key`` belongs to; returns ``key``'s result."""
        existing = self._resuming.get(agg_key)
        if existing is None:
            payers = {key: payer} if payer is not None else {}
            existing = asyncio.ensure_future(self._resume(tool, agg_key, payers))
            self._resuming[agg_key] = existing
            self._track(existing)
        results = await asyncio.shield(existing)
        return results[key]

    def _drop(self, member: _Pending) -> None:
        """Cancelled before it was sent: its row's wait ends."""
        member.future.cancel()

    # -- internals ----------------------------------------------------------

    def _withdraw(self, tool_id: str, pending: _Pending) -> None:
        queue = self._queues.get(tool_id, [])
        for at, queued in enumerate(queue):
            if queued is pending:
                del queue[at]
                break
        else:
            return  # already in a batch: that request finishes and records it
        if not queue:
            del self._queues[tool_id]
            timer = self._timers.pop(tool_id, None)
            if timer is not None:
                timer.cancel()

    async def _send(self, tool: ToolSpec, members: list[_Pending]) -> None:
        assert tool.batch is not None
        # Members whose rows were cancelled between the flush and now are not sent.
        members = sorted((m for m in members if not m.future.done()), key=lambda m: m.key)
        if not members:
            return
        keys = [m.key for m in members]
        agg = aggregate_key(tool.id, [(m.key, m.generation) for m in members])
        request = {tool.batch.items_field: bulk_items(tool, [m.payload for m in members])}
        attempt = self._attempt
        try:
            opened = await attempt.persist(
                attempt.receipts.open_batch(
                    agg,
                    tool_id=tool.id,
                    member_keys=keys,
                    request=request,
                    owner=attempt.owner,
                    lease_id=attempt.lease_id,
                    ttl_s=attempt.lease_ttl_s,
                )
            )
            if not opened:
                raise LeaseLost(f"batch {agg}: a member receipt was taken over before dispatch")
            payers = {m.key: m.payer for m in members if m.payer is not None}
            results = await self._dispatch(tool, agg, keys, request, payers)
        except BaseException as err:
            for member in members:
                if not member.future.done():
                    member.future.set_exception(err)
                    member.future.exception()
            if isinstance(err, asyncio.CancelledError):
                raise
            return
        for member in members:
            if not member.future.done():
                member.future.set_result(results[member.key])

    async def _dispatch(
        self,
        tool: ToolSpec,
        agg: str,
        keys: list[str],
        request: dict[str, Any],
        payers: dict[str, str] | None = None,
    ) -> dict[str, Settled]:
        """Send the stored request and record every member's result (or the outcome)."""
        attempt = self._attempt
        assert tool.batch is not None
        valid_until = time.monotonic() + attempt.lease_ttl_s
        with attempt.leases.holding([agg], valid_until=valid_until):
            outcome = await self._sender.send(
                Request(tool, request, batch_idempotency_key(agg), (agg,), path=tool.batch.path)
            )
            if isinstance(outcome, Answered):
                outcome = _priced(tool, keys, outcome)
            target = BatchReceipt(attempt, agg, calls=len(keys), payers=payers)
            settled = await settle(attempt, target, outcome, tool)
            self.requests += 1
            assert isinstance(outcome, Answered) and outcome.member_credits is not None
            # Not recorded (taken over): the new owner records the members' credits.
            shares = outcome.member_credits if settled.credits or not outcome.credits else {}
            results: dict[str, Any] = settled.data
            recorded = settled.recorded
            return {
                key: Settled(result, shares.get(key, 0.0), outcome.source, recorded=recorded)
                for key, result in results.items()
            }

    async def _resume(self, tool: ToolSpec, agg: str, payers: dict[str, str]) -> dict[str, Settled]:
        attempt = self._attempt

        async def poll() -> BatchClaim | None:
            claim: BatchClaim = await attempt.persist(
                attempt.receipts.claim_batch(
                    agg,
                    owner=attempt.owner,
                    lease_id=attempt.lease_id,
                    ttl_s=attempt.lease_ttl_s,
                    ambiguous_if_sent=not tool.resend_safe,
                    retry_ambiguous=attempt.retry_ambiguous,
                )
            )
            return None if claim.status is ClaimStatus.HELD else claim

        assert attempt.max_wait_s is not None
        started = time.monotonic()
        claim = await until_released(poll, max_wait_s=attempt.max_wait_s, what=f"batch {agg}")
        if claim.status is ClaimStatus.HIT:
            # Another owner finished the batch: its answers cost this attempt nothing.
            found = await attempt.receipts.get(claim.member_keys)
            return {k: Settled(r.result, paid=False) for k, r in found.items()}
        if claim.status is ClaimStatus.AMBIGUOUS:
            if claim.became_ambiguous:
                attempt.stats.ambiguous += len(claim.member_keys)
            raise CallAmbiguous(tool.id, claim.reason or "an earlier bulk request")
        valid_until = started + attempt.lease_ttl_s
        with attempt.leases.holding(claim.member_keys, valid_until=valid_until):
            return await self._dispatch(tool, agg, claim.member_keys, claim.request, payers)


def _priced(tool: ToolSpec, keys: list[str], answer: Answered) -> CallOutcome:
    """A bulk answer split per member and priced per member, or the error it amounts to
    (a response that cannot be split was answered, maybe charged, but is unusable)."""
    try:
        split = split_results(tool, answer.data, len(keys))
    except ProviderTransientError as err:
        return Failed(err) if tool.resend_safe else Ambiguous(err)
    shares, source = tool.bulk_charges(answer.data, split, answer.reported)
    return Answered(
        dict(zip(keys, split, strict=True)),
        sum(shares),
        source,
        member_credits=dict(zip(keys, shares, strict=True)),
    )


def batch_idempotency_key(agg: str) -> str:
    """The Idempotency-Key of a bulk request: fixed by its aggregate receipt key."""
    return hashlib.sha256(agg.encode()).hexdigest()
