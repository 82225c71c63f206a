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

from collections.abc import Sequence
from typing import Any

from playline.sinks.crm import CrmDestination
from playline.sinks.destination import CREATED, REJECTED, UPDATED, RecordOutcome
from playline.sinks.plan import RecordPlan, cell_text
from playline.sinks.spec import SalesforceSinkSpec

__all__ = ["SalesforceDestination", "collection_body"]

#: The error code of a spent (or concurrent) request allocation.
LIMIT_EXCEEDED = "REQUEST_LIMIT_EXCEEDED"


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


class SalesforceDestination(CrmDestination[SalesforceSinkSpec]):
    """See the module docstring."""

    service = "Salesforce"

    def _scope(self, base_url: str) -> str:
        return f"salesforce:{base_url}:{self.spec.sobject}:{self.spec.external_id_field}"

    def _spent(self, status: int, answer: Any) -> str | None:
        if status == 403 and _code(answer) == LIMIT_EXCEEDED:
            return (
                "Salesforce's API request allocation is spent (a rolling 24 hours); "
                "sync again later"
            )
        return None

    async def write(
        self, batch: Sequence[RecordPlan], *, resent: bool = False
    ) -> list[RecordOutcome]:
        """One upsert; ``resent`` changes nothing (an upsert by External ID writes the
        same record again, never a duplicate)."""
        path = (
            f"/services/data/{self.spec.api_version}/composite/sobjects/"
            f"{self.spec.sobject}/{self.spec.external_id_field}"
        )
        status, answer = await self._send("PATCH", path, collection_body(self.spec, batch))
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
