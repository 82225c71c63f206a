"""httpx over aiohttp behaves exactly as httpx's own transport did, through ProviderClient.

Real HTTP (and HTTPS with a self-signed certificate, and a real forward proxy) on
loopback; every behaviour is checked on both transports, so the faster one is adopted
without changing what playline does on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from playline.calls.catalog import Catalog, ToolSpec
from playline.calls.http import ProviderClient
from playline.calls.transport import Transport, make_http_client
from playline.errors import ProviderTimeout, ProviderTransientError
from playline.pacing.sending import sending_stamp
from playline.provider_server.process import bind_socket

TRANSPORTS: list[Transport] = ["httpx", "aiohttp"]


class Recorder:
    def __init__(self) -> None:
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.slow_started = threading.Event()
        self.arrived: list[float] = []


def make_app(seen: Recorder) -> Starlette:
    async def ok(request: Request) -> Response:
        seen.arrived.append(time.perf_counter())
        seen.paths.append(request.url.path)
        seen.headers.append(dict(request.headers))
        body = await request.json()
        return JSONResponse(
            {"echo": body, "idempotency_key": request.headers.get("idempotency-key")}
        )

    async def redirect(request: Request) -> Response:
        seen.paths.append(request.url.path)
        return RedirectResponse("/ok", status_code=307)

    async def echo_key(request: Request) -> Response:
        seen.paths.append(request.url.path)
        return JSONResponse({"you_sent": request.headers.get("x-api-key"), "email": "a@b.c"})

    async def conflict(request: Request) -> Response:
        seen.paths.append(request.url.path)
        return JSONResponse({"error": "a request with this Idempotency-Key is in flight"}, 409)

    async def cookie(request: Request) -> Response:
        seen.paths.append(request.url.path)
        seen.headers.append(dict(request.headers))
        response = JSONResponse({"ok": True})
        response.set_cookie("session", "account-a", path="/")
        return response

    async def slow(request: Request) -> Response:
        seen.paths.append(request.url.path)
        seen.slow_started.set()
        await asyncio.sleep(3)
        return JSONResponse({"late": True})

    return Starlette(
        routes=[
            Route("/ok", ok, methods=["POST"]),
            Route("/redirect", redirect, methods=["POST"]),
            Route("/slow", slow, methods=["POST"]),
            Route("/conflict", conflict, methods=["POST"]),
            Route("/echo-key", echo_key, methods=["POST"]),
            Route("/cookie", cookie, methods=["POST"]),
        ]
    )


@contextlib.contextmanager
def serve(app: Starlette, **ssl: Any) -> Iterator[int]:
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="error", lifespan="off", http="h11", **ssl)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


def catalog_for(base_url: str, timeout_s: float = 5.0) -> Catalog:
    return Catalog.model_validate(
        {
            "providers": {
                "p": {
                    "base_url": base_url,
                    "auth": {"env": "P_KEY", "header": "X-Api-Key"},
                    "timeout_s": timeout_s,
                }
            },
            "tools": {
                "ok": {"provider": "p", "path": "/ok"},
                "redirect": {"provider": "p", "path": "/redirect"},
                "slow": {"provider": "p", "path": "/slow"},
                "conflict": {"provider": "p", "path": "/conflict"},
                "echo": {"provider": "p", "path": "/echo-key"},
                "cookie": {"provider": "p", "path": "/cookie"},
            },
        }
    )


@contextlib.asynccontextmanager
async def provider_client(catalog: Catalog, transport: Transport) -> AsyncIterator[ProviderClient]:
    http = make_http_client(transport=transport)
    try:
        yield ProviderClient(catalog, http, environ={"P_KEY": "the-key"})
    finally:
        await http.aclose()


def tool(catalog: Catalog, name: str) -> ToolSpec:
    return catalog.tool(name)


@pytest.fixture
def seen() -> Recorder:
    return Recorder()


@pytest.fixture
def plain(seen: Recorder) -> Iterator[str]:
    with serve(make_app(seen)) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_headers_and_body_arrive_as_sent(
    plain: str, seen: Recorder, transport: Transport
) -> None:
    catalog = catalog_for(plain)
    async with provider_client(catalog, transport) as client:
        data = await client.send(tool(catalog, "ok"), {"q": "é"}, idempotency_key="idem-1")
    assert data == {"echo": {"q": "é"}, "idempotency_key": "idem-1"}
    assert seen.headers[0]["x-api-key"] == "the-key"
    assert seen.headers[0]["accept"] == "application/json"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_transport_stamps_each_request_once_as_it_leaves(
    plain: str, seen: Recorder, transport: Transport
) -> None:
    """The governor spaces a no-burst key's calls from this stamp (pacing.sending): one
    per request, before the provider has it, the first over a new connection too."""
    catalog = catalog_for(plain)
    async with provider_client(catalog, transport) as client:
        for n in range(3):
            stamps: list[float] = []
            with sending_stamp(lambda stamps=stamps: stamps.append(time.perf_counter())):
                started = time.perf_counter()
                await client.send(tool(catalog, "ok"), {"n": n}, idempotency_key=f"s{n}")
            assert len(stamps) == 1
            assert started <= stamps[0] <= seen.arrived[n]
        await client.send(tool(catalog, "ok"), {}, idempotency_key="unstamped")  # no permit
    assert len(seen.arrived) == 4


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_redirects_are_not_followed(plain: str, seen: Recorder, transport: Transport) -> None:
    catalog = catalog_for(plain)
    async with provider_client(catalog, transport) as client:
        with pytest.raises(
            ProviderTransientError, match="answered 307 with a body that is not JSON"
        ):
            await client.send(tool(catalog, "redirect"), {}, idempotency_key="idem-2")
    assert seen.paths == ["/redirect"]  # the Location was never requested


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_key_echoed_in_a_result_is_scrubbed_before_anyone_keeps_it(
    plain: str, seen: Recorder, transport: Transport
) -> None:
    catalog = catalog_for(plain)
    async with provider_client(catalog, transport) as client:
        data = await client.send(tool(catalog, "echo"), {}, idempotency_key="echo")
    assert data == {"you_sent": "[redacted]", "email": "a@b.c"}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_cookie_a_provider_sets_is_never_sent_back(
    plain: str, seen: Recorder, transport: Transport
) -> None:
    """One client serves every account: a session cookie must not follow another key."""
    catalog = catalog_for(plain)
    async with provider_client(catalog, transport) as client:
        for n in range(2):
            await client.send(tool(catalog, "cookie"), {}, idempotency_key=f"c{n}")
    assert seen.paths == ["/cookie", "/cookie"]
    assert "cookie" not in seen.headers[1]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_idempotency_conflict_is_retried_not_rejected(
    plain: str, seen: Recorder, transport: Transport
) -> None:
    catalog = catalog_for(plain)
    async with provider_client(catalog, transport) as client:
        with pytest.raises(ProviderTransientError, match=r"answered 409 .*still in flight"):
            await client.send(tool(catalog, "conflict"), {}, idempotency_key="busy")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_provider_timeout_applies(
    plain: str, seen: Recorder, transport: Transport
) -> None:
    catalog = catalog_for(plain, timeout_s=0.3)
    async with provider_client(catalog, transport) as client:
        # The server answers (200) after 3 s; only an enforced timeout yields this error.
        with pytest.raises(ProviderTimeout, match=r"no whole answer from p within 0\.3s"):
            await client.send(tool(catalog, "slow"), {}, idempotency_key="idem-3")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_cancelled_call_stops_and_the_client_stays_usable(
    plain: str, seen: Recorder, transport: Transport
) -> None:
    catalog = catalog_for(plain)
    async with provider_client(catalog, transport) as client:
        call = asyncio.ensure_future(client.send(tool(catalog, "slow"), {}, idempotency_key="s"))
        await asyncio.to_thread(seen.slow_started.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        data = await client.send(tool(catalog, "ok"), {"after": 1}, idempotency_key="after")
    assert data["echo"] == {"after": 1}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_refused_connection_is_a_connection_error_not_a_timeout(
    transport: Transport,
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    catalog = catalog_for(f"http://127.0.0.1:{port}")
    async with provider_client(catalog, transport) as client:
        with pytest.raises(ProviderTransientError, match="connection to p failed"):
            await client.send(tool(catalog, "ok"), {}, idempotency_key="refused")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tls_is_verified_and_trust_comes_from_the_environment(
    seen: Recorder,
    certificate: tuple[Path, Path],
    transport: Transport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cert, key = certificate
    with serve(make_app(seen), ssl_certfile=str(cert), ssl_keyfile=str(key)) as port:
        catalog = catalog_for(f"https://127.0.0.1:{port}")
        async with provider_client(catalog, transport) as client:
            with pytest.raises(ProviderTransientError, match="connection to p failed"):
                await client.send(tool(catalog, "ok"), {}, idempotency_key="tls-1")
        assert seen.paths == []  # refused before any request was sent
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trust it, as a user would
        async with provider_client(catalog, transport) as client:
            data = await client.send(tool(catalog, "ok"), {"tls": True}, idempotency_key="tls-2")
    assert data["echo"] == {"tls": True}


class ForwardProxy:
    """A minimal HTTP forward proxy (absolute-form requests), recording what it relays."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, url, version = lines[0].split(" ")
            self.requests.append(f"{method} {url}")
            length = next(
                (int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")), 0
            )
            while len(body) < length:
                body += conn.recv(65536)
            hostport, _, path = url.removeprefix("http://").partition("/")
            host, _, port = hostport.partition(":")
            headers = [h for h in lines[1:] if not h.lower().startswith(("connection", "proxy-"))]
            upstream = socket.create_connection((host, int(port)))
            with upstream:
                request = "\r\n".join(
                    [f"{method} /{path} {version}", *headers, "Connection: close"]
                )
                upstream.sendall(request.encode() + b"\r\n\r\n" + body)
                while chunk := upstream.recv(65536):
                    conn.sendall(chunk)

    def close(self) -> None:
        self._sock.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_proxies_come_from_the_environment(
    plain: str, seen: Recorder, transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = ForwardProxy()
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        catalog = catalog_for(plain)
        async with provider_client(catalog, transport) as client:
            data = await client.send(tool(catalog, "ok"), {"via": "proxy"}, idempotency_key="px")
    finally:
        proxy.close()
    assert data["echo"] == {"via": "proxy"}
    assert proxy.requests == [f"POST {plain}/ok"]
    assert seen.headers[0]["idempotency-key"] == "px"
