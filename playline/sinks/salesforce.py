"""Salesforce sObjects as a destination: sObject Collections upsert by an External ID.

One batch is one ``PATCH /services/data/vXX.X/composite/sobjects/{sobject}/{field}``
of at most 200 records, ``{"allOrNone": false, "records": [{"attributes": {"type":
sobject}, field: <record id>, ...}]}``. Salesforce answers 200 with one result per
record, *in order*: ``success``, ``created``, ``id`` and ``errors`` (a record refused
does not stop the others); a malformed request is a 400 for the whole batch.

Limits: a rolling 24-hour allocation of API requests per org (reported in each
answer's ``Sforce-Limit-Info: api-usage=N/M``); spent, requests are refused with 403
``REQUEST_LIMIT_EXCEEDED``, which parks the sync
(:class:`~playline.sinks.destination.SinkParked`). Requests go through the governor
under the provider's pacing key. ``if_blank`` is not supported (a read by External
ID needs a SOQL query; not written yet): the spec refuses it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx

from playline.pacing.headers import parse_retry_after
from playline.pacing.pacer import KeyBlocked, Pacer
from playline.sinks.destination import (
    CREATED,
    REJECTED,
    UPDATED,
    RecordOutcome,
    SinkParked,
    SinkUnavailable,
)
from playline.sinks.plan import RecordPlan, cell_text
from playline.sinks.spec import SalesforceSinkSpec

__all__ = ["SalesforceDestination", "collection_body"]

#: The error code of a spent (or concurrent) request allocation.
LIMIT_EXCEEDED = "REQUEST_LIMIT_EXCEEDED"
TRANSIENT_TRIES = 4


def collection_body(spec: SalesforceSinkSpec, batch: Sequence[RecordPlan]) -> dict[str, Any]:
    """The sObject Collections upsert request for ``batch``."""
    return {
        "allOrNone": False,
        "records": [
            {
                "attributes": {"type": spec.sobject},
                **plan.writes,
                spec.external_id_field: plan.record,
            }
            for plan in batch
        ],
    }


class SalesforceDestination:
    """See the module docstring. ``token`` is sent, never logged nor stored."""

    def __init__(
        self,
        spec: SalesforceSinkSpec,
        *,
        base_url: str,
        token: str,
        http: httpx.AsyncClient,
        pacer: Pacer,
        pacing_key: str,
        timeout_s: float = 30.0,
        patience_s: float = 300.0,
    ) -> None:
        self.spec = spec
        self.max_batch = spec.max_batch
        self.scope = f"salesforce:{base_url}:{spec.sobject}:{spec.external_id_field}"
        self.requests = 0
        self._url = (
            f"{base_url.rstrip('/')}/services/data/{spec.api_version}/composite/sobjects/"
            f"{spec.sobject}/{spec.external_id_field}"
        )
        self._token = token
        self._http = http
        self._pacer = pacer
        self._key = pacing_key
        self._timeout_s = timeout_s
        self._patience_s = patience_s

    async def write(
        self, batch: Sequence[RecordPlan], *, resent: bool = False
    ) -> list[RecordOutcome]:
        """One upsert; ``resent`` changes nothing (an upsert by External ID writes the
        same record again, never a duplicate)."""
        status, answer = await self._send(collection_body(self.spec, batch))
        if status != 200 or not isinstance(answer, list) or len(answer) != len(batch):
            reason = _message(answer) or f"HTTP {status}"
            return [RecordOutcome(plan.record, REJECTED, reason=reason) for plan in batch]
        outcomes = []
        for plan, result in zip(batch, answer, strict=True):
            if isinstance(result, dict) and result.get("success"):
                outcomes.append(
                    RecordOutcome(
                        plan.record,
                        CREATED if result.get("created") else UPDATED,
                        object_id=str(result["id"]) if result.get("id") else None,
                        written={name: cell_text(value) for name, value in plan.writes.items()},
                    )
                )
            else:
                errors = result.get("errors") if isinstance(result, dict) else None
                outcomes.append(
                    RecordOutcome(plan.record, REJECTED, reason=_message(errors) or "rejected")
                )
        return outcomes

    async def _send(self, body: dict[str, Any]) -> tuple[int, Any]:
        deadline = time.monotonic() + self._patience_s
        failures = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            try:
                permit_context = self._pacer.permit([self._key], park_after_s=remaining)
                async with permit_context as permit:
                    started = time.monotonic()
                    self.requests += 1
                    try:
                        response = await self._http.patch(
                            self._url,
                            json=body,
                            headers={"Authorization": f"Bearer {self._token}"},
                            timeout=self._timeout_s,
                        )
                    except httpx.HTTPError as err:
                        permit.record_failure(time.monotonic() - started)
                        failures += 1
                        if failures >= TRANSIENT_TRIES:
                            raise SinkUnavailable(
                                f"Salesforce unreachable after {failures} tries: "
                                f"{type(err).__name__}"
                            ) from None
                        await asyncio.sleep(min(2.0**failures, 10.0))
                        continue
                    latency = time.monotonic() - started
                    answer = _json(response)
                    if response.status_code == 403 and _code(answer) == LIMIT_EXCEEDED:
                        permit.record_rate_limited(None)
                        raise SinkParked(
                            "Salesforce's API request allocation is spent (a rolling 24 "
                            "hours); sync again later"
                        )
                    if response.status_code == 429:
                        permit.record_rate_limited(
                            parse_retry_after(
                                response.headers.get("retry-after"), now_wall=time.time()
                            )
                        )
                        if time.monotonic() >= deadline:
                            raise SinkParked("Salesforce kept answering 429; sync again later")
                        continue
                    if response.status_code >= 500:
                        permit.record_failure(latency)
                        failures += 1
                        if failures >= TRANSIENT_TRIES:
                            return response.status_code, answer
                        await asyncio.sleep(min(2.0**failures, 10.0))
                        continue
                    permit.record_success(latency)
                    return response.status_code, answer
            except KeyBlocked as blocked:
                raise SinkParked(
                    f"Salesforce's pacing key {self._key} is blocked past the sync's patience",
                    until_wall=blocked.until_wall,
                ) from None

    async def close(self) -> None:
        return None


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _code(answer: Any) -> str | None:
    if isinstance(answer, list) and answer and isinstance(answer[0], dict):
        return answer[0].get("errorCode")
    return None


def _message(errors: Any) -> str | None:
    """The first error's message (Salesforce answers errors as a list)."""
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        first = errors[0]
        code = first.get("statusCode") or first.get("errorCode")
        text = str(first.get("message") or "")[:500]
        return f"{code}: {text}" if code else text or None
    return None
