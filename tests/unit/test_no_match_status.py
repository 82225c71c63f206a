"""``no_match_status``: a status by which a provider answers "nothing found" is a miss."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from playline.calls.bulk import split_results
from playline.calls.catalog import Catalog
from playline.calls.http import ProviderClient
from playline.errors import ProviderRateLimited, ProviderRejected

NOT_FOUND = {"status": 404, "error": {"type": "not_found", "message": "No records were found"}}


def catalog(**tool: Any) -> Catalog:
    spec: dict[str, Any] = {
        "provider": "pdl",
        "method": "GET",
        "path": "/v5/person/enrich",
        "getters": {"id": "data.id", "status": "status"},
        "billing": {"rule": "per_hit", "hit": "id"},
        "no_match_status": [404],
        "fresh_for": {"found": "90d", "no_match": "14d"},
    }
    spec.update(tool)
    return Catalog.model_validate(
        {"providers": {"pdl": {"base_url": "https://pdl.example"}}, "tools": {"enrich": spec}}
    )


async def answer(cat: Catalog, status: int, body: Any) -> Any:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(respond)) as http:
        client = ProviderClient(cat, http, environ={})
        return await client.send(cat.tool("enrich"), {"email": "a@b.example"}, idempotency_key="k")


async def test_a_no_match_status_is_a_miss_free_and_kept_as_a_miss() -> None:
    cat = catalog()
    tool = cat.tool("enrich")
    result = await answer(cat, 404, NOT_FOUND)
    assert result is None  # the error envelope is not a result: no getter reads its status
    assert tool.get(result, "status") is None
    assert tool.charge(result).credits == 0
    assert tool.max_age(result) == 14 * 86400  # the no_match freshness, not found's


async def test_another_4xx_is_still_a_rejection() -> None:
    with pytest.raises(ProviderRejected):
        await answer(catalog(), 402, {"status": 402, "error": {"type": "payment_required"}})


async def test_without_no_match_status_a_404_is_a_rejection() -> None:
    with pytest.raises(ProviderRejected):
        await answer(catalog(no_match_status=[]), 404, NOT_FOUND)


async def test_a_429_is_rate_limited_whatever_the_tool_says() -> None:
    with pytest.raises(ProviderRateLimited):
        await answer(catalog(), 429, {})


async def test_a_per_request_rule_still_bills_a_no_match() -> None:
    cat = catalog(billing={"rule": "per_request", "credits": 2})
    result = await answer(cat, 404, NOT_FOUND)
    assert cat.tool("enrich").charge(result).credits == 2


@pytest.mark.parametrize("status", [200, 302, 408, 409, 425, 429, 500, 503])
def test_only_a_4xx_about_the_request_can_mean_no_match(status: int) -> None:
    with pytest.raises(ValidationError, match="no_match_status"):
        catalog(no_match_status=[status])


def test_a_job_tool_has_no_no_match_status() -> None:
    job = {
        "job_id": "id",
        "status_path": "/jobs/{job_id}",
        "state_field": "state",
        "done": ["done"],
        "running": ["running"],
        "results_field": "results",
    }
    with pytest.raises(ValidationError, match="no_match_status"):
        catalog(job=job)


def test_a_bulk_request_answered_no_match_is_a_miss_of_every_member() -> None:
    cat = catalog(batch={"path": "/v5/person/bulk", "max_items": 10})
    assert split_results(cat.tool("enrich"), None, 3) == [None, None, None]
