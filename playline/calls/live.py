"""Live mode: a claimed call goes over HTTP, through the governor, at most once paid.

:class:`PacedSender` sends one provider request (:class:`Request`): it waits for a
governor permit, checks that the attempt may still dispatch (lease held and not about
to lapse, persistence healthy), marks the call *sent* in its receipt first when the
tool's provider does not de-duplicate, sends with the ``Idempotency-Key`` derived from
the receipt, reports the outcome and the provider's rate-limit headers to the governor,
and returns what became of it as a value (:mod:`~playline.calls.outcome`):

* a 429 is not a failure (nothing was charged): it waits on the governor's pause,
  and a provider that keeps refusing for longer than the attempt's ``park_after_s``
  parks the call (``Parked``: the row waits durably for the reset, it is not failed);
* a definitive failure (4xx, 503, a refused connection) is retried with backoff, a
  rejection (other 4xx) is ``Failed`` at once;
* an ambiguous one (sent, no definitive answer) is retried only for a tool whose
  provider de-duplicates (``key``) or does not charge twice (``natural``); for any
  other it is ``Ambiguous`` at once and never re-sent;
* a call the governor cannot admit within ``park_after_s`` is ``Parked`` unsent.

:class:`LiveDispatcher` settles a claimed call with it and records the outcome
(:func:`~playline.calls.settle.settle`); a tool with a bulk endpoint is handed to
:class:`~playline.calls.bulk.BulkDispatcher`, which uses the same sender.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from dataclasses import dataclass, field

from playline.calls.attempt import Attempt
from playline.calls.bulk import BulkDispatcher
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import ClaimedCall, Request, Settled
from playline.calls.http import Exchange, ProviderClient
from playline.calls.jobs import JobDispatcher
from playline.calls.outcome import Ambiguous, Answered, CallOutcome, Failed, Parked
from playline.calls.settle import SingleReceipt, settle
from playline.errors import (
    ProviderError,
    ProviderQuotaExhausted,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
    UnknownTool,
)
from playline.pacing.pacer import KeyBlocked, Pacer
from playline.stores.receipts import idempotency_key

__all__ = ["LiveDispatcher", "PacedSender", "Request", "RetryPolicy"]


#: Statuses that say "the same Idempotency-Key is still being processed": the answer
#: will be there once the earlier request ends, so they are waited out, not counted.
IN_FLIGHT_STATUSES = frozenset({409, 425})


@dataclass
class RetryPolicy:
    """Retries of transient provider errors inside one call (429s wait on the governor).

    A conflict (``409``/``425``: the same Idempotency-Key is still in flight, typically
    a request of a crashed or timed-out attempt) is not a failure of this request: the
    earlier one may run as long as the provider lets it, so conflicts are retried for
    ``conflict_patience`` times the tool's HTTP timeout instead of using up
    ``max_attempts`` in a few seconds.
    """

    max_attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    conflict_patience: float = 2.0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return random.uniform(ceiling / 2, ceiling)


def _outcome(err: ProviderError) -> str:
    if isinstance(err, ProviderRateLimited):
        return "rate_limited"
    if isinstance(err, ProviderTimeout):
        return "timeout"
    return "transient"


@dataclass(eq=False)  # a sender is one attempt's, compared by identity
class PacedSender:
    """Sends provider requests through the governor; see the module docstring.

    Each try takes a governor permit on the provider's pacing key and, for a
    provider with several API keys, on the key chosen for it (the one that can
    admit soonest, ties broken by a preference order derived from the
    idempotency key, so a retried call tends to go out under the same key).
    A 429 releases the choice (nothing was charged); any other failure keeps
    it, so a retry reuses the key its idempotency key was first sent with.
    """

    #: the chunk attempt whose leases, stats and metrics the requests go under
    attempt: Attempt
    #: the governor that admits each try
    pacer: Pacer
    #: the provider HTTP client that sends them
    provider: ProviderClient
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    async def send(self, request: Request) -> CallOutcome:
        """Send ``request`` (retrying what may be retried); what became of it."""
        tool = request.tool
        attempt = self.attempt
        failures = conflicts = 0  # conflicts are waited out, not counted as failures
        conflict_deadline: float | None = None
        limited_since: float | None = None
        stats = attempt.stats
        choices = _preference(self.provider.key_choices(tool), request.idempotency_key)
        chosen: tuple[str, str] | None = None
        timeout = self.provider.timeout_s(tool)
        while True:
            if choices and chosen is None:
                picked = self.pacer.pick([key for key, _ in choices])
                chosen = next(choice for choice in choices if choice[0] == picked)
            paced_as = request.pacing_key or tool.provider
            keys = [paced_as] if chosen is None else [paced_as, chosen[0]]
            started = time.monotonic()
            try:
                permit_cm = self.pacer.permit(keys, park_after_s=attempt.park_after_s)
                async with permit_cm as permit:
                    attempt.metrics.governor_wait(tool.provider, time.monotonic() - started)
                    attempt.check_before_dispatch(request.lease_keys, timeout_s=timeout)
                    if request.before_send is not None:
                        await request.before_send()
                    elif not tool.resend_safe:
                        await attempt.mark_sent(request.lease_keys)
                    started = time.monotonic()
                    try:
                        exchange = await self._exchange(request, chosen)
                        permit.observe(exchange.report)
                        data = exchange.result()
                    except ProviderRateLimited as err:
                        permit.record_rate_limited(err.retry_after_s)
                        failure: ProviderError = err
                        chosen = None  # not charged: any key may take the retry
                    except ProviderRejected as err:
                        permit.record_failure(time.monotonic() - started)
                        self._observe(tool, "rejected", started)
                        return Failed(err)
                    except ProviderError as err:
                        # Timed out or failed: the slot is given back as this block
                        # exits, and a retry waits for a permit like any call.
                        permit.record_failure(time.monotonic() - started)
                        failure = err
                    else:
                        permit.record_success(time.monotonic() - started)
                        self._observe(tool, "ok", started)
                        if not request.poll:
                            stats.made += 1
                        # Priced by the dispatcher, which knows the answer's shape.
                        return Answered(data, reported=exchange.charged)
            except KeyBlocked as blocked:
                self._observe(tool, "parked", time.monotonic())
                return Parked(
                    ProviderQuotaExhausted(tool.provider, blocked.until_wall, tool_id=tool.id)
                )
            self._observe(tool, _outcome(failure), started)
            if failure.may_have_charged and not tool.resend_safe:
                return Ambiguous(failure)
            now = time.monotonic()
            if isinstance(failure, ProviderRateLimited) and attempt.park_after_s is not None:
                # Not charged, and the provider will take it later: keep asking through
                # the governor's pause; one that keeps refusing parks the row.
                limited_since = limited_since or now
                if now - limited_since < attempt.park_after_s:
                    stats.retries += 1
                    continue
                wait = max(failure.retry_after_s or 0.0, self.retry.max_delay_s)
                return Parked(
                    ProviderQuotaExhausted(tool.provider, time.time() + wait, tool_id=tool.id)
                )
            if failure.status in IN_FLIGHT_STATUSES and tool.idempotency == "key":
                if conflict_deadline is None:
                    conflict_deadline = now + self.retry.conflict_patience * timeout
                if now < conflict_deadline:
                    conflicts += 1
                    stats.retries += 1
                    pause = max(self.retry.delay(conflicts), failure.retry_after_s or 0.0)
                    await asyncio.sleep(min(pause, conflict_deadline - now))
                    continue
            failures += 1
            if failures >= self.retry.max_attempts:
                return Failed(failure)
            stats.retries += 1
            if not isinstance(failure, ProviderRateLimited):
                # 429s wait on the governor's pause; other transient errors back off here.
                await asyncio.sleep(max(self.retry.delay(failures), failure.retry_after_s or 0.0))

    async def _exchange(self, request: Request, chosen: tuple[str, str] | None) -> Exchange:
        """One HTTP request, counted in the provider's account once it went out (or may
        have: a timeout or a cut connection in flight); one that never connected is not."""
        tool, attempt = request.tool, self.attempt
        try:
            exchange = await self.provider.exchange(
                tool,
                request.payload,
                idempotency_key=request.idempotency_key,
                path=request.path,
                key_env=None if chosen is None else chosen[1],
            )
        except ProviderError as err:
            if err.may_have_charged:
                attempt.stats.account(tool.provider).sent(replayed=False)
                attempt.metrics.request(tool.provider, tool.id, replayed=False)
            raise
        attempt.stats.account(tool.provider).sent(replayed=exchange.replayed)
        attempt.metrics.request(tool.provider, tool.id, replayed=exchange.replayed)
        return exchange

    def _observe(self, tool: ToolSpec, outcome: str, started: float) -> None:
        metrics = self.attempt.metrics
        metrics.call(tool.provider, tool.id, outcome, time.monotonic() - started)
        metrics.rate(tool.provider, self.pacer.rate_in_force(tool.provider))


def _preference(choices: list[tuple[str, str]], idempotency_key: str) -> list[tuple[str, str]]:
    """The keys in rendezvous-hash order for this call: stable across retries and workers."""

    def weight(choice: tuple[str, str]) -> bytes:
        return hashlib.sha256(f"{choice[0]}\x00{idempotency_key}".encode()).digest()

    return sorted(choices, key=weight)


class LiveDispatcher:
    """Settles claimed calls over HTTP; bulk-capable tools go through bulk requests.

    Args:
        attempt: the chunk attempt's shared state.
        sender: sends single and bulk requests through the governor.
    """

    def __init__(
        self, attempt: Attempt, sender: PacedSender, jobs: JobDispatcher | None = None
    ) -> None:
        self._attempt = attempt
        self._sender = sender
        self.bulk = BulkDispatcher(attempt, sender)
        #: asynchronous tools' calls (``job`` in the catalog); None: none can be called
        self.jobs = jobs

    def auth_scope(self, tool: ToolSpec) -> str:
        return self._sender.provider.auth_scope(tool)

    async def settle(self, call: ClaimedCall) -> Settled:
        """Send, record the outcome, return the answer and its cost (or raise the
        outcome's error)."""
        tool = call.tool
        if tool.batch is not None:
            return await self.bulk.settle(call)
        if tool.job is not None:
            if self.jobs is None:
                raise UnknownTool(
                    f"tool {tool.id!r} is asynchronous; this worker has no job ledger"
                )
            return await self.jobs.settle(call)
        request = Request(
            tool, call.payload, idempotency_key(call.key, call.generation), (call.key,)
        )
        outcome = await self._sender.send(request)
        if isinstance(outcome, Answered):
            charge = tool.charge(outcome.data, outcome.reported)
            outcome = Answered(outcome.data, charge.credits, charge.source)
        target = SingleReceipt(self._attempt, call.key, call.payer)
        return await settle(self._attempt, target, outcome, tool)

    async def aclose(self) -> None:
        """Let the bulk requests in flight finish and record (see ``BulkDispatcher``)."""
        await self.bulk.aclose()
        if self.jobs is not None:
            await self.jobs.aclose()

    def abort(self) -> None:
        """Cancel the bulk requests still queued or running (see ``BulkDispatcher``)."""
        self.bulk.abort()
        if self.jobs is not None:
            self.jobs.abort()
