"""The HubSpot sink's requests are what HubSpot's published OpenAPI description of the
CRM objects API says they must be, and so are the provider server's CRM answers the
sink is tested against (the spec is vendored: tests/vendor/hubspot, no network).

The validator below reads the subset of OpenAPI 3.0 schemas these operations use
(``$ref``, ``type``, ``required``, ``properties``, ``additionalProperties``, ``items``,
``enum``); a keyword it does not know fails the test rather than passing silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from playline.provider_server.app import create_app
from playline.sinks.hubspot import read_body, upsert_body
from playline.sinks.spec import HubSpotSinkSpec

SPEC = json.loads(
    (Path(__file__).parents[1] / "vendor" / "hubspot" / "crm-objects-v3-batch.json").read_text()
)
UPSERT = "/crm/v3/objects/{objectType}/batch/upsert"
READ = "/crm/v3/objects/{objectType}/batch/read"
KNOWN = {
    "$ref", "type", "required", "properties", "additionalProperties", "items", "enum",
    "description", "example", "format", "nullable",
}  # fmt: skip
TYPES = {
    "object": dict, "array": list, "string": str, "boolean": bool,
    "integer": int, "number": (int, float),
}  # fmt: skip


def problems(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Why ``value`` does not match ``schema`` (empty: it does)."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        return problems(value, SPEC["components"]["schemas"][name], where)
    unknown = set(schema) - KNOWN
    assert not unknown, f"{where}: the validator does not read {sorted(unknown)}"
    found: list[str] = []
    kind = schema.get("type")
    wrong_bool = kind != "boolean" and isinstance(value, bool)
    if kind is not None and (not isinstance(value, TYPES[kind]) or wrong_bool):
        return [f"{where}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        found += [
            f"{where}: missing {name!r}" for name in schema.get("required", []) if name not in value
        ]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            if name in props:
                found += problems(item, props[name], f"{where}.{name}")
            elif isinstance(extra, dict):
                found += problems(item, extra, f"{where}.{name}")
            elif props:
                found.append(f"{where}: {name!r} is not a property of the schema")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += problems(item, schema["items"], f"{where}[{index}]")
    return found


def request_schema(path: str) -> dict[str, Any]:
    body = SPEC["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return dict(body["schema"])


def response_schema(path: str, status: int) -> dict[str, Any]:
    answer = SPEC["paths"][path]["post"]["responses"][str(status)]["content"]["application/json"]
    return dict(answer["schema"])


CONTACTS = HubSpotSinkSpec(
    kind="hubspot", provider="hubspot", object_type="contacts", id_property="email"
)


def test_the_validator_can_fail() -> None:
    bad = {"inputs": [{"id": 7, "properties": {"company": 1}, "colour": "red"}]}
    found = problems(bad, request_schema(UPSERT))
    assert "$.inputs[0].id: 7 is not string" in found
    assert "$.inputs[0].properties.company: 1 is not string" in found
    assert "$.inputs[0]: 'colour' is not a property of the schema" in found
    assert problems({}, request_schema(UPSERT)) == ["$: missing 'inputs'"]


def test_the_batch_upsert_the_sink_sends_is_valid() -> None:
    body = upsert_body(
        CONTACTS,
        [
            ("ada@example.com", {"company": "Analytical Engines", "employees": 12.0}),
            ("bob@example.com", {"jobtitle": "CTO", "verified": True}),
        ],
    )
    assert problems(body, request_schema(UPSERT)) == []
    assert body["inputs"][0] == {
        "id": "ada@example.com",
        "idProperty": "email",
        "objectWriteTraceId": "0",
        "properties": {"company": "Analytical Engines", "employees": "12"},
    }
    assert body["inputs"][1]["properties"] == {"jobtitle": "CTO", "verified": "true"}


def test_the_batch_read_the_sink_sends_is_valid() -> None:
    body = read_body(CONTACTS, ["ada@example.com"], ["company", "jobtitle"])
    assert problems(body, request_schema(READ)) == []
    assert body["properties"] == ["company", "email", "jobtitle"]


@pytest.fixture
async def crm() -> Any:
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://crm") as http:
        yield http


async def test_the_crm_modes_answers_match_hubspots_responses(crm: httpx.AsyncClient) -> None:
    await crm.post("/_admin/crm/config", json={"reject_ids": ["bad@example.com"]})
    auth = {"Authorization": "Bearer t"}
    body = upsert_body(
        CONTACTS, [("ada@example.com", {"company": "A"}), ("bad@example.com", {"company": "B"})]
    )
    multi = await crm.post("/hubspot/crm/v3/objects/contacts/batch/upsert", json=body, headers=auth)
    assert multi.status_code == 207
    assert problems(multi.json(), response_schema(UPSERT, 207)) == []
    assert multi.json()["errors"][0]["context"] == {"objectWriteTraceId": ["1"]}
    body = upsert_body(CONTACTS, [("ada@example.com", {"jobtitle": "CTO"})])
    whole = await crm.post("/hubspot/crm/v3/objects/contacts/batch/upsert", json=body, headers=auth)
    assert whole.status_code == 200
    assert problems(whole.json(), response_schema(UPSERT, 200)) == []
    assert whole.json()["results"][0]["new"] is False
    read = await crm.post(
        "/hubspot/crm/v3/objects/contacts/batch/read",
        json=read_body(CONTACTS, ["ADA@example.com"], ["company"]),
        headers=auth,
    )
    assert problems(read.json(), response_schema(READ, 200)) == []
    assert read.json()["results"][0]["properties"] == {"company": "A", "email": "ada@example.com"}
    denied = await crm.post("/hubspot/crm/v3/objects/contacts/batch/upsert", json=body)
    assert denied.status_code == 401
    too_many = upsert_body(CONTACTS, [(f"p{i}@example.com", {}) for i in range(101)])
    refused = await crm.post(
        "/hubspot/crm/v3/objects/contacts/batch/upsert", json=too_many, headers=auth
    )
    assert refused.status_code == 400
