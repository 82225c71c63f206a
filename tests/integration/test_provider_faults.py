"""The provider server as a provider that charges and then fails, over real HTTP.

playline must never re-send a possibly charged call to a tool whose provider does
not de-duplicate; these tests hold the fake provider to being such a provider
exactly: ``idempotency="ignore"`` charges every request, the charged faults charge
once and fail the way a real client sees it (a 500, a transport error, a timeout:
checked on httpx's own transport and on httpx-aiohttp), and a client that leaves
mid-call (cancelled, or SIGKILLed in its own process) is still charged and counted
as ``charged_unanswered``. Nothing here asserts on durations: tests wait for the
ledger to reach a state (``wait_ledger``), never for a clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from playline.calls.transport import Transport, make_http_client
from playline.provider_server import (
    ProviderServerProcess,
    ServerConfig,
    ThreadedProviderServer,
    idem_digest,
    start_in_thread,
)
from playline.provider_server.__main__ import build_parser, config_from_args

BASE = ServerConfig(latency_ms=(0.0, 1.0))
ACME = {"X-Api-Key": "test-acme-key"}
PERSON = {"first_name": "Ada", "last_name": "Lovelace", "domain": "example.com"}
EMAIL_FIND = "/acme/v1/email/find"
TRANSPORTS: tuple[Transport, ...] = ("httpx", "aiohttp")

#: What a client sees for each charged fault, per transport: a status or an exception type.
SEES: dict[tuple[str, Transport], int | type[Exception]] = {
    ("500_after_charge", "httpx"): 500,
    ("500_after_charge", "aiohttp"): 500,
    ("drop_after_charge", "httpx"): httpx.RemoteProtocolError,
    ("drop_after_charge", "aiohttp"): httpx.ReadError,
    ("timeout_after_charge", "httpx"): httpx.ReadTimeout,
    ("timeout_after_charge", "aiohttp"): httpx.ReadTimeout,
}
CHARGED_FAULTS = ("500_after_charge", "drop_after_charge", "timeout_after_charge")


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedProviderServer]:
    handle = start_in_thread(BASE)
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def fresh(server: ThreadedProviderServer) -> None:
    server.configure(**BASE.model_dump())
    server.reset()


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> Transport:
    name: Transport = request.param
    return name


@pytest.fixture
async def client(transport: Transport) -> AsyncIterator[httpx.AsyncClient]:
    """playline's own provider client, on each transport it can use."""
    async with make_http_client(transport=transport) as c:
        yield c


async def find(
    server: ThreadedProviderServer,
    client: httpx.AsyncClient,
    key: str | None = None,
    body: dict[str, str] | None = None,
    wait_s: float = 10.0,
) -> httpx.Response:
    headers = ACME if key is None else ACME | {"Idempotency-Key": key}
    return await client.post(
        f"{server.base_url}{EMAIL_FIND}",
        json=PERSON if body is None else body,
        headers=headers,
        timeout=wait_s,
    )


async def outcome(call: Any) -> int | type[Exception]:
    """A response's status, or the type of the exception the client raised instead."""
    try:
        response: httpx.Response = await call
    except httpx.TransportError as err:
        return type(err)
    return response.status_code


def records_for(server: ThreadedProviderServer, key: str) -> list[dict[str, Any]]:
    return [c for c in server.calls() if c["idem"] == idem_digest(key)]


async def test_ignore_mode_charges_a_repeated_key_every_time(
    server: ThreadedProviderServer,
) -> None:
    server.configure(idempotency="ignore")
    async with httpx.AsyncClient() as client:
        replays = [await find(server, client, "row-1") for _ in range(3)]
        other_body = await find(server, client, "row-1", {**PERSON, "domain": "other.com"})
        empty_key = await find(server, client, "")
        server.configure(latency_ms=(300.0, 300.0))
        together = await asyncio.gather(*(find(server, client, "row-2") for _ in range(3)))
    responses = [*replays, other_body, empty_key, *together]
    assert [r.status_code for r in responses] == [200] * 8
    assert not any("Idempotent-Replayed" in r.headers for r in responses)
    ledger = server.ledger()
    assert (ledger["charged"], ledger["duplicates"], ledger["conflicts"]) == (8, 0, 0)
    assert ledger["invalid"] == 0
    assert ledger["double_charged"] == 6  # every PERSON call after the first
    assert ledger["charged_unanswered"] == 0
    assert [c["charged"] for c in records_for(server, "row-1")] == [True] * 4
    assert len(records_for(server, "row-2")) == 3
    assert all(c["answered"] for c in server.calls())


@pytest.mark.parametrize("mode", ["key", "ignore"])
@pytest.mark.parametrize("fault", CHARGED_FAULTS)
async def test_charged_fault_charges_once_and_fails_as_a_real_client_sees_it(
    server: ThreadedProviderServer,
    client: httpx.AsyncClient,
    transport: Transport,
    fault: str,
    mode: str,
) -> None:
    # The held answer outlasts the client's timeout by far, whatever the machine's load.
    server.configure(idempotency=mode, fail_next={fault: 1}, timeout_sleep_s=1.5)
    key = f"{fault}-{mode}"
    seen = await outcome(find(server, client, key, wait_s=0.2))
    assert seen == SEES[(fault, transport)]

    retry = await find(server, client, key)  # what a blind retry of the same call costs
    assert retry.status_code == 200
    assert retry.json()["email"] == "ada.lovelace@example.com"

    ledger = await asyncio.to_thread(server.wait_idle)
    charged_again = mode == "ignore"
    assert ledger["faults_by_kind"] == {fault: 1}
    assert ledger["charged_unanswered"] == 1
    assert ledger["charged_unanswered_by_reason"] == {fault: 1}
    assert ledger["double_charged"] == int(charged_again)
    assert ledger["charged"] == 1 + int(charged_again)
    failed = [c for c in records_for(server, key) if not c["answered"]]
    assert len(failed) == 1
    assert failed[0]["charged"] and failed[0]["unanswered_reason"] == fault
    assert failed[0]["status"] == {"500_after_charge": 500, "timeout_after_charge": 504}.get(
        fault, 200
    )
    assert retry.headers.get("Idempotent-Replayed") == (None if charged_again else "true")


async def test_500_after_charge_has_a_json_error_body(server: ThreadedProviderServer) -> None:
    server.configure(fail_next={"500_after_charge": 1})
    async with httpx.AsyncClient() as client:
        response = await find(server, client)
    assert response.status_code == 500
    assert "after the charge" in response.json()["error"]
    assert server.ledger()["charged"] == 1


async def test_fault_rates_draw_each_charged_fault(server: ThreadedProviderServer) -> None:
    expected: dict[str, int | type[Exception]] = {
        "500_after_charge": 500,
        "drop_after_charge": httpx.RemoteProtocolError,
        "timeout_after_charge": 504,  # held for timeout_sleep_s=0, then answered 504
        "malformed": 200,
    }
    async with httpx.AsyncClient() as client:
        for fault, sees in expected.items():
            server.configure(**{f"fault_rate_{fault}": 1.0}, timeout_sleep_s=0.0)
            assert await outcome(find(server, client)) == sees
            server.configure(**{f"fault_rate_{fault}": 0.0})
    ledger = server.ledger()
    assert ledger["faults_by_kind"] == dict.fromkeys(expected, 1)
    assert ledger["charged_unanswered_by_reason"] == dict.fromkeys(expected, 1)
    assert (ledger["charged"], ledger["charged_unanswered"]) == (4, 4)
    bad = await asyncio.to_thread(
        httpx.post, f"{server.base_url}/_admin/config", json={"idempotency": "sometimes"}
    )
    assert bad.status_code == 422


def test_the_command_line_sets_the_idempotency_mode() -> None:
    def parsed(*argv: str) -> ServerConfig:
        return config_from_args(build_parser().parse_args(list(argv)))

    assert parsed().idempotency == "key"
    assert parsed("--idempotency", "ignore").idempotency == "ignore"
    with_json = parsed(
        "--config-json", '{"idempotency": "ignore", "fault_rate_drop_after_charge": 0.5}'
    )
    assert (with_json.idempotency, with_json.fault_rate_drop_after_charge) == ("ignore", 0.5)


async def test_malformed_counts_as_charged_and_unanswered(server: ThreadedProviderServer) -> None:
    server.configure(fail_next={"malformed": 1})
    async with httpx.AsyncClient() as client:
        response = await find(server, client, "k-mal")
    with pytest.raises(ValueError):
        response.json()
    ledger = server.ledger()
    assert ledger["charged_unanswered_by_reason"] == {"malformed": 1}
    (record,) = records_for(server, "k-mal")
    assert (record["status"], record["answered"], record["unanswered_reason"]) == (
        200,
        False,
        "malformed",
    )


async def test_uncharged_faults_are_not_charged_unanswered(server: ThreadedProviderServer) -> None:
    server.configure(fail_next={"5xx": 1, "429": 1})
    async with httpx.AsyncClient() as client:
        statuses = [(await find(server, client)).status_code for _ in range(3)]
    assert statuses == [429, 503, 200]
    ledger = server.ledger()
    assert (ledger["charged"], ledger["charged_unanswered"]) == (1, 0)
    assert all(c["answered"] and c["idem"] == "" for c in server.calls())


async def test_a_dropped_connection_is_not_logged_as_a_server_error(
    server: ThreadedProviderServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.configure(fail_next={"drop_after_charge": 1})
    with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await find(server, client)
            assert (await find(server, client)).status_code == 200  # the server is fine
    assert [r for r in caplog.records if r.name.startswith("uvicorn")] == []


async def test_a_client_that_leaves_mid_latency_is_charged_and_unanswered(
    server: ThreadedProviderServer, client: httpx.AsyncClient
) -> None:
    server.configure(latency_ms=(2000.0, 2000.0))
    call = asyncio.create_task(find(server, client, "gone-1"))
    in_flight = await asyncio.to_thread(server.wait_in_flight, idem_digest("gone-1"))
    assert in_flight["in_flight_idem"] == [idem_digest("gone-1")]
    call.cancel()  # the client gives up while the provider is still working
    with contextlib.suppress(asyncio.CancelledError):
        await call

    ledger = await asyncio.to_thread(server.wait_idle)
    assert (ledger["charged"], ledger["charged_unanswered"]) == (1, 1)
    assert ledger["charged_unanswered_by_reason"] == {"client_gone": 1}
    assert ledger["in_flight_idem"] == []
    (record,) = records_for(server, "gone-1")
    assert record["charged"] and record["status"] == 200
    assert (record["answered"], record["unanswered_reason"]) == (False, "client_gone")


async def test_in_flight_idem_lists_the_keyed_requests_in_flight(
    server: ThreadedProviderServer,
) -> None:
    server.configure(latency_ms=(500.0, 500.0), idempotency="ignore")
    async with httpx.AsyncClient() as client:
        calls = [
            asyncio.create_task(find(server, client, key, {**PERSON, "first_name": name}))
            for key, name in (("a", "A"), ("b", "B"), ("b", "C"), (None, "D"))
        ]
        ledger = await asyncio.to_thread(
            server.wait_ledger, lambda snapshot: snapshot["in_flight"] == 4
        )
        assert ledger["in_flight_idem"] == sorted(map(idem_digest, ["a", "b", "b"]))
        assert [r.status_code for r in await asyncio.gather(*calls)] == [200] * 4
    ledger = server.ledger()
    assert (ledger["in_flight_idem"], ledger["charged"], ledger["charged_unanswered"]) == (
        [],
        4,
        0,
    )
    assert sorted(c["idem"] for c in server.calls()) == sorted(
        ["", *map(idem_digest, ["a", "b", "b"])]
    )


_CLIENT = """
import sys, httpx
httpx.post(sys.argv[1], json={"first_name": "Ada", "last_name": "Lovelace", "domain": "x.io"},
           headers={"X-Api-Key": "k", "Idempotency-Key": sys.argv[2]}, timeout=120)
print("answered", flush=True)
"""


def test_a_sigkilled_client_is_charged_and_counted_client_gone() -> None:
    """A client process killed while its call sleeps in the latency: charged, never answered.

    The latency is long only so the kill surely lands inside it; nothing waits it out
    but the final ``wait_idle``.
    """
    config = {"latency_ms": [4000, 4000], "idempotency": "ignore"}
    with ProviderServerProcess(config) as proc:
        key, url = "killed-1", f"{proc.base_url}{EMAIL_FIND}"
        child = subprocess.Popen([sys.executable, "-c", _CLIENT, url, key], stdout=subprocess.PIPE)
        try:
            at_kill = proc.wait_in_flight(idem_digest(key), timeout_s=60)
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            out, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL
        assert b"answered" not in out
        assert at_kill["in_flight_idem"] == [idem_digest(key)]
        assert at_kill["charged"] == 0

        ledger = proc.wait_idle(timeout_s=60)
        assert (ledger["charged"], ledger["charged_unanswered"]) == (1, 1)
        assert ledger["charged_unanswered_by_reason"] == {"client_gone": 1}
        (record,) = proc.calls(since=0.0)
        assert (record["idem"], record["charged"], record["answered"]) == (
            idem_digest(key),
            True,
            False,
        )
        assert record["unanswered_reason"] == "client_gone"
