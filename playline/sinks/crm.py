"""What every CRM destination reached over HTTP shares: the connection, and one
request sent through the governor until it has an answer or the sync must stop.

HubSpot and Salesforce differ in their requests and answers, not in how a request
goes out: it waits for a permit under the provider's pacing key (a key blocked past
the sync's patience parks the sync); a connection failure or a 5xx is tried again
(:data:`TRANSIENT_TRIES` in all, with a growing pause); a 429 is waited out until the
patience is spent, then parks the sync; an answer saying the account's allocation
is spent (each CRM says it its own way: :meth:`CrmDestination._spent`) parks it at
once. A subclass names itself (:attr:`~CrmDestination.service`), its receipt scope
and, if its CRM reports its limits in headers, how the governor reads them.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import httpx

from playline.pacing.headers import RateLimitReport, parse_retry_after
from playline.pacing.pacer import KeyBlocked, Pacer
from playline.sinks.destination import RecordOutcome, SinkParked, SinkUnavailable
from playline.sinks.plan import RecordPlan
from playline.sinks.spec import HubSpotSinkSpec, SalesforceSinkSpec

__all__ = ["TRANSIENT_TRIES", "CrmDestination", "response_json"]

#: Transient failures (5xx, the connection) tried before the batch is given up.
TRANSIENT_TRIES = 4

SpecT = TypeVar("SpecT", HubSpotSinkSpec, SalesforceSinkSpec)


class CrmDestination(ABC, Generic[SpecT]):
    """A CRM destination's connection and paced requests; ``token`` is sent, never
    logged nor stored. Subclasses write batches (``write``) with :meth:`_send`."""

    #: the CRM's name in messages ("HubSpot")
    service: ClassVar[str]

    def __init__(
        self,
        spec: SpecT,
        *,
        base_url: str,
        token: str,
        http: httpx.AsyncClient,
        pacer: Pacer,
        pacing_key: str,
        timeout_s: float = 30.0,
        patience_s: float = 300.0,
    ) -> None:
        self.spec: SpecT = spec
        self.max_batch = spec.max_batch
        self.scope = self._scope(base_url)
        #: requests sent so far (the summary reports them)
        self.requests = 0
        self._base_url = base_url.rstrip("/")
        self._token = token
        self._http = http
        self._pacer = pacer
        self._key = pacing_key
        self._timeout_s = timeout_s
        self._patience_s = patience_s

    @abstractmethod
    async def write(
        self, batch: Sequence[RecordPlan], *, resent: bool = False
    ) -> list[RecordOutcome]:
        """See :meth:`~playline.sinks.destination.Destination.write`."""

    @abstractmethod
    def _scope(self, base_url: str) -> str:
        """The batches' receipt scope: the account and the object written (no secret)."""

    def _rate_report(self, headers: Mapping[str, str]) -> RateLimitReport | None:
        """What the answer's headers say of the CRM's limits (none by default)."""
        return None

    def _spent(self, status: int, answer: Any) -> str | None:
        """Why the sync parks at once, when ``answer`` says the account's request
        allocation is spent (waiting for it would outlast any patience)."""
        return None

    async def _send(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """One request through the governor (see the module docstring); the final
        status and JSON body."""
        try:
            return await self._paced(method, self._base_url + path, body)
        except KeyBlocked as blocked:
            raise SinkParked(
                f"{self.service}'s pacing key {self._key} is blocked past the sync's "
                "patience; sync again later",
                until_wall=blocked.until_wall,
            ) from None

    async def _paced(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        deadline = time.monotonic() + self._patience_s
        failures = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            async with self._pacer.permit([self._key], park_after_s=remaining) as permit:
                started = time.monotonic()
                self.requests += 1
                try:
                    response = await self._http.request(
                        method,
                        url,
                        json=body,
                        headers={"Authorization": f"Bearer {self._token}"},
                        timeout=self._timeout_s,
                    )
                except httpx.HTTPError as err:
                    permit.record_failure(time.monotonic() - started)
                    failures += 1
                    if failures >= TRANSIENT_TRIES:
                        raise SinkUnavailable(
                            f"{self.service} unreachable after {failures} tries: "
                            f"{type(err).__name__}"
                        ) from None
                    await asyncio.sleep(_pause(failures))
                    continue
                latency = time.monotonic() - started
                permit.observe(self._rate_report(response.headers))
                answer = response_json(response)
                status = response.status_code
                retry_after = (
                    parse_retry_after(response.headers.get("retry-after"), now_wall=time.time())
                    if status == 429
                    else None
                )
                spent = self._spent(status, answer)
                if spent is not None:
                    permit.record_rate_limited(retry_after)
                    raise SinkParked(spent)
                if status == 429:
                    permit.record_rate_limited(retry_after)
                    if time.monotonic() >= deadline:
                        raise SinkParked(
                            f"{self.service} kept answering 429 for {self._patience_s:.0f} s; "
                            "sync again later"
                        )
                    continue
                if status >= 500:
                    permit.record_failure(latency)
                    failures += 1
                    if failures >= TRANSIENT_TRIES:
                        return status, answer
                    await asyncio.sleep(_pause(failures))
                    continue
                permit.record_success(latency)
                return status, answer

    async def close(self) -> None:
        """Nothing of its own to close: ``http`` and ``pacer`` are the caller's."""
        return None


def _pause(failures: int) -> float:
    """Seconds to wait before trying again after ``failures`` transient failures."""
    return min(2.0**failures, 10.0)


def response_json(response: httpx.Response) -> Any:
    """The answer's JSON body; ``None`` when it has none (an HTML error page)."""
    try:
        return response.json()
    except ValueError:
        return None
