"""What a running ``playline dev`` left in its home: its processes and its task queue.

``playline dev`` writes ``HOME/dev.json`` once it is up and removes it when it stops.
The record serves two purposes:

* **Nothing stale is reused silently.** A ``dev`` killed without a chance to clean up
  (SIGKILL, a crashed terminal) may leave its Temporal server behind on its port. The
  next ``dev`` or ``demo`` in that home finds the record of a stack whose own process
  is gone, names what it left, and stops it, rather than quietly running on a server
  nobody owns.
* **Commands find the stack's task queue.** A ``dev`` that shares a Temporal server
  with another stack listens on a task queue of its own; ``playline run`` (and every
  command taking ``--task-queue``) run in the same home use it when neither
  ``--task-queue`` nor ``$PLAYLINE_TASK_QUEUE`` says otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["StackRecord", "alive", "live_stack_queue", "stop_process"]

RECORD = "dev.json"


def alive(pid: int | None) -> bool:
    """Whether a process with this id exists (and is not a zombie we could reap)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def stop_process(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``: a process left behind, stopped."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class StackRecord:
    """A ``playline dev`` stack: its own process, what it started, where it listens."""

    pid: int
    task_queue: str
    temporal_address: str
    #: the Temporal dev server it started (``None``: it reused one)
    temporal_pid: int | None = None
    #: the local provider server it started
    provider_pid: int | None = None

    def write(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        path = home / RECORD
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self)))
        temporary.replace(path)

    @classmethod
    def read(cls, home: Path) -> StackRecord | None:
        """The record in ``home``, if any (a damaged one reads as none)."""
        try:
            data = json.loads((home / RECORD).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None

    @staticmethod
    def remove(home: Path, pid: int) -> None:
        """Remove the record if it is the stack ``pid``'s (not a newer stack's)."""
        record = StackRecord.read(home)
        if record is not None and record.pid == pid:
            with contextlib.suppress(OSError):
                (home / RECORD).unlink()

    def left_behind(self) -> list[tuple[str, int]]:
        """What this stack started that still runs although the stack itself is gone."""
        if alive(self.pid):
            return []
        return [
            (what, pid)
            for what, pid in (
                ("Temporal server", self.temporal_pid),
                ("provider server", self.provider_pid),
            )
            if pid is not None and alive(pid)
        ]


def live_stack_queue(home: Path) -> str | None:
    """The task queue of the ``playline dev`` running in ``home``, if one runs."""
    record = StackRecord.read(home)
    if record is None or not alive(record.pid):
        return None
    return record.task_queue
