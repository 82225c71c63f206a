"""Live mode: a claimed call goes over HTTP, through the governor, at most once paid.

:class:`PacedSender` sends one provider request: it waits for a governor permit,
checks that the attempt may still dispatch (lease held, persistence healthy),
sends with the ``Idempotency-Key`` derived from the receipt, reports the outcome
to the governor and retries transient failures (429s wait on the governor's
pause, other transient errors back off here). :class:`LiveDispatcher` settles a
claimed call with it and records the result; a tool with a bulk endpoint is
handed to :class:`~playline.calls.bulk.BulkDispatcher`, which uses the same
sender for its bulk requests.
"""

from __future__ import annotations

import asyncio
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
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
)
from playline.pacing.pacer import Pacer
from playline.stores.receipts import idempotency_key

__all__ = ["LiveDispatcher", "PacedSender", "RetryPolicy"]


@dataclass
class RetryPolicy:
    """Retries of transient provider errors inside one call (429s wait on the governor)."""

    max_attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0

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
    """Sends provider requests through the governor, retrying transient failures."""

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
        attempt = 0
        stats = self._attempt.stats
        metrics = self._attempt.metrics
        while True:
            attempt += 1
            asked = time.monotonic()
            async with self._pacer.permit([tool.provider]) as permit:
                metrics.governor_wait(tool.provider, time.monotonic() - asked)
                self._attempt.check_before_dispatch()
                started = time.monotonic()
                try:
                    data = await self.provider.send(
                        tool, payload, idempotency_key=idempotency_key, path=path
                    )
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
                    stats.made += 1
                    stats.credits += credits
                    metrics.credits(tool.provider, tool.id, credits)
                    return data
            self._observe(tool, _outcome(failure), started)
            if attempt >= self._retry.max_attempts:
                raise failure
            stats.retries += 1
            if not isinstance(failure, ProviderRateLimited):
                # 429s wait on the governor's pause; other transient errors back off here.
                await asyncio.sleep(max(self._retry.delay(attempt), failure.retry_after_s or 0.0))

    def _observe(self, tool: ToolSpec, outcome: str, started: float) -> None:
        metrics = self._attempt.metrics
        metrics.call(tool.provider, tool.id, outcome, time.monotonic() - started)
        metrics.rate(tool.provider, self._pacer.rate_in_force(tool.provider))


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
        if call.tool.batch is not None:
            return await self.bulk.settle(call)
        idem = idempotency_key(call.key, force=call.force, lease_id=self._attempt.lease_id)
        credits = call.tool.credits

        async def send() -> Any:
            return await self._sender.send(call.tool, call.payload, idem, credits=credits)

        return await self._attempt.record(call.key, send, credits=credits)
