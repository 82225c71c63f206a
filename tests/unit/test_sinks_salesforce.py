"""The Salesforce sink against the provider server's Salesforce-shaped sObject
Collections upsert, in process (the app over ASGI: no socket, no network)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from playline.pacing.governor import Governor
from playline.pacing.policy import PacingPolicy
from playline.provider_server.app import create_app
from playline.sinks.destination import SinkParked
from playline.sinks.plan import RecordPlan, SyncMapping, plan_row
from playline.sinks.salesforce import SalesforceDestination, collection_body
from playline.sinks.spec import SalesforceSinkSpec
from playline.stores.sheet import RunRow

SPEC = SalesforceSinkSpec(
    kind="salesforce", provider="salesforce", sobject="Contact", external_id_field="Email_Key__c"
)
MAPPING = SyncMapping("email", {"first": "FirstName", "employees": "NumberOfEmployees__c"})


def plans(*emails: str) -> list[RecordPlan]:
    found = []
    for seq, email in enumerate(emails):
        row = RunRow(seq, f"k{seq}", {"email": email, "first": "Ada", "employees": 12}, "ok", None)
        plan = plan_row(row, MAPPING, {})
        assert isinstance(plan, RecordPlan)
        found.append(plan)
    return found


@pytest.fixture
async def crm() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://crm") as http:
        yield http


def destination(http: httpx.AsyncClient) -> SalesforceDestination:
    governor = Governor({"salesforce": PacingPolicy(rps=100, burst=10)})
    return SalesforceDestination(
        SPEC,
        base_url="http://crm/salesforce",
        token="00D-token",
        http=http,
        pacer=governor,
        pacing_key="salesforce",
    )


def test_the_request_is_an_sobject_collection_upsert_by_external_id() -> None:
    assert collection_body(SPEC, plans("a@x.io")) == {
        "allOrNone": False,
        "records": [
            {
                "attributes": {"type": "Contact"},
                "Email_Key__c": "a@x.io",
                "FirstName": "Ada",
                "NumberOfEmployees__c": 12,
            }
        ],
    }


async def test_results_in_order_map_back_to_each_record(crm: httpx.AsyncClient) -> None:
    await crm.post("/_admin/crm/config", json={"reject_ids": ["b@x.io"]})
    sink = destination(crm)
    first = await sink.write(plans("a@x.io", "b@x.io", "c@x.io"))
    assert [(o.record, o.status) for o in first] == [
        ("a@x.io", "created"),
        ("b@x.io", "rejected"),
        ("c@x.io", "created"),
    ]
    assert (
        first[1].reason == "FIELD_CUSTOM_VALIDATION_EXCEPTION: Email_Key__c 'b@x.io' is not valid"
    )
    again = await sink.write(plans("a@x.io"))
    assert (again[0].status, again[0].object_id) == ("updated", first[0].object_id)
    ledger: dict[str, Any] = (await crm.get("/_admin/crm")).json()
    held = ledger["records"]["salesforce:Contact"]
    assert {r["properties"]["Email_Key__c"] for r in held.values()} == {"a@x.io", "c@x.io"}


async def test_a_spent_allocation_parks_the_sync(crm: httpx.AsyncClient) -> None:
    await crm.post("/_admin/crm/config", json={"daily": 1})
    sink = destination(crm)
    await sink.write(plans("a@x.io"))
    with pytest.raises(SinkParked, match="allocation is spent"):
        await sink.write(plans("b@x.io"))


def test_if_blank_is_refused_for_salesforce() -> None:
    with pytest.raises(ValueError, match="if_blank"):
        SalesforceSinkSpec(
            kind="salesforce",
            provider="salesforce",
            sobject="Contact",
            external_id_field="Email_Key__c",
            policies={"Title": "if_blank"},
        )
