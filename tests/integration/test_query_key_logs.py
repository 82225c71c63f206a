"""A key in the query string (``auth.query``) reaches the provider and nothing else.

ZeroBounce, NeverBounce and MillionVerifier take the key only as a query parameter, so
the request's URL holds it, and httpx logs every request's URL at INFO. Calls are made
over both transports against the contract server with every log captured at DEBUG:
the key must reach the server, and appear in no log record and no error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from playline.calls.catalog import Catalog
from playline.calls.http import ProviderClient
from playline.calls.log_scrub import REDACTED
from playline.calls.transport import Transport, make_http_client
from playline.errors import ProviderTransientError
from tests.contracts.server import ContractServer, contract_server

KEY = "zb-live-7f3c9a2e5d1b4c6a"  # shaped like a real key, unlike the harness's own


@pytest.fixture(scope="module")
def server() -> Iterator[ContractServer]:
    with contract_server() as running:
        yield running


def catalog() -> Catalog:
    return Catalog.model_validate({"include": ["zerobounce", "neverbounce"]})


def environ(base_url: str) -> dict[str, str]:
    return {
        "ZEROBOUNCE_API_KEY": KEY,
        "ZEROBOUNCE_BASE_URL": base_url,
        "NEVERBOUNCE_API_KEY": "nb-secret-2b9d7e41c0a8",
        "NEVERBOUNCE_BASE_URL": base_url,
    }


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured record as a handler would write it (message, args, exception)."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(record) for record in caplog.records)


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_the_key_reaches_the_provider_and_no_log_line(
    transport: Transport, server: ContractServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.answer("zerobounce_validate", "valid")
    cat = catalog()
    http = make_http_client(transport=transport)
    try:
        client = ProviderClient(cat, http, environ=environ(server.base_url("zerobounce")))
        caplog.set_level(logging.DEBUG)
        result = await client.send(
            cat.tool("zerobounce_validate"), {"email": "flowerjill@aol.com"}, idempotency_key="k1"
        )
    finally:
        await http.aclose()
    assert result["status"] == "valid"
    # The provider got the key where its docs say, and the request was logged...
    assert [r["query"]["api_key"] for r in server.requests("zerobounce")][-1] == KEY
    text = logged(caplog)
    assert "HTTP Request: GET" in text and "/v2/validate?" in text
    # ...without it.
    assert KEY not in text
    assert f"api_key={REDACTED}" in text or f"api_key={REDACTED.replace('[', '%5B')}" in text


async def test_a_failed_call_quotes_no_key(caplog: pytest.LogCaptureFixture) -> None:
    cat = catalog()
    http = make_http_client()
    try:
        # Nothing listens on port 9 of the loopback: the connection is refused.
        client = ProviderClient(cat, http, environ=environ("http://127.0.0.1:9"))
        caplog.set_level(logging.DEBUG)
        with pytest.raises(ProviderTransientError) as failed:
            await client.send(
                cat.tool("neverbounce_single_check"), {"email": "a@b.example"}, idempotency_key="k"
            )
    finally:
        await http.aclose()
    assert "nb-secret-2b9d7e41c0a8" not in str(failed.value)
    assert "nb-secret-2b9d7e41c0a8" not in repr(failed.value.__cause__)
    assert "nb-secret-2b9d7e41c0a8" not in logged(caplog)
