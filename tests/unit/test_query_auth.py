"""``auth.query``: a provider's key in a query parameter instead of a header."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from playline.calls.catalog import AuthSpec, Catalog
from playline.calls.http import ProviderClient
from playline.calls.log_scrub import REDACTED, redact_query_parameters, scrub_http_logs


def catalog(auth: dict[str, Any], *, method: str = "GET", inputs: dict[str, str] | None = None):
    return Catalog.model_validate(
        {
            "providers": {"acme": {"base_url": "https://acme.example", "auth": auth}},
            "tools": {
                "verify": {
                    "provider": "acme",
                    "method": method,
                    "path": "/v1/verify",
                    "input": inputs or {"email": "str"},
                }
            },
        }
    )


def test_the_key_goes_in_a_header_by_default_and_in_exactly_one_place() -> None:
    assert AuthSpec(env="K").header == "Authorization"
    assert AuthSpec(env="K", query="api_key").header is None
    with pytest.raises(ValidationError, match="exactly one"):
        AuthSpec(env="K", query="api_key", header="X-Api-Key")
    with pytest.raises(ValidationError, match="exactly one"):
        AuthSpec(env="K", query="api_key", scheme="Bearer")


def test_an_input_field_named_as_the_key_parameter_is_refused() -> None:
    with pytest.raises(ValidationError, match="input field 'key'"):
        catalog({"env": "K", "query": "key"}, inputs={"email": "str", "key": "str?"})


def test_the_catalog_names_its_key_parameters() -> None:
    assert catalog({"env": "K", "query": "api_key"}).key_parameters() == ["api_key"]
    assert catalog({"env": "K", "header": "X-Api-Key"}).key_parameters() == []


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_the_key_is_a_query_parameter_and_no_header(method: str) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "valid"})

    cat = catalog({"env": "ACME_KEY", "query": "api_key"}, method=method)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        client = ProviderClient(cat, http, environ={"ACME_KEY": "acme-secret-123"})
        await client.send(cat.tool("verify"), {"email": "a@b.example"}, idempotency_key="k")
    (request,) = seen
    assert request.url.params["api_key"] == "acme-secret-123"
    assert "authorization" not in {name.lower() for name in request.headers}
    assert all("acme-secret-123" not in value for value in request.headers.values())
    if method == "GET":
        assert request.url.params["email"] == "a@b.example"
    else:
        assert request.content == b'{"email":"a@b.example"}'


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("GET https://a.example/v2/validate?api_key=s3cr3t&email=x", f"?api_key={REDACTED}&email="),
        ("GET https://a.example/v4/check?email=x&key=s3cr3t", f"&key={REDACTED}"),
        ("'https://a.example/?key=s3cr3t' done", f"?key={REDACTED}' done"),
        ("https://a.example/?key=s3cr3t#frag", f"?key={REDACTED}#frag"),
    ],
)
def test_key_parameters_are_redacted_from_urls(text: str, scrubbed: str) -> None:
    out = redact_query_parameters(text, ["api_key", "key"])
    assert "s3cr3t" not in out and scrubbed in out


def test_other_parameters_are_left_as_they_are() -> None:
    text = "GET https://a.example/?monkey=1&email=x&key_hint=2"
    assert redact_query_parameters(text, ["key"]) == text


def test_an_http_log_record_is_scrubbed_before_any_handler_sees_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scrub_http_logs(["api_key"])
    caplog.set_level(logging.DEBUG)
    url = httpx.URL("https://a.example/v2/validate", params={"api_key": "zz-top-1", "email": "e"})
    logging.getLogger("httpx").info('HTTP Request: %s %s "%s"', "GET", url, "HTTP/1.1 200 OK")
    (record,) = [r for r in caplog.records if r.name == "httpx"]
    assert "zz-top-1" not in record.getMessage()
    assert f"api_key={REDACTED}" in record.getMessage()


def test_a_balance_is_read_with_the_key_in_its_query_parameter() -> None:
    from playline.reconcile.read import _auth_requests

    spec = catalog({"env": "ACME_KEY", "query": "api_key"}).providers["acme"]
    assert _auth_requests(spec, {"ACME_KEY": "k-1"}) == [
        ({"Accept": "application/json"}, {"api_key": "k-1"})
    ]
    spec = catalog({"env": "ACME_KEY", "header": "X-Api-Key"}).providers["acme"]
    assert _auth_requests(spec, {"ACME_KEY": "k-1"}) == [
        ({"Accept": "application/json", "X-Api-Key": "k-1"}, {})
    ]
