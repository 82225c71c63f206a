"""One tool call, end to end: receipt, governor, provider, receipt.

A ``ToolRunner`` lives for one chunk attempt. For each call it

1. validates the input against the catalog and computes the receipt key;
2. shares the call with any identical call already in flight in this chunk
   (one provider request, many rows);
3. claims the receipt (claims arriving in the same event-loop tick go to the store
   as one bulk claim); a completed receipt is a hit and costs nothing, a receipt
   another live owner holds is waited on (bounded) and reused;
4. takes a governor permit (skipped in fixture mode unless pacing is enforced),
   checks that the lease is still held and that persistence has not failed, and
   sends the request with an ``Idempotency-Key`` derived from the receipt key;
5. records the result under the lease (fenced), or the failure.

While calls are unsettled, ``renew_leases`` (driven by the chunk's heartbeat)
renews every claimed receipt, including those still queued at the governor, and
raises ``LeaseLost`` if another owner has taken one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from playline.activities.batching import BatchDispatcher
from playline.activities.catalog import Catalog, ToolSpec
from playline.activities.fixtures import FixtureBook
from playline.activities.governor import Governor
from playline.activities.metrics import ProviderMetrics
from playline.activities.provider_http import ProviderClient
from playline.activities.receipts import (
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    ReceiptStore,
    idempotency_key,
    receipt_key,
)
from playline.errors import (
    FixtureMissing,
    LeaseLost,
    PersistenceCircuitOpen,
    PlaylineError,
    ProviderError,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
)

logger = logging.getLogger("playline.tools")


def _outcome(err: ProviderError) -> str:
    if isinstance(err, ProviderRateLimited):
        return "rate_limited"
    if isinstance(err, ProviderTimeout):
        return "timeout"
    return "transient"


IntegrationMode = Literal["live", "fixture"]


@dataclass
class CallStats:
    """What a chunk's tool calls cost; summed into the play's summary."""

    made: int = 0  # provider requests that produced a result (paid)
    cached: int = 0  # answered by a completed receipt (free)
    shared: int = 0  # answered by an identical call in flight in this chunk (free)
    waited: int = 0  # answered by another live owner's call (free)
    failed: int = 0
    retries: int = 0
    credits: float = 0.0

    def add(self, other: CallStats) -> None:
        for name in ("made", "cached", "shared", "waited", "failed", "retries"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.credits += other.credits


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer; ``get(name)`` reads a value through the catalog's getters."""

    tool: ToolSpec = field(repr=False)
    data: Any
    cached: bool

    def get(self, name: str, default: Any = None) -> Any:
        value = self.tool.get(self.data, name)
        return default if value is None else value

    def __getitem__(self, name: str) -> Any:
        return self.get(name)


@dataclass
class RetryPolicy:
    """Retries of transient provider errors inside one call (429s wait on the governor)."""

    max_attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return random.uniform(ceiling / 2, ceiling)


@dataclass
class PersistenceLatch:
    """Trips on the first failed receipt write; then no call is dispatched."""

    cause: str | None = None
    prevented: int = 0

    @property
    def tripped(self) -> bool:
        return self.cause is not None


class ToolRunner:
    """Runs the tool calls of one chunk attempt. See the module docstring."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        receipts: ReceiptStore,
        governor: Governor,
        provider: ProviderClient,
        owner: str,
        lease_id: str,
        lease_ttl_s: float,
        mode: IntegrationMode = "live",
        fixtures: FixtureBook | None = None,
        enforce_fixture_pacing: bool = False,
        retry: RetryPolicy | None = None,
        max_wait_s: float | None = None,
    ) -> None:
        self.catalog = catalog
        self.receipts = receipts
        self.governor = governor
        self.provider = provider
        self.owner = owner
        self.lease_id = lease_id
        self.lease_ttl_s = lease_ttl_s
        self.mode = mode
        self.fixtures = fixtures
        self.enforce_fixture_pacing = enforce_fixture_pacing
        self.retry = retry or RetryPolicy()
        self.max_wait_s = max_wait_s if max_wait_s is not None else 4 * lease_ttl_s
        self.stats = CallStats()
        self.metrics = ProviderMetrics()
        self.latch = PersistenceLatch()
        self.lease_lost: LeaseLost | None = None
        self._in_flight: dict[str, asyncio.Future[Any]] = {}
        self._unsettled: set[str] = set()
        self._claim_queue: list[tuple[ClaimRequest, asyncio.Future[ClaimOutcome]]] = []
        self._claim_flush_scheduled = False
        self.batches = BatchDispatcher(
            receipts=receipts,
            owner=owner,
            lease_id=lease_id,
            lease_ttl_s=lease_ttl_s,
            send=self._send_bulk,
            persist=self._persist,
            unsettled=self._unsettled,
        )

    # -- public -------------------------------------------------------------

    async def call(
        self,
        tool_id: str,
        tool_input: Mapping[str, Any],
        *,
        force: bool = False,
        stale_after_s: float | None = None,
    ) -> ToolResult:
        """Call a tool once per distinct input, however many rows ask for it."""
        tool = self.catalog.tool(tool_id)
        payload = tool.validate_input(tool_input)
        scope = "fixture" if self.mode == "fixture" else self.provider.auth_scope(tool)
        key = receipt_key(tool.id, tool.version, payload, scope)
        existing = self._in_flight.get(key)
        if existing is not None:
            self.stats.shared += 1
            data, _ = await asyncio.shield(existing)
            return ToolResult(tool, data, cached=True)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            data, cached = await self._lead(tool, payload, key, force, stale_after_s)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # followers may be absent; mark it retrieved
            raise
        future.set_result((data, cached))
        return ToolResult(tool, data, cached=cached)

    def unsettled_keys(self) -> list[str]:
        return sorted(self._unsettled)

    async def renew_leases(self) -> None:
        """Renew every unsettled claim; record ``LeaseLost`` if one was taken over."""
        keys = self.unsettled_keys()
        if not keys:
            return
        owned = await self.receipts.renew(keys, lease_id=self.lease_id, ttl_s=self.lease_ttl_s)
        for key, still_owned in zip(keys, owned, strict=True):
            # A call that settled while the renewal was in flight no longer needs
            # its lease; only a still-unsettled key counts as lost.
            if not still_owned and key in self._unsettled and self.lease_lost is None:
                self.lease_lost = LeaseLost(
                    f"receipt {key} is now held by another owner; this chunk attempt "
                    "stops dispatching and Temporal will retry it"
                )

    # -- internals ----------------------------------------------------------

    async def _lead(
        self, tool: ToolSpec, payload: dict[str, Any], key: str, force: bool, stale: float | None
    ) -> tuple[Any, bool]:
        request = ClaimRequest(key=key, tool_id=tool.id, force=force, stale_after_s=stale)
        outcome = await self._claim(request)
        waited_since = time.monotonic()
        while outcome.status is ClaimStatus.HELD:
            if time.monotonic() - waited_since > self.max_wait_s:
                raise LeaseLost(
                    f"receipt {key} stayed held by {outcome.owner} for over "
                    f"{self.max_wait_s:g}s; retrying the chunk later"
                )
            await asyncio.sleep(0.1 + random.random() * 0.2)
            receipt = (await self.receipts.get([key])).get(key)
            if receipt is not None and receipt.status == "completed" and not force:
                self.stats.waited += 1
                return receipt.result, True
            outcome = await self._claim(request)
        if outcome.status is ClaimStatus.HIT:
            self.stats.cached += 1
            return outcome.result, True

        if tool.batch is not None and self.mode == "live":
            return await self._lead_batched(tool, payload, key, outcome.batch_key), False
        self._unsettled.add(key)
        try:
            try:
                data = await self._dispatch(tool, payload, key, force)
            except (ProviderError, FixtureMissing) as err:
                self.stats.failed += 1
                await self._persist(self.receipts.fail(key, lease_id=self.lease_id, error=str(err)))
                raise
            recorded = await self._persist(
                self.receipts.complete(
                    key, lease_id=self.lease_id, result=data, credits=self._credits(tool)
                )
            )
            if not recorded:
                raise LeaseLost(f"receipt {key} was taken over before its result was recorded")
            return data, False
        finally:
            self._unsettled.discard(key)

    async def _lead_batched(
        self, tool: ToolSpec, payload: dict[str, Any], key: str, batch_key: str | None
    ) -> Any:
        """A claimed call of a bulk tool: joins a new batch, or finishes its old one."""
        self._unsettled.add(key)
        try:
            if batch_key is not None:
                return await self.batches.resume(tool, batch_key, key)
            return await self.batches.submit(tool, key, payload)
        except (ProviderError, FixtureMissing):
            self.stats.failed += 1
            raise
        finally:
            self._unsettled.discard(key)

    async def _send_bulk(self, tool: ToolSpec, request: dict[str, Any], idem: str) -> Any:
        assert tool.batch is not None
        members = len(request.get(tool.batch.items_field, []))
        return await self._send(
            tool, request, idem, path=tool.batch.path, credits=tool.credits * members
        )

    def _credits(self, tool: ToolSpec) -> float:
        return 0.0 if self.mode == "fixture" else tool.credits

    async def _persist(self, write: Any) -> Any:
        """Run a store write; a failure trips the latch so nothing more is dispatched."""
        try:
            return await write
        except PlaylineError:
            raise
        except Exception as err:
            if self.latch.cause is None:
                self.latch.cause = f"{type(err).__name__}: {err}"
                logger.error(
                    "receipt write failed; no further provider calls in this chunk: %s", err
                )
            raise PersistenceCircuitOpen(self.latch.cause, self.latch.prevented) from err

    def _check_before_dispatch(self) -> None:
        if self.lease_lost is not None:
            raise self.lease_lost
        if self.latch.tripped:
            self.latch.prevented += 1
            raise PersistenceCircuitOpen(self.latch.cause or "", self.latch.prevented)

    async def _dispatch(
        self, tool: ToolSpec, payload: dict[str, Any], key: str, force: bool
    ) -> Any:
        if self.mode == "fixture":
            if self.enforce_fixture_pacing:
                async with self.governor.permit([tool.provider]) as permit:
                    self._check_before_dispatch()
                    permit.record_success(0.0)
            else:
                self._check_before_dispatch()
            assert self.fixtures is not None, "fixture mode needs a fixture book"
            data = self.fixtures.resolve(tool.id, payload)
            self.stats.made += 1
            self.metrics.call(tool.provider, tool.id, "fixture")
            return data

        idem = idempotency_key(key, force=force, lease_id=self.lease_id)
        return await self._send(tool, payload, idem, credits=tool.credits)

    async def _send(
        self,
        tool: ToolSpec,
        payload: dict[str, Any],
        idem: str,
        *,
        credits: float,
        path: str | None = None,
    ) -> Any:
        """One provider request through the governor, retrying transient failures."""
        attempt = 0
        while True:
            attempt += 1
            async with self.governor.permit([tool.provider]) as permit:
                self._check_before_dispatch()
                started = time.monotonic()
                try:
                    data = await self.provider.send(tool, payload, idempotency_key=idem, path=path)
                except ProviderRateLimited as err:
                    permit.record_rate_limited(err.retry_after_s)
                    failure: ProviderError = err
                except ProviderRejected:
                    permit.record_failure()
                    self._observe(tool, "rejected", started)
                    raise
                except ProviderError as err:
                    permit.record_failure()
                    failure = err
                else:
                    permit.record_success(time.monotonic() - started)
                    self._observe(tool, "ok", started)
                    self.stats.made += 1
                    self.stats.credits += credits
                    return data
            self._observe(tool, _outcome(failure), started)
            if attempt >= self.retry.max_attempts:
                raise failure
            self.stats.retries += 1
            if not isinstance(failure, ProviderRateLimited):
                # 429s wait on the governor's pause; other transient errors back off here.
                await asyncio.sleep(max(self.retry.delay(attempt), failure.retry_after_s or 0.0))

    def _observe(self, tool: ToolSpec, outcome: str, started: float) -> None:
        self.metrics.call(tool.provider, tool.id, outcome, time.monotonic() - started)
        state = self.governor.snapshot().get(tool.provider, {})
        self.metrics.rate(tool.provider, state.get("rate_rps"))

    async def _claim(self, request: ClaimRequest) -> ClaimOutcome:
        """Queue a claim; claims queued in one loop tick go to the store together."""
        future: asyncio.Future[ClaimOutcome] = asyncio.get_running_loop().create_future()
        self._claim_queue.append((request, future))
        if not self._claim_flush_scheduled:
            self._claim_flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_claim_flush)
        return await future

    def _start_claim_flush(self) -> None:
        self._claim_flush_scheduled = False
        batch, self._claim_queue = self._claim_queue, []
        task = asyncio.ensure_future(self._flush_claims(batch))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _flush_claims(
        self, batch: list[tuple[ClaimRequest, asyncio.Future[ClaimOutcome]]]
    ) -> None:
        try:
            if self.latch.tripped:
                raise PersistenceCircuitOpen(self.latch.cause or "", self.latch.prevented)
            outcomes = await self._persist(
                self.receipts.claim(
                    [r for r, _ in batch],
                    owner=self.owner,
                    lease_id=self.lease_id,
                    ttl_s=self.lease_ttl_s,
                )
            )
        except BaseException as err:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(err)
            return
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            if not fut.done():
                fut.set_result(outcome)
