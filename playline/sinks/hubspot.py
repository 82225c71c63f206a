"""HubSpot CRM objects as a destination: batch upsert by a unique property.

One batch is one ``POST /crm/v3/objects/{objectType}/batch/upsert`` of at most 100
inputs, ``{"id": <unique value>, "idProperty": ..., "properties": {...},
"objectWriteTraceId": <position>}``. HubSpot answers 200 (every input written) or
207 (multi-status: ``results`` for the records written, ``errors`` for the others);
each result and error is mapped back to its record by ``objectWriteTraceId`` (an
error's ``context``), else by the unique value. ``new`` tells created from updated.

A batch a killed sync had sent (``resent``) is read back first: the records that
already hold its values are not written twice.

Fields with the ``if_blank`` policy are read first (``POST .../batch/read`` by the
same ``idProperty``): a field the record already holds is left alone (``kept``).

Every request goes through the governor under the provider's pacing key, as tool
calls do; the ``X-HubSpot-RateLimit-*`` headers (the 10 s window) are reported to it.
A 429 is waited out (``Retry-After``, else the governor's backoff) until the sync's
patience is spent; a 429 for the *daily* limit (``policyName`` ``DAILY``) parks the
sync at once: :class:`~playline.sinks.destination.SinkParked`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from playline.errors import PlaylineError
from playline.pacing.headers import QuotaReport, RateLimitReport, parse_retry_after
from playline.sinks.crm import CrmDestination
from playline.sinks.destination import CREATED, KEPT, REJECTED, UPDATED, RecordOutcome
from playline.sinks.plan import RecordPlan, cell_text
from playline.sinks.spec import HubSpotSinkSpec

__all__ = ["HubSpotDestination", "hubspot_rate_report", "read_body", "upsert_body"]

#: A 429's ``policyName`` when the account's daily limit is spent.
DAILY_POLICY = "DAILY"


def upsert_body(
    spec: HubSpotSinkSpec, batch: Sequence[tuple[str, Mapping[str, Any]]]
) -> dict[str, Any]:
    """The batch upsert request: one input per ``(record, properties)``, traced by position."""
    return {
        "inputs": [
            {
                "id": record,
                "idProperty": spec.id_property,
                "objectWriteTraceId": str(position),
                "properties": {name: cell_text(value) or "" for name, value in properties.items()},
            }
            for position, (record, properties) in enumerate(batch)
        ]
    }


def read_body(
    spec: HubSpotSinkSpec, records: Sequence[str], fields: Sequence[str]
) -> dict[str, Any]:
    """The batch read request for the ``if_blank`` fields of ``records``."""
    return {
        "idProperty": spec.id_property,
        "inputs": [{"id": record} for record in records],
        "properties": sorted({*fields, spec.id_property}),
        "propertiesWithHistory": [],
    }


def hubspot_rate_report(headers: Mapping[str, str], *, now_wall: float) -> RateLimitReport:
    """The governor's view of HubSpot's headers: the rolling window (usually 10 s)
    as a quota, and ``Retry-After`` when sent."""
    quotas: list[QuotaReport] = []
    limit = _number(headers.get("x-hubspot-ratelimit-max"))
    remaining = _number(headers.get("x-hubspot-ratelimit-remaining"))
    interval_ms = _number(headers.get("x-hubspot-ratelimit-interval-milliseconds"))
    if remaining is not None and interval_ms is not None and interval_ms > 0:
        window = interval_ms / 1000
        quotas.append(QuotaReport("hubspot-window", limit, remaining, window, window))
    retry = parse_retry_after(headers.get("retry-after"), now_wall=now_wall)
    return RateLimitReport(tuple(quotas), retry)


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class HubSpotDestination(CrmDestination[HubSpotSinkSpec]):
    """See the module docstring."""

    service = "HubSpot"

    def _scope(self, base_url: str) -> str:
        return f"hubspot:{base_url}:{self.spec.object_type}:{self.spec.id_property}"

    def _rate_report(self, headers: Mapping[str, str]) -> RateLimitReport:
        return hubspot_rate_report(headers, now_wall=time.time())

    def _spent(self, status: int, answer: Any) -> str | None:
        if status == 429 and isinstance(answer, dict) and answer.get("policyName") == DAILY_POLICY:
            return (
                "HubSpot's daily API limit is spent; sync again after it resets "
                "(midnight in the account's time zone)"
            )
        return None

    async def write(
        self, batch: Sequence[RecordPlan], *, resent: bool = False
    ) -> list[RecordOutcome]:
        """See the module docstring. ``resent``: a killed sync sent this batch without
        recording the answer; every record is read back first and one that already
        holds the batch's values is not written again."""
        current = await self._read(batch, every_field=resent)
        outcomes: dict[int, RecordOutcome] = {}
        sent: list[tuple[int, RecordPlan, dict[str, Any], dict[str, str | None]]] = []
        for position, plan in enumerate(batch):
            held = current.get(plan.record.casefold(), {})
            if (
                resent
                and held
                and all(
                    cell_text(held.get(name)) == cell_text(value)
                    for name, value in plan.writes.items()
                    if name not in plan.if_blank
                )
            ):
                written = {
                    n: cell_text(v) for n, v in plan.writes.items() if n not in plan.if_blank
                }
                outcomes[position] = RecordOutcome(
                    plan.record,
                    UPDATED,
                    written=written,
                    kept={n: cell_text(v) for n, v in plan.writes.items() if n in plan.if_blank},
                )
                continue
            properties: dict[str, Any] = {}
            kept: dict[str, str | None] = {}
            for name, value in plan.writes.items():
                if name in plan.if_blank and cell_text(held.get(name)) is not None:
                    kept[name] = cell_text(value)
                else:
                    properties[name] = value
            if properties:
                sent.append((position, plan, properties, kept))
            else:
                outcomes[position] = RecordOutcome(plan.record, KEPT, kept=kept)
        if sent:
            body = upsert_body(self.spec, [(plan.record, props) for _, plan, props, _ in sent])
            status, answer = await self._send(
                "POST", f"/crm/v3/objects/{self.spec.object_type}/batch/upsert", body
            )
            for index, outcome in enumerate(self._map_upsert(status, answer, sent)):
                outcomes[sent[index][0]] = outcome
        return [outcomes[position] for position in range(len(batch))]

    def _map_upsert(
        self,
        status: int,
        answer: Any,
        sent: Sequence[tuple[int, RecordPlan, dict[str, Any], dict[str, str | None]]],
    ) -> list[RecordOutcome]:
        if status not in (200, 207) or not isinstance(answer, dict):
            reason = _message(answer) or f"HTTP {status}"
            return [RecordOutcome(plan.record, REJECTED, reason=reason) for _, plan, _, _ in sent]
        by_trace: dict[str, dict[str, Any]] = {}
        by_value: dict[str, dict[str, Any]] = {}
        for result in answer.get("results") or []:
            if isinstance(result, dict):
                trace = result.get("objectWriteTraceId")
                if trace is not None:
                    by_trace[str(trace)] = result
                value = (result.get("properties") or {}).get(self.spec.id_property)
                if value is not None:
                    by_value[str(value).casefold()] = result
        errors: dict[str, str] = {}
        for error in answer.get("errors") or []:
            if not isinstance(error, dict):
                continue
            context = error.get("context") or {}
            for name in ("objectWriteTraceId", "ids", "id"):
                for item in context.get(name) or []:
                    errors.setdefault(str(item), _message(error) or "rejected")
        outcomes = []
        for index, (_, plan, properties, kept) in enumerate(sent):
            result = by_trace.get(str(index)) or by_value.get(plan.record.casefold())
            written = {name: cell_text(value) for name, value in properties.items()}
            if result is not None:
                outcomes.append(
                    RecordOutcome(
                        plan.record,
                        CREATED if result.get("new") else UPDATED,
                        object_id=str(result.get("id")) if result.get("id") is not None else None,
                        written=written,
                        kept=kept,
                    )
                )
            else:
                reason = (
                    errors.get(str(index))
                    or errors.get(plan.record)
                    or ("no result for this record in HubSpot's answer")
                )
                outcomes.append(RecordOutcome(plan.record, REJECTED, reason=reason))
        return outcomes

    async def _read(
        self, batch: Sequence[RecordPlan], *, every_field: bool
    ) -> dict[str, dict[str, Any]]:
        """``{record (casefolded): properties}`` of the records with ``if_blank`` fields
        (``every_field``: of every record, with every field the batch writes)."""
        asking = [plan for plan in batch if plan.if_blank or every_field]
        if not asking:
            return {}
        fields = sorted(
            {name for plan in asking for name in (plan.writes if every_field else plan.if_blank)}
        )
        body = read_body(self.spec, [plan.record for plan in asking], fields)
        status, answer = await self._send(
            "POST", f"/crm/v3/objects/{self.spec.object_type}/batch/read", body
        )
        if status not in (200, 207) or not isinstance(answer, dict):
            raise PlaylineError(
                f"HubSpot refused to read {self.spec.object_type} for if_blank fields: "
                f"{_message(answer) or f'HTTP {status}'}"
            )
        found: dict[str, dict[str, Any]] = {}
        for result in answer.get("results") or []:
            properties = (result or {}).get("properties") or {}
            value = properties.get(self.spec.id_property)
            if value is not None:
                found[str(value).casefold()] = properties
        return found


def _message(answer: Any) -> str | None:
    if isinstance(answer, dict) and isinstance(answer.get("message"), str):
        return str(answer["message"])[:500]
    return None
