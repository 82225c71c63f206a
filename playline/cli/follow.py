"""Following a run from the command line: a progress line on a terminal, and every wait
announced on stderr the moment it starts, with or without one.

A capped run that reaches its cap, a provider parked until its quota resets, rows
waiting on a provider's jobs, a paused run: each looks like a hang unless the user is
told. :func:`follow` polls the play's ``state`` query (and its current dataset run's,
which knows its rows to the chunk) and

* with ``bar=True`` (``playline run`` on a terminal, or ``--watch``) keeps one line up
  to date: the phase, rows done of total, the rate, the time left, the credits so far;
* always prints a line on stderr when the run starts waiting, saying for what and
  what to do (``budget: 20 of 20 credits spent; `playline runs budget ID --add N` to go
  on``), and once more when it goes on.

What it shows is computed by :func:`snapshot` and :func:`wait_lines`, pure functions of
the two states, so they are tested without a terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from playline.contract import DatasetRunState, PlayState
from playline.money import money_text

__all__ = ["Snapshot", "eta_text", "follow", "snapshot", "wait_lines"]

#: How often the state is asked for: often enough that a wait is announced within a
#: second or two, rarely enough to cost the workers nothing that matters.
POLL_S = 0.5
ENDED = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class Snapshot:
    """A run's progress as the command line shows it."""

    description: str
    done: int
    total: int
    credits: float
    waiting: bool
    #: the credits so far in money, where the workers' catalog prices them
    money: str | None = None


def snapshot(state: PlayState, current: DatasetRunState | None, waits: list[str]) -> Snapshot:
    """Rows and credits from the play's state, made exact for the dataset run in
    progress by its own state (the play holds that run's last, spaced-out report);
    ``waits``: what :func:`wait_lines` says the run waits for now (computed once a poll)."""
    done, credits = state.rows_done, state.credits
    if current is not None and state.current is not None:
        done += current.rows_done - state.current.rows_done
        credits += current.stats.credits - state.current.stats.credits
    elif current is not None:
        done, credits = done + current.rows_done, credits + current.stats.credits
    waiting = bool(waits)
    description = state.phase + (" (paused)" if state.paused else "")
    money = None
    if current is not None:
        by_provider = current.stats.spend.get("by_provider") or {}
        money = money_text(by_provider, current.stats.prices)
    return Snapshot(description, max(0, done), state.rows_total, max(0.0, credits), waiting, money)


def wait_lines(
    state: PlayState, current: DatasetRunState | None, now: datetime, run_id: str
) -> list[str]:
    """What the run ``run_id`` is waiting for right now, one line each (none while it
    runs)."""
    if state.status in ENDED:
        return []
    lines: list[str] = []
    budget_wait = (current.budget_wait if current is not None else None) or state.budget_wait
    if budget_wait:
        lines.append(f"waiting: {budget_wait}")
    for wait in current.waits if current is not None else []:
        if wait.until > now:
            until = wait.until.astimezone(UTC).strftime("%H:%M:%S UTC")
            lines.append(f"waiting for {wait.reason} until {until}")
    if state.paused or (current is not None and current.paused):
        lines.append(f"paused: `playline runs resume {run_id}` to go on")
    return lines


def eta_text(done: int, total: int, rate: float | None, waiting: bool) -> str:
    """``ETA 1m05s``; ``ETA - (waiting)`` while the run waits; ``-`` before a rate is known."""
    if waiting:
        return "ETA - (waiting)"
    if not total or rate is None or rate <= 0:
        return "ETA -"
    left = max(0, total - done) / rate
    minutes, seconds = divmod(int(left + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"ETA {hours}h{minutes:02d}m"
    return f"ETA {minutes}m{seconds:02d}s" if minutes else f"ETA {seconds}s"


class _Rate:
    """Rows per second over what this command has seen: from the first change on, so
    rows done before it started (a resumed run, receipts) do not inflate it."""

    def __init__(self) -> None:
        self._first: tuple[float, int] | None = None

    def update(self, done: int) -> float | None:
        now = time.monotonic()
        if self._first is None:
            self._first = (now, done)
            return None
        since, start = self._first
        if done <= start or now - since < 1.0:
            return None
        return (done - start) / (now - since)


async def _states(
    client: Client, handle: WorkflowHandle[Any, Any]
) -> tuple[PlayState, DatasetRunState | None]:
    state: PlayState = await handle.query("state", result_type=PlayState)
    current: DatasetRunState | None = None
    if state.current_child_id and state.status not in ENDED:
        child = client.get_workflow_handle(state.current_child_id)
        with contextlib.suppress(RPCError):
            current = await child.query("state", result_type=DatasetRunState)
    return state, current


async def follow(
    client: Client,
    handle: WorkflowHandle[Any, Any],
    console: Console,
    *,
    bar: bool,
) -> None:
    """Follow the run until it ends (or this task is cancelled): a progress line if
    ``bar``, and each wait announced on ``console`` when it starts and when it ends."""
    announced: list[str] = []
    rate = _Rate()
    progress: Progress | None = None
    task = None
    if bar:
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.fields[total_text]} rows"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[eta]}"),
            TextColumn("{task.fields[credits]}"),
            console=console,
            transient=False,
        )
        progress.start()
        task = progress.add_task(
            "starting", total=None, total_text="?", rate="", eta="", credits=""
        )
    try:
        while True:
            try:
                state, current = await _states(client, handle)
            except (RPCError, RuntimeError, OSError, TimeoutError):
                # Temporal away (a restart), the query not answered yet: the run's own
                # wait rides that out; following it only tries again.
                await asyncio.sleep(POLL_S)
                continue
            now = datetime.now(UTC)
            lines = wait_lines(state, current, now, handle.id)
            if progress is not None and task is not None:
                shot = snapshot(state, current, lines)
                per_s = rate.update(shot.done)
                progress.update(
                    task,
                    description=shot.description,
                    completed=shot.done,
                    total=shot.total or None,
                    total_text=str(shot.total or "?"),
                    rate=f"{per_s:.1f} rows/s" if per_s is not None else "",
                    eta=eta_text(shot.done, shot.total, per_s, shot.waiting),
                    credits=f"{shot.credits:g} credits"
                    + (f" ({shot.money})" if shot.money else ""),
                    refresh=True,  # drawn before a wait line is printed above it
                )
            for line in lines:
                if line not in announced:
                    console.print(line, markup=False, highlight=False)
            if announced and not lines and state.status not in ENDED:
                console.print("going on", markup=False, highlight=False)
            announced = lines
            if state.status in ENDED:
                return
            await asyncio.sleep(POLL_S)
    finally:
        if progress is not None:
            progress.stop()
