"""The README's "Your first play", followed as written: its files saved from its code
blocks into an empty folder, its commands run from there as a user would (the stack on
ports of its own, so it runs beside other tests), and what it promises checked."""

from __future__ import annotations

import asyncio
import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from playline.sockets import free_port
from tests.conftest import REPO

SECTION = "## Your first play"


def section_blocks(readme: str) -> list[tuple[str, str, str]]:
    """The section's code blocks: ``(language, text, the prose before it)``."""
    start = readme.index(SECTION)
    end = readme.index("\n## ", start + len(SECTION))
    text = readme[start:end]
    blocks = []
    after_last = 0
    for match in re.finditer(r"```(\w*)\n(.*?)```", text, re.S):
        before = text[after_last : match.start()].strip().split("\n\n")[-1]
        blocks.append((match.group(1), match.group(2), before))
        after_last = match.end()
    return blocks


def saved_as(before: str) -> str | None:
    """``people.csv`` from "... save this as `people.csv`:" (the file a block is)."""
    found = re.search(r"as\s+`([\w.]+)`", before)
    return found.group(1) if found else None


def commands(blocks: list[tuple[str, str, str]]) -> list[str]:
    return [
        line.strip()
        for language, text, _ in blocks
        if language == "sh"
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


class Shell:
    """Runs the section's commands in ``folder`` with the installed ``playline``."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.env = env

    def argv(self, command: str) -> list[str]:
        words = command.split()
        assert words[0] == "playline", command
        return [sys.executable, "-m", "playline", *words[1:]]

    def start(self, command: str, log: Path, extra: list[str] = ()) -> subprocess.Popen[bytes]:  # type: ignore[assignment]
        return subprocess.Popen(
            [*self.argv(command), *extra],
            cwd=self.folder,
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def run(self, command: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(command),
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def values(row: dict[str, str]) -> dict[str, str]:
    """A row's own and computed values, without their provenance."""
    return {k: v for k, v in row.items() if "__" not in k}


async def until_in(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        found = re.search(pattern, text)
        if found:
            return found.group(0)
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared:\n{log.read_text(errors='replace')}")


async def test_the_readme_first_play_followed_verbatim(tmp_path: Path) -> None:
    blocks = section_blocks((REPO / "README.md").read_text())
    folder = tmp_path / "first-play"  # an empty folder: nothing of the repository's
    folder.mkdir()
    for language, text, before in blocks:
        name = saved_as(before)
        if name is not None and language in ("csv", "python"):
            (folder / name).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == ["myplays.py", "people.csv"]
    steps = commands(blocks)
    assert [s.split()[1] for s in steps] == ["dev", "estimate", "run", "runs"], steps

    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLAYLINE_", "TEMPORAL_")) and not k.endswith("_API_KEY")
    }
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{port}"  # the stack on ports of its own
    shell = Shell(folder, env)
    dev_log = tmp_path / "dev.log"
    dev = shell.start(
        steps[0], dev_log, ["--ui-port", str(free_port()), "--provider-port", str(free_port())]
    )
    run: subprocess.Popen[bytes] | None = None
    try:
        await until_in(dev_log, r"playline dev is up", dev, 120)

        estimate = shell.run(steps[1])
        assert estimate.returncode == 0, estimate.stderr
        total = re.search(
            r"^total\s+all providers\s+(\d+)\s+\d+\s+(\d+)\s+\d+\s+([\d.]+)", estimate.stdout, re.M
        )
        assert total, estimate.stdout
        calls, to_pay, worst = int(total.group(1)), int(total.group(2)), float(total.group(3))
        assert calls > 0 and to_pay > 0 and worst > 5  # the cap below binds

        run_log = tmp_path / "run.log"
        run = shell.start(steps[2], run_log)
        said = await until_in(run_log, r"`playline runs budget (\S+) --add N` to go on", run, 120)
        run_id = said.split()[3]
        assert "waiting: budget: 5 of 5 credits spent" in run_log.read_text()

        raised = shell.run(steps[3].replace("<ID>", run_id))
        assert raised.returncode == 0, raised.stderr
        assert run.wait(timeout=120) == 0, run_log.read_text()
        summary = run_log.read_text()
        assert "play my_first_play completed" in summary and "rows: 6 ok, 0 failed" in summary

        with (folder / "people_enriched.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert [r["id"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
        assert all(r["company"] for r in rows)
        for column in ("company", "work_email"):
            assert {f"{column}__source", f"{column}__credits", f"{column}__miss"} <= set(rows[0])
        steps_seen = {r["work_email__source"].split(" via ")[0] for r in rows if r["work_email"]}
        assert steps_seen and steps_seen <= {"mailfox_email", "prospectr_email"}, steps_seen
        # "Run the same command again: ... 0 credits are spent, the values are the same."
        again = shell.run(steps[2])
        assert again.returncode == 0, again.stderr
        assert "credits spent: 0" in again.stdout, again.stdout
        with (folder / "people_enriched.csv").open(newline="") as handle:
            again_rows = list(csv.DictReader(handle))
        assert [values(r) for r in again_rows] == [values(r) for r in rows]
        sources = [r["work_email__source"] for r in again_rows if r["work_email"]]
        assert sources and all(", reused " in s for s in sources), sources
    finally:
        for proc in (run, dev):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
