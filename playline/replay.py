"""Replay recorded histories against the current play code, one verdict per workflow.

A history is what Temporal recorded while a play ran. Replaying it runs the
*current* workflow code against it without any service (no provider, no store,
no server): if the code would now issue different commands, the SDK reports a
non-determinism error (``TMPRL1100``) and a deployed worker would get stuck on
that workflow. ``playline replay`` and :mod:`playline.testing` are built on this
module.

Histories come from files (``temporal workflow show --workflow-id ID --output json``,
the Temporal UI's "Download", or ``WorkflowHistory.to_json_dict()`` wrapped as
``{"workflow_id": ..., "history": ...}``) or straight from a server through a
visibility query. Plays are found among those declared so far, so the modules
declaring them must be imported first (``--plays mypkg.plays``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from temporalio.api.history.v1 import WorkflowExecutionStartedEventAttributes
from temporalio.client import WorkflowHistory
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from playline.codec import ENCODING
from playline.config import Settings
from playline.errors import PlaylineError
from playline.plugin import PlaylinePlugin

__all__ = [
    "ReplayOutcome",
    "histories_from_files",
    "history_files",
    "load_history",
    "replay_histories",
]

Verdict = Literal["ok", "nondeterministic", "unregistered", "failed"]

_UNREGISTERED = "is not registered on this worker"


@dataclass(frozen=True)
class ReplayOutcome:
    """What replaying one workflow's history against the current code gave.

    Attributes:
        workflow_id: the history's workflow id (a file's stem when the file had none).
        run_id: the run replayed.
        workflow_type: the play (or ``playline.DatasetRun``) it ran.
        failure: the replay failure, ``None`` when the code still fits the history.
        source: where the history came from (a file path, or ``server``).
    """

    workflow_id: str
    run_id: str
    workflow_type: str
    failure: Exception | None
    source: str = "server"

    @property
    def verdict(self) -> Verdict:
        if self.failure is None:
            return "ok"
        if isinstance(self.failure, NondeterminismError):
            return "nondeterministic"
        if _UNREGISTERED in str(self.failure):
            return "unregistered"
        return "failed"

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def message(self) -> str:
        """One line saying what is wrong and what to do; empty when it replayed."""
        verdict = self.verdict
        if verdict == "ok":
            return ""
        if verdict == "unregistered":
            return (
                f"workflow type {self.workflow_type!r} is not registered: import the module "
                "that declares it first (playline replay --plays mypkg.plays)"
            )
        assert self.failure is not None
        first_line = _first_line(self.failure)
        if verdict == "nondeterministic":
            return (
                f"the current code no longer fits this history: {first_line} "
                '(guard the change with workflow.patched("...") or keep the old code path)'
            )
        if ENCODING.decode() in first_line:
            return (
                f"{first_line} (the history is encrypted: set PLAYLINE_CODEC_KEYS to the keys "
                "that wrote it)"
            )
        return f"{type(self.failure).__name__}: {first_line}"

    def describe(self) -> str:
        """``ok  enrich_leads  wf-1 (file)`` or ``NONDETERMINISTIC ...: message``."""
        where = f" ({self.source})" if self.source != "server" else ""
        line = f"{self.verdict.upper():<16} {self.workflow_type}  {self.workflow_id}{where}"
        return line if self.ok else f"{line}\n    {self.message}"


def load_history(path: str | Path) -> WorkflowHistory:
    """A history from a JSON file: the CLI's/UI's export, or ``{"workflow_id", "history"}``."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlaylineError(f"history file {path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PlaylineError(f"history file {path} is not JSON: {err}") from None
    if isinstance(document, dict) and "history" in document:
        workflow_id, body = str(document.get("workflow_id") or ""), document["history"]
    else:
        workflow_id, body = "", document
    if not isinstance(body, dict) or not isinstance(body.get("events"), list) or not body["events"]:
        raise PlaylineError(
            f"history file {path} holds no events; export one with "
            "`temporal workflow show --workflow-id ID --output json > FILE`"
        )
    try:
        history = WorkflowHistory.from_json(workflow_id or path.stem, body)
    except Exception as err:
        raise PlaylineError(f"history file {path} is not a Temporal history: {err}") from None
    started = _started(history)
    if started is None:
        raise PlaylineError(
            f"history file {path} is not a Temporal history: its first event does not "
            "start a workflow"
        )
    # An export holds only events; recent servers record the id in the first one.
    if not workflow_id and started.workflow_id:
        history = WorkflowHistory(started.workflow_id, history.events)
    return history


def history_files(directory: str | Path) -> list[Path]:
    """The ``*.json`` files of a directory, sorted; a clear error when there are none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise PlaylineError(f"{directory}: no such directory")
    found = sorted(directory.glob("*.json"))
    if not found:
        raise PlaylineError(f"{directory} holds no *.json histories")
    return found


def histories_from_files(paths: Iterable[str | Path]) -> list[tuple[WorkflowHistory, str]]:
    """Each file's history with its path (as the outcome's ``source``)."""
    return [(load_history(p), str(p)) for p in paths]


def _started(history: WorkflowHistory) -> WorkflowExecutionStartedEventAttributes | None:
    for event in history.events[:1]:
        if event.HasField("workflow_execution_started_event_attributes"):
            return event.workflow_execution_started_event_attributes
    return None


def _workflow_type(history: WorkflowHistory) -> str:
    started = _started(history)
    return started.workflow_type.name if started else "?"


#: The SDK reports a core failure as its debug form; the message inside is the useful part.
_CORE_MESSAGE = re.compile(r'message: "((?:[^"\\]|\\.)*)"')


def _first_line(failure: BaseException) -> str:
    """The failure's message and its causes' (``outer: cause``), without stack traces."""
    text = str(failure).strip()
    found = [m.replace('\\"', '"') for m in _CORE_MESSAGE.findall(text)]
    if found:
        return ": ".join(found)
    return text.splitlines()[0] if text else type(failure).__name__


async def replay_histories(
    histories: Iterable[tuple[WorkflowHistory, str]] | AsyncIterator[WorkflowHistory],
    *,
    plays: Sequence[type] | None = None,
    settings: Settings | None = None,
    quiet: bool = True,
) -> list[ReplayOutcome]:
    """Replay each history against the current code; one outcome per workflow, in order.

    Args:
        histories: ``(history, source)`` pairs (from files) or an async iterator of
            histories (``client.list_workflows(query).map_histories()``).
        plays: play classes to replay with; default every play imported so far.
        settings: only the payload codec's keys are used (encrypted histories
            need the keys they were written with); nothing is opened.
        quiet: keep the SDK's own warnings and tracebacks for failing replays out
            of the log: the outcomes carry them.
    """
    plugin = PlaylinePlugin(plays=plays, settings=settings)
    runtime = _quiet_runtime() if quiet else None
    replayer = Replayer(workflows=[], plugins=[plugin], runtime=runtime)
    sources: dict[int, str] = {}

    async def iterate() -> AsyncIterator[WorkflowHistory]:
        if isinstance(histories, AsyncIterator):
            async for history in histories:
                yield history
            return
        for history, source in histories:
            sources[id(history)] = source
            yield history

    outcomes: list[ReplayOutcome] = []
    with _quiet_sdk_logs(quiet):
        async with replayer.workflow_replay_iterator(iterate()) as results:
            async for result in results:
                history = result.history
                outcomes.append(
                    ReplayOutcome(
                        workflow_id=history.workflow_id,
                        run_id=history.run_id,
                        workflow_type=_workflow_type(history),
                        failure=result.replay_failure,
                        source=sources.get(id(history), "server"),
                    )
                )
    return outcomes


@functools.cache
def _quiet_runtime() -> Runtime:
    """A runtime whose core does not log (one per process: runtimes own threads)."""
    return Runtime(telemetry=TelemetryConfig(logging=None))


@contextlib.contextmanager
def _quiet_sdk_logs(quiet: bool) -> Iterator[None]:
    """Raise the SDK's workflow-worker logger above ERROR for the block (if ``quiet``)."""
    logger = logging.getLogger("temporalio.worker._workflow")
    level = logger.level
    if quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
