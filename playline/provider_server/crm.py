"""The provider server's CRM mode: a HubSpot-shaped CRM objects API, for sink tests.

Under ``/hubspot`` (point ``$HUBSPOT_BASE_URL`` at ``<server>/hubspot``):

* ``POST /crm/v3/objects/{objectType}/batch/upsert``: 1 to 100 inputs ``{"id",
  "idProperty", "properties", "objectWriteTraceId"}``; each input creates or updates the
  record whose ``idProperty`` holds ``id`` (case-insensitively, as HubSpot's emails);
  200 when every input is written, 207 with ``errors`` (each naming its
  ``objectWriteTraceId`` in ``context``) when some are refused (``reject_ids``);
* ``POST /crm/v3/objects/{objectType}/batch/read`` by ``idProperty``: the records found,
  with the ``properties`` asked for.

Under ``/salesforce`` (point ``$SALESFORCE_INSTANCE_URL`` at ``<server>/salesforce``):
``PATCH /services/data/{version}/composite/sobjects/{sobject}/{field}``, Salesforce's
sObject Collections upsert by an External ID: 1 to 200 records, one result per record in
order (``success``, ``created``, ``id``, ``errors``), ``reject_ids`` refused with
``FIELD_CUSTOM_VALIDATION_EXCEPTION``; the day's allocation spent is a 403
``REQUEST_LIMIT_EXCEEDED``; ``Sforce-Limit-Info: api-usage=N/M`` on every answer. Its
records are kept under ``salesforce:<sobject>``.

All need ``Authorization: Bearer <any token>`` (401 without) and are limited as
HubSpot documents: ``burst`` requests per rolling ``interval_ms`` (429 with
``policyName`` ``TEN_SECONDLY_ROLLING``) and ``daily`` per day (429 ``DAILY``), with the
``X-HubSpot-RateLimit-*`` headers on every answer; ``storm`` answers the next N
requests 429 whatever the counts (with ``Retry-After: 1``); ``latency_ms`` holds each
answer that long *after* the write is applied (``answering`` counts the answers held),
as a CRM whose answer is slow to come back: a client killed meanwhile never learns
that its batch was written.

The ledger (``GET /_admin/crm``) is what each record holds and every request
received (its path and body), so a test can check that a record was written once,
that a second sync sent nothing, and which fields a request carried.
``POST /_admin/crm/reset`` empties it; ``POST /_admin/crm/config`` sets the limits
(and ``daily_used``, to restart the day); ``POST /_admin/crm/records`` seeds records.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["CrmServer", "crm_routes"]

#: HubSpot's most inputs per batch request.
MAX_INPUTS = 100


def _now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class CrmServer:
    """The CRM's records, the requests it received and its limits (one event loop)."""

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.reset()

    def reset(self) -> None:
        self.records: dict[str, dict[str, dict[str, Any]]] = {}
        self.requests: list[dict[str, Any]] = []
        self.window: deque[float] = deque()
        self.daily_used = 0
        self.next_id = 1
        self.answering = 0
        self.config = {
            "burst": 100,
            "interval_ms": 10_000,
            "daily": 250_000,
            "storm": 0,
            "reject_ids": [],
            "latency_ms": 0,
        }

    # ------------------------------------------------------------------ admin

    async def admin_ledger(self, request: Request) -> Response:
        return JSONResponse(
            {
                "records": self.records,
                "requests": self.requests,
                "daily_used": self.daily_used,
                "answering": self.answering,
                "config": self.config,
            }
        )

    async def admin_reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse({"ok": True})

    async def admin_config(self, request: Request) -> Response:
        changes = await request.json()
        if "daily_used" in changes:
            self.daily_used = int(changes.pop("daily_used"))
        self.config.update(changes)
        return JSONResponse(self.config)

    async def admin_seed(self, request: Request) -> Response:
        """``{"object_type", "id_property", "records": [{properties}]}``: records as if
        someone had typed them into the CRM."""
        body = await request.json()
        for properties in body["records"]:
            self._upsert(
                body["object_type"],
                body["id_property"],
                str(properties[body["id_property"]]),
                properties,
            )
        return JSONResponse({"ok": True})

    # ------------------------------------------------------------------ the API

    async def upsert(self, request: Request) -> Response:
        object_type = request.path_params["object_type"]
        return await self._limited(request, lambda body: self._batch_upsert(object_type, body))

    async def read(self, request: Request) -> Response:
        object_type = request.path_params["object_type"]
        return await self._limited(request, lambda body: self._batch_read(object_type, body))

    async def salesforce_upsert(self, request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not auth[len("Bearer ") :].strip():
            return JSONResponse(
                [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}],
                status_code=401,
            )
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse([{"message": "bad JSON", "errorCode": "JSON_PARSER_ERROR"}], 400)
        self.requests.append({"path": request.url.path, "body": body})
        headers = {"Sforce-Limit-Info": f"api-usage={self.daily_used}/{self.config['daily']}"}
        if self.daily_used >= self.config["daily"]:
            return JSONResponse(
                [
                    {
                        "message": "TotalRequests Limit exceeded.",
                        "errorCode": "REQUEST_LIMIT_EXCEEDED",
                    }
                ],
                status_code=403,
                headers=headers,
            )
        self.daily_used += 1
        sobject = request.path_params["sobject"]
        field = request.path_params["field"]
        records = body.get("records") if isinstance(body, dict) else None
        if not isinstance(records, list) or not 1 <= len(records) <= 200:
            return JSONResponse(
                [{"message": "1 to 200 records", "errorCode": "EXCEEDED_ID_LIMIT"}], 400
            )
        rejected = {str(r).casefold() for r in self.config["reject_ids"]}
        results = []
        for item in records:
            value = item.get(field) if isinstance(item, dict) else None
            if not isinstance(value, str) or (item.get("attributes") or {}).get("type") != sobject:
                return JSONResponse(
                    [{"message": f"each record needs attributes.type and {field}",
                      "errorCode": "INVALID_FIELD"}], 400,
                )  # fmt: skip
            if value.casefold() in rejected:
                results.append(
                    {
                        "success": False,
                        "errors": [
                            {
                                "statusCode": "FIELD_CUSTOM_VALIDATION_EXCEPTION",
                                "message": f"{field} {value!r} is not valid",
                                "fields": [field],
                            }
                        ],
                    }
                )
                continue
            fields = {k: v for k, v in item.items() if k != "attributes"}
            record, new = self._upsert(f"salesforce:{sobject}", field, value, fields)
            results.append({"id": record["id"], "success": True, "created": new, "errors": []})
        return JSONResponse(results, headers=headers)

    async def _limited(self, request: Request, answer: Any) -> Response:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not auth[len("Bearer ") :].strip():
            return _error(401, "Authentication credentials not found.", "INVALID_AUTHENTICATION")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "Invalid input JSON", "VALIDATION_ERROR")
        self.requests.append({"path": request.url.path, "body": body})
        now = time.monotonic()
        interval = self.config["interval_ms"] / 1000
        while self.window and self.window[0] <= now - interval:
            self.window.popleft()
        if self.config["storm"] > 0:
            self.config["storm"] -= 1
            return self._too_many("TEN_SECONDLY_ROLLING", retry_after=True)
        if self.daily_used >= self.config["daily"]:
            return self._too_many("DAILY")
        if len(self.window) >= self.config["burst"]:
            return self._too_many("TEN_SECONDLY_ROLLING")
        self.window.append(now)
        self.daily_used += 1
        status, payload = answer(body)
        if self.config["latency_ms"]:
            self.answering += 1
            try:
                await asyncio.sleep(self.config["latency_ms"] / 1000)
            finally:
                self.answering -= 1
        response = JSONResponse(payload, status_code=status)
        self._headers(response)
        return response

    def _too_many(self, policy: str, *, retry_after: bool = False) -> Response:
        daily = policy == "DAILY"
        message = (
            "You have reached your daily limit."
            if daily
            else "You have reached your secondly limit."
        )
        response = JSONResponse(
            {
                "status": "error",
                "message": message,
                "errorType": "RATE_LIMIT",
                "correlationId": str(uuid.uuid4()),
                "policyName": policy,
                "category": "RATE_LIMITS",
            },
            status_code=429,
        )
        self._headers(response)
        if retry_after:
            response.headers["Retry-After"] = "1"
        return response

    def _headers(self, response: Response) -> None:
        response.headers["X-HubSpot-RateLimit-Max"] = str(self.config["burst"])
        response.headers["X-HubSpot-RateLimit-Remaining"] = str(
            max(0, self.config["burst"] - len(self.window))
        )
        response.headers["X-HubSpot-RateLimit-Interval-Milliseconds"] = str(
            self.config["interval_ms"]
        )
        response.headers["X-HubSpot-RateLimit-Daily"] = str(self.config["daily"])
        response.headers["X-HubSpot-RateLimit-Daily-Remaining"] = str(
            max(0, self.config["daily"] - self.daily_used)
        )

    def _batch_upsert(self, object_type: str, body: Any) -> tuple[int, dict[str, Any]]:
        inputs = body.get("inputs") if isinstance(body, dict) else None
        if not isinstance(inputs, list) or not 1 <= len(inputs) <= MAX_INPUTS:
            return 400, _error_body(
                f"inputs must hold 1 to {MAX_INPUTS} objects", "VALIDATION_ERROR"
            )
        for item in inputs:
            if (
                not isinstance(item, dict)
                or not isinstance(item.get("id"), str)
                or not isinstance(item.get("idProperty"), str)
                or not isinstance(item.get("properties"), dict)
                or not all(isinstance(v, str) for v in item["properties"].values())
            ):
                return 400, _error_body(
                    "each input needs id, idProperty and string properties", "VALIDATION_ERROR"
                )
        started = _now_iso()
        results, errors = [], []
        rejected = {str(r).casefold() for r in self.config["reject_ids"]}
        for item in inputs:
            trace = item.get("objectWriteTraceId")
            if item["id"].casefold() in rejected:
                errors.append(
                    {
                        "status": "error",
                        "category": "VALIDATION_ERROR",
                        "message": "Property values were not valid: "
                        f"{item['idProperty']} {item['id']!r}",
                        "context": {"objectWriteTraceId": [trace]}
                        if trace is not None
                        else {"ids": [item["id"]]},
                        "errors": [],
                        "links": {},
                    }
                )
                continue
            record, new = self._upsert(
                object_type, item["idProperty"], item["id"], item["properties"]
            )
            result = {
                "id": record["id"],
                "new": new,
                "archived": False,
                "createdAt": record["createdAt"],
                "updatedAt": record["updatedAt"],
                "properties": dict(record["properties"]),
            }
            if trace is not None:
                result["objectWriteTraceId"] = trace
            results.append(result)
        answer: dict[str, Any] = {
            "status": "COMPLETE",
            "results": results,
            "requestedAt": started,
            "startedAt": started,
            "completedAt": _now_iso(),
        }
        if errors:
            answer["errors"] = errors
            answer["numErrors"] = len(errors)
            return 207, answer
        return 200, answer

    def _upsert(
        self, object_type: str, id_property: str, value: str, properties: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        records = self.records.setdefault(object_type, {})
        key = f"{id_property}:{value.casefold()}"
        now = _now_iso()
        record = records.get(key)
        new = record is None
        if record is None:
            record = {
                "id": str(self.next_id),
                "createdAt": now,
                "properties": {id_property: value.casefold() if id_property == "email" else value},
            }
            self.next_id += 1
            records[key] = record
        record["properties"].update({k: str(v) for k, v in properties.items()})
        record["updatedAt"] = now
        record["writes"] = record.get("writes", 0) + 1
        return record, new

    def _batch_read(self, object_type: str, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
            return 400, _error_body("inputs are required", "VALIDATION_ERROR")
        id_property = body.get("idProperty") or "hs_object_id"
        wanted = body.get("properties") or []
        records = self.records.get(object_type, {})
        started = _now_iso()
        results = []
        for item in body["inputs"]:
            record = records.get(f"{id_property}:{str(item.get('id', '')).casefold()}")
            if record is None:
                continue
            results.append(
                {
                    "id": record["id"],
                    "archived": False,
                    "createdAt": record["createdAt"],
                    "updatedAt": record["updatedAt"],
                    "properties": {
                        k: record["properties"][k] for k in wanted if k in record["properties"]
                    },
                }
            )
        return 200, {
            "status": "COMPLETE",
            "results": results,
            "startedAt": started,
            "completedAt": _now_iso(),
        }


def _error_body(message: str, category: str) -> dict[str, Any]:
    return {
        "status": "error",
        "message": message,
        "correlationId": str(uuid.uuid4()),
        "category": category,
    }


def _error(status: int, message: str, category: str) -> Response:
    return JSONResponse(_error_body(message, category), status_code=status)


def crm_routes() -> list[Route]:
    """The CRM mode's routes (HubSpot's API under ``/hubspot``, Salesforce's under
    ``/salesforce``, the ledger under ``/_admin/crm``)."""
    crm = CrmServer()
    base = "/hubspot/crm/v3/objects/{object_type}"
    return [
        Route(f"{base}/batch/upsert", crm.upsert, methods=["POST"]),
        Route(f"{base}/batch/read", crm.read, methods=["POST"]),
        Route(
            "/salesforce/services/data/{version}/composite/sobjects/{sobject}/{field}",
            crm.salesforce_upsert,
            methods=["PATCH"],
        ),
        Route("/_admin/crm", crm.admin_ledger, methods=["GET"]),
        Route("/_admin/crm/reset", crm.admin_reset, methods=["POST"]),
        Route("/_admin/crm/config", crm.admin_config, methods=["POST"]),
        Route("/_admin/crm/records", crm.admin_seed, methods=["POST"]),
    ]
