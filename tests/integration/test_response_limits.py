"""Provider answers that must not hold a worker or reach a receipt (review F12).

A small HTTP/1.1 server on loopback, written against raw sockets so it can send what
no framework would: a body that trickles in a byte at a time forever, a body larger
than the catalog's ``max_response_bytes`` (declared, and chunked with no length), JSON
nested deep enough to exhaust the parser, and JSON with ``NaN``. Every case runs on
both HTTP transports (aiohttp underneath httpx, and httpx's own), through
``ProviderClient``; the last cases also go through the receipt store.

No timing is asserted: a trickling body must end in ``ProviderTimeout`` at all
(without the total deadline it never ends); the outer ``wait_for`` only keeps a
regression from hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from playline.calls.catalog import Catalog, ToolSpec
from playline.calls.http import ProviderClient
from playline.calls.live import RetryPolicy
from playline.calls.runner import ToolRunner
from playline.calls.transport import Transport, make_http_client
from playline.errors import CallAmbiguous, ProviderError, ProviderTimeout, ProviderTransientError
from playline.stores.receipts import receipt_key
from playline.stores.receipts_ledger import ReceiptLedger
from tests import conftest

TRANSPORTS: list[Transport] = ["httpx", "aiohttp"]

#: The cap the catalog sets for these tests' provider.
CAP = 4096
#: Long enough for a loaded machine to connect and send; far shorter than "forever".
DEADLINE_S = 1.5
#: How long a test may take before it counts as hung.
HUNG_S = 60.0

DEEP = b"[" * 100_000 + b"]" * 100_000


class CraftedServer:
    """Answers ``POST <path>`` with a crafted response; records the paths it was sent."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.trickled = 0  # bytes of trickling bodies written so far
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def __aenter__(self) -> CraftedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:  # keep-alive: one request after another on the connection
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length:
                    await reader.readexactly(length)
                self.paths.append(path)
                await self._answer(path, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, path: str, writer: asyncio.StreamWriter) -> None:
        if path == "/trickle":
            # A length it will never reach; one byte at a time, each long before any
            # per-read timeout, for as long as the client listens.
            writer.write(_head(200, length=1_000_000))
            writer.write(b'{"padding": "')
            while True:
                writer.write(b"x")
                await writer.drain()
                self.trickled += 1
                await asyncio.sleep(0.05)
        elif path == "/big-declared":
            writer.write(_head(200, length=CAP + 1) + b'"' + b"x" * (CAP - 1) + b'"')
        elif path == "/big-chunked":
            writer.write(_head(200, chunked=True))
            piece = b"x" * 1024
            for _ in range(CAP // len(piece) + 4):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        elif path == "/deep":
            writer.write(_head(200, length=len(DEEP)) + DEEP)
        elif path == "/nan":
            body = b'{"email": "ada@example.com", "score": NaN}'
            writer.write(_head(200, length=len(body)) + body)
        elif path == "/infinity":
            body = b'{"email": "ada@example.com", "score": [1, -Infinity]}'
            writer.write(_head(200, length=len(body)) + body)
        else:  # /ok
            body = b'{"email": "ada@example.com", "score": 0.5}'
            writer.write(_head(200, length=len(body)) + body)
        await writer.drain()


def _head(status: int, *, length: int | None = None, chunked: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} OK", "Content-Type: application/json"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


ROUTES = ("ok", "trickle", "big-declared", "big-chunked", "deep", "nan", "infinity")


def catalog_for(
    base_url: str, *, cap: int | None = None, idempotency: str | None = None
) -> Catalog:
    provider: dict[str, Any] = {
        "base_url": base_url,
        "auth": {"env": "P_KEY", "header": "X-Api-Key"},
        "timeout_s": DEADLINE_S,
    }
    if idempotency is not None:
        provider["idempotency"] = idempotency
    if cap is not None:
        provider["max_response_bytes"] = cap
    return Catalog.model_validate(
        {
            "providers": {"p": provider},
            "tools": {
                route.replace("-", "_"): {
                    "provider": "p",
                    "path": f"/{route}",
                    "input": {"q": "str"},
                }
                for route in ROUTES
            },
        }
    )


@pytest.fixture
async def server() -> AsyncIterator[CraftedServer]:
    async with CraftedServer() as running:
        yield running


@contextlib.asynccontextmanager
async def provider_client(catalog: Catalog, transport: Transport) -> AsyncIterator[ProviderClient]:
    http = make_http_client(transport=transport)
    try:
        yield ProviderClient(catalog, http, environ={"P_KEY": "the-key"})
    finally:
        await http.aclose()


async def send(client: ProviderClient, tool: ToolSpec, key: str = "idem") -> Any:
    return await asyncio.wait_for(client.send(tool, {"q": "x"}, idempotency_key=key), HUNG_S)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_body_that_trickles_forever_is_cut_by_the_total_deadline(
    server: CraftedServer, transport: Transport
) -> None:
    catalog = catalog_for(server.base_url)
    async with provider_client(catalog, transport) as client:
        with pytest.raises(ProviderTimeout, match="no whole answer from p within") as cut:
            await send(client, catalog.tool("trickle"))
        assert cut.value.may_have_charged  # the request was sent: it may have been charged
        assert server.trickled > 0  # bytes kept coming: no per-read timeout would fire
        # The client is still usable after the cut.
        assert (await send(client, catalog.tool("ok"), "after"))["score"] == 0.5
    assert server.paths == ["/trickle", "/ok"]


@pytest.mark.parametrize("route", ["big-declared", "big-chunked"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_body_over_max_response_bytes_is_refused_naming_the_cap(
    server: CraftedServer, transport: Transport, route: str
) -> None:
    catalog = catalog_for(server.base_url, cap=CAP)
    async with provider_client(catalog, transport) as client:
        with pytest.raises(ProviderTransientError, match=rf"more than {CAP} bytes") as refused:
            await send(client, catalog.tool(route.replace("-", "_")))
        assert "max_response_bytes" in str(refused.value)
        assert refused.value.may_have_charged
        # A body at the cap is fine, and the client still works after a refusal.
        assert (await send(client, catalog.tool("ok"), "after"))["email"] == "ada@example.com"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_cap_is_per_provider_and_a_body_under_it_is_read(
    server: CraftedServer, transport: Transport
) -> None:
    catalog = catalog_for(server.base_url, cap=CAP * 4)  # both big bodies fit now
    async with provider_client(catalog, transport) as client:
        assert (await send(client, catalog.tool("big_declared"))) == "x" * (CAP - 1)
        with pytest.raises(ProviderTransientError, match="not JSON"):
            await send(client, catalog.tool("big_chunked"), "chunked")  # read whole: not JSON


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_deep_json_is_a_provider_error(server: CraftedServer, transport: Transport) -> None:
    catalog = catalog_for(server.base_url)
    async with provider_client(catalog, transport) as client:
        with pytest.raises(ProviderTransientError, match="answered 200 with a body that is not"):
            await send(client, catalog.tool("deep"))  # not RecursionError


@pytest.mark.parametrize(
    ("route", "value"), [("nan", None), ("infinity", [1, None])], ids=["nan", "infinity"]
)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_nan_and_infinity_read_as_null_so_a_paid_answer_can_be_kept(
    server: CraftedServer, transport: Transport, route: str, value: object
) -> None:
    """JSON has no NaN or Infinity (no store keeps them: PostgreSQL's jsonb refuses
    them); the answer was paid for, so the rest of it is kept and those read as null."""
    catalog = catalog_for(server.base_url)
    async with provider_client(catalog, transport) as client:
        answer = await send(client, catalog.tool(route))
    assert answer == {"email": "ada@example.com", "score": value}


def live_runner(catalog: Catalog, store: ReceiptLedger, client: ProviderClient) -> ToolRunner:
    return conftest.live_runner(
        catalog,
        store,
        client,
        owner="t",
        lease_id="L1",
        lease_ttl_s=30,
        retry=RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05),
    )


@pytest.mark.parametrize(
    ("idempotency", "status", "raised"),
    [("key", "failed", ProviderTransientError), ("none", "ambiguous", CallAmbiguous)],
)
async def test_an_unusable_answer_is_never_stored_and_its_receipt_is_settled(
    server: CraftedServer, tmp_path: Path, idempotency: str, status: str, raised: type
) -> None:
    """Deep JSON used to escape as RecursionError, leaving the receipt running (re-paid
    on every rerun)."""
    route = "deep"
    catalog = catalog_for(server.base_url, idempotency=idempotency)
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        async with provider_client(catalog, "aiohttp") as client:
            runner = live_runner(catalog, store, client)
            with pytest.raises(raised) as error:
                await asyncio.wait_for(runner.call(route, {"q": "x"}), HUNG_S)
            assert isinstance(error.value, ProviderError | CallAmbiguous)
            tool = catalog.tool(route)
            key = receipt_key(tool.id, tool.version, {"q": "x"}, client.auth_scope(tool))
        receipt = (await store.get([key]))[key]
        assert receipt.status == status  # settled: neither completed nor left running
        assert receipt.result is None
    finally:
        await store.close()
    # A tool that de-duplicates was retried (free); one that does not, sent once.
    assert len(server.paths) == (2 if idempotency == "key" else 1)


async def test_an_answer_with_nan_is_stored_with_null(
    server: CraftedServer, tmp_path: Path
) -> None:
    """NaN used to reach the receipt as a float (which PostgreSQL's jsonb refuses and
    no export can show); now the paid answer is completed, its NaN read as null."""
    catalog = catalog_for(server.base_url, idempotency="none")
    store = ReceiptLedger.in_file(tmp_path / "receipts.db")
    try:
        async with provider_client(catalog, "aiohttp") as client:
            runner = live_runner(catalog, store, client)
            result = await asyncio.wait_for(runner.call("nan", {"q": "x"}), HUNG_S)
            tool = catalog.tool("nan")
            key = receipt_key(tool.id, tool.version, {"q": "x"}, client.auth_scope(tool))
        assert result.data == {"email": "ada@example.com", "score": None}
        receipt = (await store.get([key]))[key]
        assert receipt.status == "completed"
        assert receipt.result == {"email": "ada@example.com", "score": None}
    finally:
        await store.close()
    assert server.paths == ["/nan"]


@contextlib.contextmanager
def unreachable_port() -> Any:
    """A port on loopback that accepts no connection in time: a listening socket with a
    backlog of 0 and its queue already full, so a new connection's SYN goes unanswered."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_connection_never_made_is_not_a_call_that_may_have_charged(
    transport: Transport,
) -> None:
    """Connecting gives up before the exchange's deadline, so a provider that takes no
    connection is a definitive failure (retried, never marked ambiguous)."""
    with unreachable_port() as port:
        catalog = catalog_for(f"http://127.0.0.1:{port}")
        async with provider_client(catalog, transport) as client:
            with pytest.raises(ProviderTimeout, match="could not connect to p within") as failed:
                await send(client, catalog.tool("ok"))
    assert not failed.value.may_have_charged
