"""``ToolRunner``: one tool call, from a resolver's ``rc.tool`` to a recorded receipt.

A runner lives for one chunk attempt. For each call it

1. validates the input against the catalog and computes the receipt key (the
   dispatcher supplies the auth scope, so live and fixture answers never mix); an
   input leaving a required field blank raises ``BlankInput`` here, before anything
   is shared, claimed, reserved or sent: the call costs nothing and leaves no trace
   in the receipt store (the chunk records the cell ``skipped_input``);
2. shares the call with any identical call already in flight in this chunk
   (one provider request, many rows);
3. claims the receipt (claims arriving in the same event-loop tick go to the store
   as one bulk claim); a completed receipt is a hit and costs nothing, a receipt
   another live owner holds is waited on (bounded) and reused, and an ambiguous one
   (sent earlier to a tool that does not de-duplicate, no answer recorded: it may
   have been charged) raises ``CallAmbiguous`` instead of being sent again, unless
   the attempt was asked to retry those;
4. hands the claimed call to its :class:`~playline.calls.dispatch.Dispatcher`,
   which obtains the answer (governor + HTTP, fixture, or bulk request) and
   records it under the lease.

An estimate runs the same path with other :class:`Claims` and another dispatcher
(:class:`~playline.calls.estimate.EstimatingDispatcher`): its claims only read the
receipt store and its dispatcher counts what the call would cost instead of sending it.

While a call is claimed and unsettled its key is held in the attempt's
:class:`~playline.calls.attempt.LeaseKeeper`, which the chunk's heartbeat renews.

Each call is one span (``attempt.metrics.span``: provider, tool, how the receipt
store answered and the outcome; never the input, the result or a key) and counts
as a receipt hit, miss or wait in the attempt's metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from playline.calls.attempt import Attempt, CallSpan, CallStats, until_released
from playline.calls.catalog import Catalog, ToolSpec
from playline.calls.dispatch import ClaimedCall, Dispatcher, Settled
from playline.calls.tick_batch import TickBatch
from playline.errors import CallAmbiguous, LeaseLost
from playline.freshness import stricter, within_age
from playline.stores.receipts import ClaimOutcome, ClaimRequest, ClaimStatus, receipt_key

#: While a column past its freshness is recomputed, its calls (waterfall steps too)
#: refuse receipts older than this many seconds: a due cell is paid for afresh, not
#: answered by the receipt that made it. Set per row task by the chunk; ``None``: unset.
REFRESH_OLDER_THAN: ContextVar[float | None] = ContextVar(
    "playline_refresh_older_than", default=None
)

#: The chance the run makes the calls made now: 1, but for an estimate's waterfall,
#: whose later steps are tried only when the earlier ones missed. Set by the waterfall
#: around each step; an estimate expects a call at this share of its price.
CALL_REACH: ContextVar[float] = ContextVar("playline_call_reach", default=1.0)

__all__ = ["CALL_REACH", "Claims", "ReceiptUse", "ToolResult", "ToolRunner"]

#: How a call's answer was obtained in this run: paid for now, reused from a completed
#: receipt, shared with an identical call in flight in this chunk, or waited for
#: while another live owner paid for it.
ReceiptUse = Literal["paid", "reused", "shared", "waited"]


async def _young_enough(led: asyncio.Future[ToolResult], limit: float | None) -> bool:
    """Whether a call refusing answers older than ``limit`` seconds may share the
    answer ``led`` (another row's call of the same receipt in this attempt). A leader's
    failure is shared as it always was."""
    if limit is None:
        return True
    try:
        result = await asyncio.shield(led)
    except Exception:
        return True
    return within_age(result.fetched_at, limit, time.time())


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer; ``get(name)`` reads a value through the catalog's getters.

    Besides the data it says what the answer cost *this* call (``credits``: 0 unless
    ``receipt`` is ``"paid"``), where that figure came from (``credits_source``:
    ``"provider"`` or ``"rule"``) and when the answer was fetched from the provider
    (``fetched_at``, epoch seconds: for a reused answer, when its receipt was
    completed). That is what a cell's provenance records.
    """

    tool: ToolSpec = field(repr=False)
    data: Any
    cached: bool
    receipt: ReceiptUse = "paid"
    credits: float = 0.0
    credits_source: str | None = None
    fetched_at: float | None = None
    #: for a reused answer: the receipt's payer and what it cost then (a row sharing
    #: the call may be that payer, in a later attempt: it reads the answer as paid)
    paid_by: str | None = field(default=None, repr=False)
    paid_credits: float | None = field(default=None, repr=False)
    paid_source: str | None = field(default=None, repr=False)

    def get(self, name: str, default: Any = None) -> Any:
        value = self.tool.get(self.data, name)
        return default if value is None else value

    def __getitem__(self, name: str) -> Any:
        return self.get(name)


class Claims(Protocol):
    """How a call's receipt is claimed: the store's claim for a run, a read that claims
    nothing for an estimate."""

    async def claim(self, request: ClaimRequest) -> tuple[ClaimOutcome, float]:
        """The claim's outcome and when (``time.monotonic()``) it was sent."""
        ...

    async def unkeyed(self, tool: ToolSpec, tool_input: Mapping[str, Any]) -> ToolResult | None:
        """The answer to a call whose input cannot be keyed yet (an estimate's input
        holding values known only once the run pays), before validation; ``None``:
        an ordinary input."""
        ...

    def shared(self, key: str) -> None:
        """A call shared the answer of an earlier identical call of the attempt."""
        ...


class ToolRunner:
    """Runs the tool calls of one chunk attempt. See the module docstring.

    Args:
        catalog: the tools that exist.
        attempt: the attempt's leases, breaker, stats and metrics.
        dispatcher: how claimed calls are answered in this attempt's mode.
        claims: how receipts are claimed (default: the attempt's store, claims of one
            event-loop tick batched).
    """

    def __init__(
        self,
        catalog: Catalog,
        attempt: Attempt,
        dispatcher: Dispatcher,
        claims: Claims | None = None,
    ) -> None:
        self.catalog = catalog
        self.attempt = attempt
        self.dispatcher = dispatcher
        self._in_flight: dict[str, asyncio.Future[ToolResult]] = {}
        #: keys whose earlier payment a sharing payer has been credited with already
        self._owned: set[str] = set()
        self._claims: Claims = claims if claims is not None else _ClaimQueue(attempt)

    @property
    def stats(self) -> CallStats:
        return self.attempt.stats

    @property
    def lease_lost(self) -> LeaseLost | None:
        return self.attempt.leases.lost

    async def renew_leases(self) -> None:
        """Renew every unsettled claim; record ``LeaseLost`` if one was taken over."""
        await self.attempt.renew_leases()

    async def call(
        self,
        tool_id: str,
        tool_input: Mapping[str, Any],
        *,
        force: bool = False,
        stale_after_seconds: float | None = None,
        payer: str | None = None,
    ) -> ToolResult:
        """Call a tool once per distinct input, however many rows ask for it.

        ``payer`` names who pays for a call this attempt sends (a dataset row): the
        receipt records it, and a later attempt of the same payer that finds the
        receipt completed reads the answer as paid by it (with its credits), not as
        reused, so a retried or killed chunk still reports what its rows cost.

        A required input left blank raises ``BlankInput`` before anything else (an
        input that is wrong, ``InvalidToolInput``): nothing is claimed or sent.
        """
        tool = self.catalog.tool(tool_id)
        unkeyed = await self._claims.unkeyed(tool, tool_input)
        if unkeyed is not None:
            return unkeyed
        payload = tool.validate_input(tool_input)
        key = receipt_key(tool.id, tool.version, payload, self.dispatcher.auth_scope(tool))
        with self.attempt.metrics.span(tool.provider, tool.id) as span:
            existing = self._in_flight.get(key)
            limit = stricter(stale_after_seconds, REFRESH_OLDER_THAN.get())
            if existing is not None and not await _young_enough(existing, limit):
                existing = None  # a due cell's call: the answer shared so far is too old
            if existing is not None:
                self.stats.shared += 1
                self.stats.account(tool.provider).shared += 1
                span.receipt("shared")
                led = await asyncio.shield(existing)
                self._claims.shared(key)
                if (
                    payer is not None
                    and led.receipt == "reused"
                    and led.paid_by == payer
                    and key not in self._owned
                ):
                    # The leader found a receipt this row paid for in an earlier attempt
                    # (a killed worker's): the cost is this row's, as if it had led
                    # (once: the row's next call of it, another column's, shares).
                    self._owned.add(key)
                    return replace(
                        led,
                        receipt="paid",
                        credits=led.paid_credits or 0.0,
                        credits_source=led.paid_source,
                    )
                return replace(led, cached=True, receipt="shared", credits=0.0, credits_source=None)
            future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
            self._in_flight[key] = future
            try:
                result = await self._lead(
                    tool, payload, key, force, stale_after_seconds, span, payer
                )
            except asyncio.CancelledError:
                future.cancel()
                raise
            except BaseException as err:
                future.set_exception(err)
                future.exception()  # followers may be absent; mark it retrieved
                raise
            future.set_result(result)
            return result

    async def _lead(
        self,
        tool: ToolSpec,
        payload: dict[str, Any],
        key: str,
        force: bool,
        stale: float | None,
        span: CallSpan,
        payer: str | None = None,
    ) -> ToolResult:
        """Claim the receipt and settle the call: the answer and what it cost."""
        attempt = self.attempt
        request = ClaimRequest(
            key=key,
            tool_id=tool.id,
            force=force,
            stale_after_seconds=stricter(stale, REFRESH_OLDER_THAN.get()),
            ambiguous_if_sent=not tool.resend_safe,
            retry_ambiguous=attempt.retry_ambiguous,
            force_token=attempt.force_token if force else None,
            max_age=tool.max_age if tool.fresh_for is not None else None,
        )
        outcome, claimed_at = await self._claims.claim(request)
        if outcome.status is ClaimStatus.HELD:
            outcome, claimed_at, waited = await self._wait_for_holder(request)
            if waited:
                self.stats.waited += 1
                self._receipt(tool, "waited", span)
                self._reused(tool, outcome.credits, follower=True)
                return self._free(tool, outcome, "waited")
        if outcome.status is ClaimStatus.HIT:
            self.stats.cached += 1
            self._receipt(tool, "hit", span)
            if payer is not None and outcome.paid_by == payer:
                # This payer's own answer, recorded by an earlier attempt of its chunk:
                # that attempt counted its charge (see playline.calls.accounting).
                return self._paid_earlier(tool, outcome)
            self._reused(tool, outcome.credits)
            return self._free(tool, outcome, "reused")
        if outcome.status is ClaimStatus.AMBIGUOUS:
            self._receipt(tool, "ambiguous", span)
            if outcome.became_ambiguous:
                self.stats.ambiguous += 1
            raise CallAmbiguous(tool.id, outcome.reason or "an earlier attempt sent it")
        self._receipt(tool, "miss", span)
        call = ClaimedCall(
            tool,
            payload,
            key,
            force=force,
            batch_key=outcome.batch_key,
            generation=outcome.generation,
            payer=payer,
        )
        with attempt.leases.holding([key], valid_until=claimed_at + attempt.lease_ttl_s):
            settled: Settled = await self.dispatcher.settle(call)
        if not settled.paid:
            # A bulk request another owner finished answered it: a follower.
            self._reused(tool, None, follower=True)
        if isinstance(settled.data, ToolResult):
            return settled.data  # shaped by its dispatcher (an estimate's unpaid answer)
        return ToolResult(
            tool,
            settled.data,
            cached=not settled.paid,
            receipt="paid" if settled.paid else "waited",
            credits=settled.credits,
            credits_source=settled.source,
            fetched_at=time.time(),
        )

    @staticmethod
    def _free(tool: ToolSpec, outcome: ClaimOutcome, use: ReceiptUse) -> ToolResult:
        """An answer a completed receipt gave: it costs this call nothing."""
        return ToolResult(
            tool,
            outcome.result,
            cached=True,
            receipt=use,
            credits_source=None,
            fetched_at=outcome.completed_at,
            paid_by=outcome.paid_by,
            paid_credits=outcome.credits,
            paid_source=outcome.credits_source,
        )

    @staticmethod
    def _paid_earlier(tool: ToolSpec, outcome: ClaimOutcome) -> ToolResult:
        """An answer the same payer paid for in an earlier attempt: its cost counts."""
        return ToolResult(
            tool,
            outcome.result,
            cached=True,
            receipt="paid",
            credits=outcome.credits or 0.0,
            credits_source=outcome.credits_source,
            fetched_at=outcome.completed_at,
        )

    def _reused(self, tool: ToolSpec, credits: float | None, *, follower: bool = False) -> None:
        """A completed receipt answered free: a hit or a follower, and what it saved."""
        self.stats.account(tool.provider).reused(credits, follower=follower)
        if credits:
            self.attempt.metrics.saved(tool.provider, tool.id, credits)

    def _receipt(self, tool: ToolSpec, status: str, span: CallSpan) -> None:
        span.receipt(status)
        self.attempt.metrics.receipt(tool.provider, tool.id, status)

    async def _wait_for_holder(self, request: ClaimRequest) -> tuple[ClaimOutcome, float, bool]:
        """Wait out another live owner: its completed result (waited), or our own claim
        (with when it was taken)."""
        key, receipts = request.key, self.attempt.receipts

        async def poll() -> tuple[ClaimOutcome, float, bool] | None:
            receipt = (await receipts.get([key])).get(key)
            if receipt is not None and receipt.status == "completed" and not request.force:
                hit = ClaimOutcome(
                    key,
                    ClaimStatus.HIT,
                    result=receipt.result,
                    completed_at=receipt.completed_at,
                    credits=receipt.credits,
                )
                return hit, 0.0, True
            again, claimed_at = await self._claims.claim(request)
            return None if again.status is ClaimStatus.HELD else (again, claimed_at, False)

        assert self.attempt.max_wait_s is not None
        return await until_released(poll, max_wait_s=self.attempt.max_wait_s, what=f"receipt {key}")


_Claimed = tuple[ClaimOutcome, float]


class _ClaimQueue:
    """Claims queued in one event-loop tick go to the store as one bulk claim.

    Each claim answers with its outcome and when (``time.monotonic()``) the claim was
    sent: a lease taken then is certainly valid for its TTL from that moment.
    """

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt
        self._batch: TickBatch[ClaimRequest, _Claimed] = TickBatch(self._send)

    async def unkeyed(self, tool: ToolSpec, tool_input: Mapping[str, Any]) -> ToolResult | None:
        return None  # a run's inputs are all known

    def shared(self, key: str) -> None:
        pass

    async def claim(self, request: ClaimRequest) -> _Claimed:
        return await self._batch.submit(request)

    async def _send(self, batch: list[ClaimRequest]) -> list[_Claimed]:
        attempt = self._attempt
        started = time.monotonic()
        if attempt.latch.tripped:
            attempt.latch.prevented += len(batch)
            raise attempt.latch.error()
        outcomes = await attempt.persist(
            attempt.receipts.claim(
                batch, owner=attempt.owner, lease_id=attempt.lease_id, ttl_s=attempt.lease_ttl_s
            )
        )
        return [(outcome, started) for outcome in outcomes]
