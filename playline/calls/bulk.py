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

Results are split back to the member receipts in the order of the request, all in
one transaction with the aggregate's completion.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from playline.calls.attempt import Attempt, until_released
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import ClaimedCall
from playline.errors import (
    FixtureMissing,
    LeaseLost,
    ProviderError,
    ProviderRejected,
    ProviderTransientError,
)
from playline.stores.receipts import BatchClaim, ClaimStatus


def aggregate_key(tool_id: str, member_keys: list[str]) -> str:
    """The aggregate receipt key of a batch: the same members give the same key."""
    digest = hashlib.sha256("\n".join(sorted(member_keys)).encode()).hexdigest()[:32]
    return f"{tool_id}#batch:{digest}"


def split_results(tool: ToolSpec, response: Any, count: int) -> list[Any]:
    """The member results of a bulk response, in request order, or a transient error."""
    assert tool.batch is not None
    results = response.get(tool.batch.results_field) if isinstance(response, dict) else None
    if not isinstance(results, list) or len(results) != count:
        got = len(results) if isinstance(results, list) else "no"
        raise ProviderTransientError(
            f"{tool.id}: bulk response had {got} results for {count} items",
            tool_id=tool.id,
        )
    return results


@dataclass
class _Pending:
    key: str
    payload: dict[str, Any]
    future: asyncio.Future[Any] = field(repr=False)


class BulkSender(Protocol):
    """Sends one request through the governor, with retries (``PacedSender``)."""

    async def send(
        self,
        tool: ToolSpec,
        payload: dict[str, Any],
        idempotency_key: str,
        *,
        credits: float,
        path: str | None = None,
    ) -> Any: ...


class BulkDispatcher:
    """Compiles one chunk attempt's claimed calls of bulk tools into bulk requests."""

    def __init__(self, attempt: Attempt, sender: BulkSender) -> None:
        self._attempt = attempt
        self._sender = sender
        self._queues: dict[str, list[_Pending]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._resuming: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.requests = 0  # bulk requests that produced results
        self.tasks: set[asyncio.Task[None]] = set()

    async def settle(self, call: ClaimedCall) -> Any:
        """A claimed call of a bulk tool: joins a new batch, or finishes its old one."""
        try:
            if call.batch_key is not None:
                return await self.resume(call.tool, call.batch_key, call.key)
            return await self.submit(call.tool, call.key, call.payload)
        except (ProviderError, FixtureMissing):
            self._attempt.stats.failed += 1
            raise

    async def submit(self, tool: ToolSpec, key: str, payload: dict[str, Any]) -> Any:
        """Queue a claimed member; resolves with its own result."""
        assert tool.batch is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(tool.id, [])
        queue.append(_Pending(key, payload, future))
        if len(queue) >= tool.batch.max_items:
            self._flush(tool)
        elif tool.id not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[tool.id] = loop.call_later(tool.batch.linger_ms / 1000, self._flush, tool)
        return await future

    async def resume(self, tool: ToolSpec, agg_key: str, key: str) -> Any:
        """Finish the unfinished batch ``key`` belongs to; returns ``key``'s result."""
        existing = self._resuming.get(agg_key)
        if existing is None:
            existing = asyncio.ensure_future(self._resume(tool, agg_key))
            self._resuming[agg_key] = existing
        results = await asyncio.shield(existing)
        return results[key]

    # -- internals ----------------------------------------------------------

    def _flush(self, tool: ToolSpec) -> None:
        timer = self._timers.pop(tool.id, None)
        if timer is not None:
            timer.cancel()
        members = self._queues.pop(tool.id, [])
        if members:
            task = asyncio.ensure_future(self._run_batch(tool, members))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run_batch(self, tool: ToolSpec, members: list[_Pending]) -> None:
        assert tool.batch is not None
        members = sorted(members, key=lambda m: m.key)
        keys = [m.key for m in members]
        agg = aggregate_key(tool.id, keys)
        request = {tool.batch.items_field: [m.payload for m in members]}
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
            results = await self._dispatch(tool, agg, keys, request)
        except BaseException as err:
            for member in members:
                if not member.future.done():
                    member.future.set_exception(err)
                    member.future.exception()
            if isinstance(err, asyncio.CancelledError):
                raise
            return
        for member, result in zip(members, results, strict=True):
            if not member.future.done():
                member.future.set_result(result)

    async def _dispatch(
        self, tool: ToolSpec, agg: str, keys: list[str], request: dict[str, Any]
    ) -> list[Any]:
        """Send the stored request and record every member's result (or the failure)."""
        attempt = self._attempt
        assert tool.batch is not None
        with attempt.leases.holding([agg]):
            try:
                response = await self._sender.send(
                    tool,
                    request,
                    batch_idempotency_key(agg),
                    credits=tool.credits * len(keys),
                    path=tool.batch.path,
                )
                results = split_results(tool, response, len(keys))
            except ProviderRejected as err:
                # Rejected outright (4xx): nothing was charged, so the members may
                # be batched afresh later.
                await attempt.persist(
                    attempt.receipts.fail_batch(
                        agg, lease_id=attempt.lease_id, error=str(err), release_members=True
                    )
                )
                raise
            except ProviderTransientError as err:
                # The provider may have charged it: keep the membership so the
                # next attempt re-sends exactly this request under the same key.
                await attempt.persist(
                    attempt.receipts.fail_batch(
                        agg, lease_id=attempt.lease_id, error=str(err), release_members=False
                    )
                )
                raise
            done = await attempt.persist(
                attempt.receipts.complete_batch(
                    agg,
                    lease_id=attempt.lease_id,
                    results=dict(zip(keys, results, strict=True)),
                    credits_per_member=tool.credits,
                )
            )
            if not done:
                raise LeaseLost(f"batch {agg} was taken over before its results were recorded")
            self.requests += 1
            return results

    async def _resume(self, tool: ToolSpec, agg: str) -> dict[str, Any]:
        attempt = self._attempt

        async def poll() -> BatchClaim | None:
            claim: BatchClaim = await attempt.persist(
                attempt.receipts.claim_batch(
                    agg, owner=attempt.owner, lease_id=attempt.lease_id, ttl_s=attempt.lease_ttl_s
                )
            )
            return None if claim.status is ClaimStatus.HELD else claim

        assert attempt.max_wait_s is not None
        claim = await until_released(poll, max_wait_s=attempt.max_wait_s, what=f"batch {agg}")
        if claim.status is ClaimStatus.HIT:
            found = await attempt.receipts.get(claim.member_keys)
            return {k: r.result for k, r in found.items()}
        with attempt.leases.holding(claim.member_keys):
            results = await self._dispatch(tool, agg, claim.member_keys, claim.request)
        return dict(zip(claim.member_keys, results, strict=True))


def batch_idempotency_key(agg: str) -> str:
    """The Idempotency-Key of a bulk request: fixed by its aggregate receipt key."""
    return hashlib.sha256(agg.encode()).hexdigest()
