"""CSV URLs over real HTTP: opt-in, public addresses only on every redirect hop (IP
literals and names alike), a size cap, and messages that name the URL without its
query or credentials. The servers are real, on loopback; the loopback address stands
in for every private one (it is refused the same way unless allow-listed)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from playline.config import Settings
from playline.datasets.load import MAX_REDIRECTS, PublicAddressResolver, download_csv
from playline.errors import InvalidPlayInput

CSV = b"id,name\n1,Ann\n2,Bo\n"


class Server:
    """A loopback HTTP server whose routes the test sets; it counts every request."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.requests: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_GET(self) -> None:
                owner.requests.append(self.path)
                status, headers, body = owner.routes.get(self.path.split("?")[0], (404, {}, b""))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in headers and "X-No-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def file(self, path: str, body: bytes = CSV) -> str:
        self.routes[path] = (200, {}, body)
        return self.base + path

    def redirect(self, path: str, to: str, status: int = 302) -> str:
        self.routes[path] = (status, {"Location": to}, b"")
        return self.base + path

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[Server, Server]]:
    """Two servers: ``a`` (allow-listed by port in :func:`allowing`) and ``b`` (not)."""
    a, b = Server(), Server()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def allowing(*servers: Server, max_bytes: int | None = None) -> Settings:
    """URL loads on, these servers' ``127.0.0.1:port`` allow-listed (internal file servers)."""
    settings = Settings(
        url_loads=True, url_allow_hosts=tuple(f"127.0.0.1:{s.port}" for s in servers)
    )
    return settings.with_overrides(url_max_bytes=max_bytes)


async def fetch(settings: Settings, url: str, downloads: Path) -> bytes:
    async with download_csv(settings, url, directory=downloads) as local:
        return local.read_bytes()


async def refused(settings: Settings, url: str, downloads: Path) -> str:
    """The one-line refusal of ``url``; nothing may be left in ``downloads``."""
    with pytest.raises(InvalidPlayInput) as info:
        await fetch(settings, url, downloads)
    message = str(info.value)
    assert "\n" not in message
    assert not downloads.exists() or list(downloads.iterdir()) == []
    return message


async def test_url_loads_are_off_by_default_and_nothing_is_requested(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    a, _ = servers
    message = await refused(Settings(), a.file("/x.csv"), tmp_path)
    assert "this worker does not download CSV URLs; set PLAYLINE_URL_LOADS=on" in message
    assert a.requests == []


async def test_a_loopback_address_is_refused_without_an_allow_list(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    a, _ = servers
    message = await refused(Settings(url_loads=True), a.file("/x.csv") + "?sig=SECRET", tmp_path)
    assert message == (
        f"CSV URL {a.base}/x.csv?…: 127.0.0.1 is not a public address; CSV URLs reach public "
        "addresses only; add the host to PLAYLINE_URL_ALLOW_HOSTS on the workers if it is a "
        "server you trust"
    )
    assert a.requests == []  # refused before connecting


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://10.0.0.1/x.csv",
        "http://[::1]:9/x.csv",
        "http://[fe80::1]/x.csv",
        "http://0.0.0.0:9/x.csv",
        "http://[::ffff:127.0.0.1]:9/x.csv",
    ],
)
async def test_private_and_link_local_literals_are_refused_before_connecting(
    url: str, tmp_path: Path
) -> None:
    message = await refused(Settings(url_loads=True), url, tmp_path)
    assert "is not a public address" in message


async def test_a_name_resolving_to_loopback_is_refused_by_its_addresses(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    a, _ = servers
    a.file("/x.csv")
    message = await refused(Settings(url_loads=True), f"http://localhost:{a.port}/x.csv", tmp_path)
    assert message.startswith(
        f"CSV URL http://localhost:{a.port}/x.csv: localhost resolves to a non-public address;"
    )
    assert a.requests == []


async def test_an_allow_listed_host_is_fetched(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    a, _ = servers
    assert await fetch(allowing(a), a.file("/x.csv"), tmp_path / "d") == CSV
    by_name = Settings(url_loads=True, url_allow_hosts=(f"localhost:{a.port}",))
    assert await fetch(by_name, f"http://localhost:{a.port}/x.csv", tmp_path / "d") == CSV
    assert list((tmp_path / "d").iterdir()) == []


async def test_every_redirect_hop_is_checked(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    """An allowed (or public) host that redirects inward does not take the worker there."""
    a, b = servers
    inner = b.file("/x.csv")
    for status in (301, 302, 303, 307, 308):
        message = await refused(allowing(a), a.redirect("/go", inner, status), tmp_path)
        assert message.startswith(
            f"CSV URL {a.base}/go (redirected to {b.base}/x.csv): 127.0.0.1 is not a public "
            "address;"
        )
    metadata = "http://169.254.169.254/latest/meta-data/?token=SECRET"
    message = await refused(allowing(a), a.redirect("/meta", metadata), tmp_path)
    assert "(redirected to http://169.254.169.254/latest/meta-data/?…)" in message
    assert "SECRET" not in message
    message = await refused(
        allowing(a), a.redirect("/name", f"http://localhost:{b.port}/x.csv"), tmp_path
    )
    assert "localhost resolves to a non-public address" in message
    assert b.requests == []
    # a relative redirect on the allowed host is followed
    a.file("/real.csv")
    assert await fetch(allowing(a), a.redirect("/rel", "/real.csv"), tmp_path) == CSV
    # and one to the other host once it is allowed too
    assert await fetch(allowing(a, b), a.redirect("/go", inner), tmp_path) == CSV


async def test_at_most_five_redirects_and_only_http_and_https(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    a, _ = servers
    a.file("/hop0")
    for n in range(1, MAX_REDIRECTS + 2):
        a.redirect(f"/hop{n}", f"/hop{n - 1}")
    assert await fetch(allowing(a), f"{a.base}/hop{MAX_REDIRECTS}", tmp_path) == CSV
    message = await refused(allowing(a), f"{a.base}/hop{MAX_REDIRECTS + 1}", tmp_path)
    assert message == (
        f"CSV URL {a.base}/hop6 redirected more than 5 times; give the file's final URL"
    )
    for target in ("file:///etc/passwd", "ftp://files.example/x.csv", "gopher://x/"):
        message = await refused(allowing(a), a.redirect("/odd", target), tmp_path)
        assert message.endswith(": only http and https URLs are followed")


async def test_a_download_larger_than_the_cap_is_refused_and_deleted(
    servers: tuple[Server, Server], tmp_path: Path
) -> None:
    a, _ = servers
    body = b"id\n" + b"1\n" * 5000  # 10,003 bytes
    downloads = tmp_path / "downloads"
    assert (
        await fetch(allowing(a, max_bytes=len(body)), a.file("/big.csv", body), downloads) == body
    )
    too_big = (
        f"CSV URL {a.base}/big.csv is larger than 10000 bytes, the most this worker downloads "
        "(PLAYLINE_URL_MAX_BYTES); nothing was loaded"
    )
    # declared up front: refused before the body is read
    assert await refused(allowing(a, max_bytes=10_000), f"{a.base}/big.csv", downloads) == too_big
    # not declared (a body that ends when the connection closes): cut off while streaming
    a.routes["/big.csv"] = (200, {"X-No-Length": "1", "Connection": "close"}, body)
    assert await refused(allowing(a, max_bytes=10_000), f"{a.base}/big.csv", downloads) == too_big
    assert list(downloads.iterdir()) == []


class _Names(AbstractResolver):
    """A resolver answering from a table, as DNS would."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(hostname=host, host=a, port=port, family=family, proto=0, flags=0)
            for a in self.table[host]
        ]

    async def close(self) -> None:
        return None


async def test_the_resolver_passes_public_names_and_refuses_any_private_address() -> None:
    names = _Names(
        {
            "files.example": ["93.184.216.34", "2606:2800:220:1::248:1893"],
            "rebound.example": ["93.184.216.34", "10.0.0.7"],
            "metadata.example": ["169.254.169.254"],
            "files.internal": ["10.0.0.8"],
        }
    )
    resolver = PublicAddressResolver(["files.internal:443"], names)
    assert [r["host"] for r in await resolver.resolve("files.example", 443)] == [
        "93.184.216.34",
        "2606:2800:220:1::248:1893",
    ]
    for host in ("rebound.example", "metadata.example"):
        with pytest.raises(OSError, match=f"{host} resolves to a non-public address"):
            await resolver.resolve(host, 443)
    assert [r["host"] for r in await resolver.resolve("files.internal", 443)] == ["10.0.0.8"]
    with pytest.raises(OSError):
        await resolver.resolve("files.internal", 80)  # allowed on 443 only
