"""Fleet pacing when PostgreSQL goes away: the pacer rides out a restart and reports
an outage as :class:`FleetPacingUnavailable` (the governor then stops the chunk).

The pacer reaches the real server through a TCP relay of the test's own, so the test
can cut every connection (what a server restart does) or refuse new ones (a server
that is down) without touching the server other tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from playline.pacing.fleet_store import FleetPacer, FleetPacingUnavailable, FleetShare
from tests.pg import pg_schema

pytestmark = pytest.mark.postgres


class Relay:
    """Forwards TCP connections from a local port to PostgreSQL's."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        """Close every connection going through (the server restarted)."""
        for writer in list(self._writers):
            writer.transport.abort()

    async def stop(self) -> None:
        """Refuse new connections and cut the open ones (the server is down)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.cut()


@pytest.fixture
async def relayed() -> AsyncIterator[tuple[Relay, str]]:
    """A store URL on a schema of its own that goes through a :class:`Relay`."""
    async with pg_schema() as url:
        parts = urlsplit(url)
        relay = Relay(parts.hostname or "127.0.0.1", parts.port or 5432)
        await relay.start()
        netloc = f"{parts.username}@127.0.0.1:{relay.port}"
        yield relay, urlunsplit(parts._replace(netloc=netloc))
        await relay.stop()


async def test_a_restart_is_ridden_out_and_an_outage_is_unavailable(
    relayed: tuple[Relay, str],
) -> None:
    relay, url = relayed
    async with await FleetPacer.create(url, table_prefix="outage_") as pacer:
        assert await pacer.take("acme", rps=1000, burst=100) == 0.0
        await pacer.read_state()
        # Every connection cut, the server still there: the next calls reconnect.
        relay.cut()
        assert await pacer.take("acme") == 0.0
        assert "acme" in await pacer.read_state()
        relay.cut()  # ... a transaction's too
        assert await pacer.take_window_slot("acme", {60.0: 100}) == 0.0
        relay.cut()
        await pacer.publish_shares("w1", [FleetShare("acme", "team-a", 1.0, 3, 1)])
        # The server gone: a ticket fails, as unavailable, and so does a refresh.
        await relay.stop()
        with pytest.raises(FleetPacingUnavailable, match="reachable"):
            await pacer.take("acme")
        with pytest.raises(FleetPacingUnavailable):
            await pacer.read_state()
        # Back again: tickets come once the pool has reconnected.
        await relay.start()
        for _ in range(60):
            try:
                await pacer.take("acme")
                break
            except FleetPacingUnavailable:
                await asyncio.sleep(0.5)
        else:
            pytest.fail("no ticket after the server came back")
    with pytest.raises(FleetPacingUnavailable, match="closed"):  # a call after the close
        await pacer.take("acme")
