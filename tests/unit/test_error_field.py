"""``error_field``: errors a provider answers with a 200 are classified as errors."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from playline.calls.answer_errors import ErrorFieldSpec
from playline.calls.catalog import Catalog
from playline.calls.http import REDACTED, ProviderClient
from playline.errors import ProviderRateLimited, ProviderRejected, ProviderTransientError

NEVERBOUNCE = {
    "field": "status",
    "ok": ["success"],
    "when": {"throttle_triggered": "rate_limited", "temp_unavail": "transient"},
    "any": "rejected",
    "message": "message",
}


def catalog(error_field: Any) -> Catalog:
    return Catalog.model_validate(
        {
            "providers": {
                "nb": {"base_url": "https://nb.example", "auth": {"env": "NB_KEY", "query": "key"}}
            },
            "tools": {
                "check": {
                    "provider": "nb",
                    "method": "GET",
                    "path": "/v4/single/check",
                    "getters": {"status": "result"},
                    "billing": {"rule": "per_hit", "hit": "status"},
                    "error_field": error_field,
                }
            },
        }
    )


async def answer(cat: Catalog, body: Any, status: int = 200) -> Any:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(respond)) as http:
        client = ProviderClient(cat, http, environ={"NB_KEY": "nb-key-0123456789"})
        return await client.send(cat.tool("check"), {"email": "a@b.example"}, idempotency_key="k")


async def test_a_success_is_an_answer() -> None:
    body = {"status": "success", "result": "valid", "flags": []}
    assert await answer(catalog(NEVERBOUNCE), body) == body


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ("throttle_triggered", ProviderRateLimited),
        ("temp_unavail", ProviderTransientError),
        ("auth_failure", ProviderRejected),
        ("general_failure", ProviderRejected),
        ("bad_referrer", ProviderRejected),
    ],
)
async def test_each_error_status_is_its_kind_of_error(status: str, error: type) -> None:
    with pytest.raises(error) as raised:
        await answer(catalog(NEVERBOUNCE), {"status": status, "message": "why"})
    assert raised.type is error  # a rate limit is not taken for a rejection, nor the reverse
    assert raised.value.may_have_charged is False
    assert status in str(raised.value) and "why" in str(raised.value)


async def test_the_quoted_message_never_holds_a_key() -> None:
    body = {"status": "auth_failure", "message": "Invalid API key 'nb-key-0123456789'"}
    with pytest.raises(ProviderRejected) as raised:
        await answer(catalog(NEVERBOUNCE), body)
    assert "nb-key-0123456789" not in str(raised.value) and REDACTED in str(raised.value)


async def test_a_field_named_alone_rejects_any_present_value() -> None:
    cat = catalog("error")  # Findymail's verifier, ZeroBounce
    with pytest.raises(ProviderRejected, match="Not enough credits"):
        await answer(cat, {"error": "Not enough credits"})
    with pytest.raises(ProviderRejected):
        await answer(cat, {"error": ["Invalid API Key or your account ran out of credits"]})
    assert await answer(cat, {"email": "a@b.example", "error": ""}) == {
        "email": "a@b.example",
        "error": "",
    }
    assert await answer(cat, {"email": "a@b.example"}) == {"email": "a@b.example"}


async def test_only_the_listed_values_are_errors_without_any() -> None:
    cat = catalog({"field": "result", "when": {"error": "rejected"}, "message": "error"})
    with pytest.raises(ProviderRejected, match="Apikey not found"):
        await answer(cat, {"result": "error", "error": "Apikey not found", "credits": 0})
    ok = {"result": "catch_all", "error": "", "credits": 10}
    assert await answer(cat, ok) == ok


def test_an_error_field_must_say_what_is_an_error() -> None:
    with pytest.raises(ValidationError, match="when"):
        ErrorFieldSpec(field="status")
    with pytest.raises(ValidationError):
        ErrorFieldSpec.model_validate({"field": "status", "when": {"x": "out_of_luck"}})


def test_an_error_answer_is_never_read_as_a_result_of_the_tool() -> None:
    spec = ErrorFieldSpec.model_validate(NEVERBOUNCE)
    assert spec.kind_of({"status": "success"}) is None
    assert spec.kind_of({"result": "valid"}) is None  # no status at all: an answer
    assert spec.kind_of({"status": "throttle_triggered"}) == "rate_limited"
    assert spec.kind_of({"status": "new_kind_of_failure"}) == "rejected"
