"""``playline run`` on a terminal, as a user sees it: a progress line by default, and a
capped run that reaches its cap says so at once, with the command to go on, without
``--watch``; in a pipe there is no progress line, but the wait is announced too."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

from temporalio.client import Client

from playline.contract import BudgetChange, PlayState
from tests.conftest import REPO
from tests.plays import lead, write_csv

#: rich's cursor and colour codes, so the text on the terminal can be read.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def start_in_pty(args: list[str], home: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``python -m playline ARGS`` with a pseudo-terminal as its stdout and stderr."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "playline", *args],
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PLAYLINE_HOME": str(home),
            "COLUMNS": "160",
            "TERM": "xterm",
        },
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    os.set_blocking(master, False)
    return proc, master


def read_screen(master: int) -> str:
    """What the terminal received since the last read, without escape codes."""
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except (BlockingIOError, OSError):
            break
        if not data:
            break
        chunks.append(data.decode(errors="replace"))
    return ANSI.sub("", "".join(chunks)).replace("\r", "\n")


def runs_get(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "playline", "runs", "get", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def until_waiting(client: Client, play_id: str, timeout_s: float = 120) -> PlayState:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state: PlayState = await client.get_workflow_handle(play_id).query(
                "state", result_type=PlayState
            )
            if state.budget_wait and state.status == "waiting":
                return state
        except Exception:  # not started yet
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"{play_id} never waited for budget")


async def test_a_capped_run_on_a_terminal_shows_progress_and_says_at_once_that_it_waits(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(12)])
    play_id = f"progress-{task_queue}"
    common = ["--address", temporal_address, "--task-queue", task_queue]
    async with worker():
        proc, master = start_in_pty(
            [
                "run",
                "t_tool_column",
                "--csv",
                str(csv_path),
                "--max-credits",
                "3",
                "--id",
                play_id,
                *common,
            ],
            home,
        )
        screen = ""
        try:
            await until_waiting(client, play_id)
            # The play waits now: the terminal says so, and how to go on, within 5 s.
            said = time.monotonic()
            wanted = f"`playline runs budget {play_id} --add N` to go on"
            while wanted not in screen and time.monotonic() - said < 5:
                await asyncio.sleep(0.1)
                screen += read_screen(master)
            assert wanted in screen, screen
            await asyncio.sleep(1.0)  # the progress line's next drawing
            screen += read_screen(master)
            assert "waiting: budget: 3 of 3 credits spent" in screen, screen
            # The progress line: rows done of total, the ETA and the credits so far.
            lines = [line for line in screen.splitlines() if " rows" in line and "ETA" in line]
            assert lines, screen
            assert re.search(r"\b3/12 rows\b", lines[-1]), lines[-1]
            assert "ETA" in lines[-1] and "3 credits" in lines[-1], lines[-1]

            # Raised, the run goes on and the command ends with its summary.
            await client.get_workflow_handle(play_id).execute_update("budget", BudgetChange(add=20))
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                screen += read_screen(master)
            screen += read_screen(master)
            assert proc.returncode == 0, screen
            assert "rows: 12 ok, 0 failed" in screen, screen
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            os.close(master)


async def test_in_a_pipe_there_is_no_progress_line_but_the_wait_is_announced(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(8)])
    play_id = f"piped-{task_queue}"
    async with worker():
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "playline",
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--max-credits",
            "2",
            "--id",
            play_id,
            "--address",
            temporal_address,
            "--task-queue",
            task_queue,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await until_waiting(client, play_id)
            await asyncio.sleep(3)  # the announcement is printed while the run waits
            # `runs get` of the waiting run: status, why and what to do first, no raw state.
            common = ["--address", temporal_address]
            got = await asyncio.to_thread(runs_get, [play_id, *common], home)
            lines = got.stdout.splitlines()
            assert lines[0] == f"{play_id}: t_tool_column RUNNING", got.stdout
            assert "waiting: budget: 2 of 2 credits spent" in lines[2], got.stdout
            assert f"`playline runs budget {play_id} --add N` to go on" in lines[2]
            assert "credits spent so far: 2" in got.stdout
            assert '"rows_total"' not in got.stdout  # the raw state only when asked
            raw = await asyncio.to_thread(runs_get, [play_id, "--state", *common], home)
            assert '"rows_total"' in raw.stdout and '"budget_wait"' in raw.stdout
            await client.get_workflow_handle(play_id).execute_update("budget", BudgetChange(add=20))
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    stderr = err.decode()
    assert proc.returncode == 0, stderr
    assert f"`playline runs budget {play_id} --add N` to go on" in stderr, stderr
    assert "ETA" not in stderr and "rows/s" not in stderr, stderr  # no bar in a pipe
    assert "rows: 8 ok" in out.decode()
