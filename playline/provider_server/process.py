"""Starting and stopping the local provider server from tests, benchmarks and the demo.

Two ways, both returning a handle with ``.base_url`` and admin helpers:

* ``ProviderServerProcess``: the server in a **subprocess** (its own interpreter,
  so its CPU does not compete with the caller's event loop and a crash cannot
  take the caller down). A sync and async context manager.
* ``start_in_thread``: uvicorn in a daemon thread of this process; quick to start,
  for unit tests. Its ``ProviderServer`` state is reachable as ``.state``.

Both handles poll the ledger with ``wait_ledger`` / ``wait_idle`` rather than
sleeping: a test that kills a client or injects a held fault waits for the
server to reach the state it asserts on, so nothing depends on how fast a shared
machine happens to be. They block; call them via ``asyncio.to_thread`` from a
test whose own event loop must keep sending.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import httpx
import uvicorn
from starlette.applications import Starlette

from playline.children import die_with_parent
from playline.provider_server.app import ProviderServer, create_app
from playline.provider_server.config import ServerConfig
from playline.sockets import bind_socket, free_port

READY_PREFIX = "provider server listening on "
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class ProviderServerError(RuntimeError):
    """The provider server could not be started (the message says why)."""


class _Server(uvicorn.Server):
    """A uvicorn server that calls ``on_started`` once it accepts connections."""

    def __init__(
        self, config: uvicorn.Config, on_started: Callable[[], None] | None = None
    ) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_started is not None:
            self._on_started()


def make_uvicorn_server(
    config: ServerConfig, on_started: Callable[[], None] | None = None
) -> uvicorn.Server:
    """A quiet, fast uvicorn server around a fresh provider app."""
    uv_config = uvicorn.Config(
        create_app(config),
        log_level="warning",
        access_log=False,
        http="h11",
        loop="asyncio",
        lifespan="off",
        timeout_graceful_shutdown=2,
        backlog=4096,
    )
    return _Server(uv_config, on_started)


def _as_config(config: ServerConfig | dict[str, Any] | None) -> ServerConfig:
    if isinstance(config, ServerConfig):
        return config
    return ServerConfig.model_validate(config or {})


class AdminClient:
    """Admin helpers shared by both handles; needs ``base_url``."""

    base_url: str

    def _admin(self, method: str, path: str, json: Any = None) -> Any:
        response = httpx.request(method, f"{self.base_url}{path}", json=json, timeout=10.0)
        response.raise_for_status()
        return response.json()

    def ledger(self) -> dict[str, Any]:
        """The server's ledger (``GET /_admin/ledger``)."""
        result: dict[str, Any] = self._admin("GET", "/_admin/ledger")
        return result

    def changed_answers(self) -> dict[str, list[dict[str, Any]]]:
        """Per endpoint path, the inputs whose latest answer differed from epoch 0's
        (``GET /_admin/changed``; see :mod:`~playline.provider_server.epochs`)."""
        result: dict[str, list[dict[str, Any]]] = self._admin("GET", "/_admin/changed")["changed"]
        return result

    def calls(self, since: float = 0.0, limit: int | None = None) -> list[dict[str, Any]]:
        """Per-call records with a server monotonic time after ``since`` (the newest ``limit``)."""
        query = f"since={since}" + (f"&limit={limit}" if limit is not None else "")
        result: list[dict[str, Any]] = self._admin("GET", f"/_admin/calls?{query}")["calls"]
        return result

    def wait_ledger(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout_s: float = 30.0,
        interval_s: float = 0.02,
    ) -> dict[str, Any]:
        """Poll the ledger until ``predicate(ledger)`` holds; returns that ledger.

        Raises ``TimeoutError`` (with the last ledger) after ``timeout_s``: a
        generous bound for a stuck server, not a timing assertion.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            ledger = self.ledger()
            if predicate(ledger):
                return ledger
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the ledger did not reach the state within {timeout_s:g}s: {ledger}"
                )
            time.sleep(interval_s)

    def wait_idle(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The ledger once no request is in flight (held faults and latency sleeps done)."""
        return self.wait_ledger(lambda ledger: ledger["in_flight"] == 0, timeout_s)

    def wait_in_flight(self, idem: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The ledger once a request with idem digest ``idem`` (``idem_digest``) is in flight."""
        return self.wait_ledger(lambda ledger: idem in ledger["in_flight_idem"], timeout_s)

    def reset(self) -> None:
        """Clear the ledger, idempotency store and rate limiters."""
        self._admin("POST", "/_admin/reset")

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Merge ``changes`` into the server config; returns the new (redacted) config."""
        result: dict[str, Any] = self._admin("POST", "/_admin/config", json=changes)
        return result

    def current_config(self) -> dict[str, Any]:
        """The current config, API keys redacted."""
        result: dict[str, Any] = self._admin("GET", "/_admin/config")
        return result


class ProviderServerProcess(AdminClient):
    """The provider server in a subprocess; use as ``with`` or ``async with``.

    ``port=0`` picks a free port. Startup waits until ``/healthz`` answers, or
    raises ``ProviderServerError`` with the tail of the subprocess's stderr.
    """

    def __init__(
        self,
        config: ServerConfig | dict[str, Any] | None = None,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 20.0,
        env: dict[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.config = _as_config(config)
        #: stop the server when the process that started it dies (Linux), even by SIGKILL
        self.die_with_parent = die_with_parent
        self.host = host
        self.port = port or free_port(host)
        self.base_url = f"http://{host}:{self.port}"
        self.startup_timeout_s = startup_timeout_s
        self._extra_env = env or {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [
            sys.executable,
            "-m",
            "playline.provider_server",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--config-json",
            self.config.model_dump_json(),
        ]

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **self._extra_env}
        paths = [str(_PACKAGE_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def start(self) -> ProviderServerProcess:
        """Start the subprocess and wait until it is healthy."""
        if self._proc is not None:
            raise ProviderServerError("the provider server process is already running")
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=self._env(),
            # Only when asked: the kernel ties the child to the *thread* that started
            # it, and ``__aenter__`` starts it from a worker thread.
            preexec_fn=die_with_parent if self.die_with_parent else None,
        )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ProviderServerError(
                    f"provider server exited with code {self._proc.returncode} during startup; "
                    f"stderr:\n{self.stderr_tail()}"
                )
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise ProviderServerError(
            f"provider server did not answer {self.base_url}/healthz within "
            f"{self.startup_timeout_s:g}s; stderr:\n{self.stderr_tail()}"
        )

    def stderr_tail(self, max_bytes: int = 4000) -> str:
        """The last ``max_bytes`` of the subprocess's stderr."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - max_bytes))
        return self._stderr.read().decode(errors="replace") or "(empty)"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate the subprocess, kill it if it does not exit within ``timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> ProviderServerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> ProviderServerProcess:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)


class ThreadedProviderServer(AdminClient):
    """The provider server running in a daemon thread of this process."""

    def __init__(self, server: uvicorn.Server, sock: socket.socket, host: str) -> None:
        self._server = server
        self._socket = sock
        self.host = host
        self.port: int = sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="provider-server", daemon=True
        )

    @property
    def state(self) -> ProviderServer:
        """The live server state (config, ledger); only read it from tests."""
        app = cast(Starlette, self._server.config.app)
        state: ProviderServer = app.state.provider_server
        return state

    def _start(self, timeout_s: float) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ProviderServerError(
                    f"provider server thread did not start on {self.base_url}"
                )
            time.sleep(0.01)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> ThreadedProviderServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_in_thread(
    config: ServerConfig | dict[str, Any] | None = None,
    port: int = 0,
    host: str = "127.0.0.1",
    startup_timeout_s: float = 10.0,
) -> ThreadedProviderServer:
    """Start the server in a daemon thread; returns once it accepts connections."""
    handle = ThreadedProviderServer(
        make_uvicorn_server(_as_config(config)), bind_socket(host, port), host
    )
    handle._start(startup_timeout_s)
    return handle
