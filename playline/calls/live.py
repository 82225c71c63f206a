"""Live mode: a claimed call goes over HTTP, through the governor, at most once paid.

:class:`PacedSender` sends one provider request: it waits for a governor permit,
checks that the attempt may still dispatch (lease held, persistence healthy),
sends with the ``Idempotency-Key`` derived from the receipt, reports the outcome
and the provider's rate-limit headers to the governor and retries transient
failures (429s wait on the governor's pause, other transient errors back off
here). A call the governor cannot admit within the attempt's ``park_after_s``
raises ``ProviderQuotaExhausted`` without being sent, and its receipt is
released for a later attempt. :class:`LiveDispatcher` settles a
claimed call with it and records the result; a tool with a bulk endpoint is
handed to :class:`~playline.calls.bulk.BulkDispatcher`, which uses the same
sender for its bulk requests.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from dataclasses import dataclass
from typing import Any

from playline.calls.attempt import Attempt
from playline.calls.bulk import BulkDispatcher
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import ClaimedCall
from playline.calls.http import ProviderClient
from playline.errors import (
    ProviderError,
    ProviderQuotaExhausted,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
)
from playline.pacing.pacer import KeyBlocked, Pacer
from playline.stores.receipts import idempotency_key

__all__ = ["LiveDispatcher", "PacedSender", "RetryPolicy"]


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


class PacedSender:
    """Sends provider requests through the governor, retrying transient failures.

    Each try takes a governor permit on the provider's pacing key and, for a
    provider with several API keys, on the key chosen for it (the one that can
    admit soonest, ties broken by a preference order derived from the
    idempotency key, so a retried call tends to go out under the same key).
    A 429 releases the choice (nothing was charged); any other failure keeps
    it, so a retry reuses the key its idempotency key was first sent with.

    When the governor knows the key cannot admit the call within the attempt's
    ``park_after_s``, :meth:`send` raises ``ProviderQuotaExhausted`` without
    dispatching anything.
    """

    def __init__(
        self,
        attempt: Attempt,
        pacer: Pacer,
        provider: ProviderClient,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._attempt = attempt
        self._pacer = pacer
        self.provider = provider
        self._retry = retry or RetryPolicy()

    async def send(
        self,
        tool: ToolSpec,
        payload: dict[str, Any],
        idempotency_key: str,
        *,
        credits: float,
        path: str | None = None,
    ) -> Any:
        """One paid request (``credits`` on success); its JSON body or a typed error."""
        failures = conflicts = 0  # conflicts are waited out, not counted as failures
        conflict_deadline: float | None = None
        stats = self._attempt.stats
        metrics = self._attempt.metrics
        choices = _preference(self.provider.key_choices(tool), idempotency_key)
        chosen: tuple[str, str] | None = None
        while True:
            if choices and chosen is None:
                picked = self._pacer.pick([key for key, _ in choices])
                chosen = next(choice for choice in choices if choice[0] == picked)
            keys = [tool.provider] if chosen is None else [tool.provider, chosen[0]]
            try:
                asked = time.monotonic()
                permit_cm = self._pacer.permit(keys, park_after_s=self._attempt.park_after_s)
                async with permit_cm as permit:
                    metrics.governor_wait(tool.provider, time.monotonic() - asked)
                    self._attempt.check_before_dispatch()
                    started = time.monotonic()
                    try:
                        exchange = await self.provider.exchange(
                            tool,
                            payload,
                            idempotency_key=idempotency_key,
                            path=path,
                            key_env=None if chosen is None else chosen[1],
                        )
                        permit.observe(exchange.report)
                        data = exchange.result()
                    except ProviderRateLimited as err:
                        permit.record_rate_limited(err.retry_after_s)
                        failure: ProviderError = err
                        chosen = None  # not charged: any key may take the retry
                    except ProviderRejected:
                        permit.record_failure(time.monotonic() - started)
                        self._observe(tool, "rejected", started)
                        raise
                    except ProviderError as err:
                        # Timed out or failed: the slot is given back as this block
                        # exits, and the retry waits for a permit like any call.
                        permit.record_failure(time.monotonic() - started)
                        failure = err
                    else:
                        permit.record_success(time.monotonic() - started)
                        self._observe(tool, "ok", started)
                        stats.made += 1
                        stats.credits += credits
                        metrics.credits(tool.provider, tool.id, credits)
                        return data
            except KeyBlocked as blocked:
                self._observe(tool, "parked", time.monotonic())
                raise ProviderQuotaExhausted(
                    tool.provider, blocked.until_wall, tool_id=tool.id
                ) from None
            self._observe(tool, _outcome(failure), started)
            if failure.status in IN_FLIGHT_STATUSES:
                now = time.monotonic()
                if conflict_deadline is None:
                    patience = self._retry.conflict_patience * self.provider.timeout_s(tool)
                    conflict_deadline = now + patience
                if now < conflict_deadline:
                    conflicts += 1
                    stats.retries += 1
                    pause = max(self._retry.delay(conflicts), failure.retry_after_s or 0.0)
                    await asyncio.sleep(min(pause, conflict_deadline - now))
                    continue
            failures += 1
            if failures >= self._retry.max_attempts:
                raise failure
            stats.retries += 1
            if not isinstance(failure, ProviderRateLimited):
                # 429s wait on the governor's pause; other transient errors back off here.
                await asyncio.sleep(max(self._retry.delay(failures), failure.retry_after_s or 0.0))

    def _observe(self, tool: ToolSpec, outcome: str, started: float) -> None:
        metrics = self._attempt.metrics
        metrics.call(tool.provider, tool.id, outcome, time.monotonic() - started)
        metrics.rate(tool.provider, self._pacer.rate_in_force(tool.provider))


def _preference(choices: list[tuple[str, str]], idempotency_key: str) -> list[tuple[str, str]]:
    """The keys in rendezvous-hash order for this call: stable across retries and workers."""

    def weight(choice: tuple[str, str]) -> bytes:
        return hashlib.sha256(f"{choice[0]}\x00{idempotency_key}".encode()).digest()

    return sorted(choices, key=weight)


class _Parked(Exception):
    """Carries ``ProviderQuotaExhausted`` past ``Attempt.record``, which would fail the receipt."""

    def __init__(self, error: ProviderQuotaExhausted) -> None:
        super().__init__(str(error))
        self.error = error


class LiveDispatcher:
    """Settles claimed calls over HTTP; bulk-capable tools go through bulk requests.

    Args:
        attempt: the chunk attempt's shared state.
        sender: sends single and bulk requests through the governor.
    """

    def __init__(self, attempt: Attempt, sender: PacedSender) -> None:
        self._attempt = attempt
        self._sender = sender
        self.bulk = BulkDispatcher(attempt, sender)

    def auth_scope(self, tool: ToolSpec) -> str:
        return self._sender.provider.auth_scope(tool)

    async def settle(self, call: ClaimedCall) -> Any:
        """Send, record, return; a parked call's receipt is released, not failed.

        ``ProviderQuotaExhausted`` means nothing was dispatched: the claim is
        released so the next attempt (after the caller's durable wait) claims
        it cleanly, and the error is re-raised for the caller to park on.
        """
        if call.tool.batch is not None:
            return await self.bulk.settle(call)
        attempt = self._attempt
        idem = idempotency_key(call.key, force=call.force, lease_id=attempt.lease_id)
        credits = call.tool.credits

        async def send() -> Any:
            try:
                return await self._sender.send(call.tool, call.payload, idem, credits=credits)
            except ProviderQuotaExhausted as err:
                raise _Parked(err) from None

        try:
            return await attempt.record(call.key, send, credits=credits)
        except _Parked as parked:
            await attempt.persist(attempt.receipts.release([call.key], lease_id=attempt.lease_id))
            raise parked.error from None
