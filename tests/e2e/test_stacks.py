"""``playline dev`` and ``playline demo`` as stacks that share a machine: SIGTERM (and
SIGKILL) leave no process behind, a stale server is named and stopped rather than
silently reused, and a demo beside a running ``dev --plays other`` on the same Temporal
keeps its tasks to itself."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from playline.cli.stack_record import alive
from playline.demo import LEADS_CSV
from playline.sockets import free_port

OTHER_PLAYS = """
from pydantic import BaseModel
from playline import PlayContext, RowContext, play, resolver


class Input(BaseModel):
    csv_path: str


@resolver(tools=["email_finder"])
async def email(row, rc: RowContext):
    found = await rc.tool("email_finder", {"first_name": "a", "last_name": "b", "domain": "c"})
    return found.get("email")


@play(name="other_play")
async def other_play(ctx: PlayContext, input: Input) -> None:
    rows = await ctx.csv("rows", input.csv_path)
    await ctx.dataset("other", rows).with_column("email", email).run()
"""


def environment(temporal_port: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLAYLINE_", "TEMPORAL_")) and not k.endswith("_API_KEY")
    }
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{temporal_port}"
    return env


def start_dev(folder: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "playline",
            "dev",
            "--ui-port",
            str(free_port()),
            "--provider-port",
            str(free_port()),
            *extra,
        ],
        cwd=folder,
        env=env,
        stdout=(folder / "dev.log").open("wb"),
        stderr=subprocess.STDOUT,
    )


def wait_up(proc: subprocess.Popen[bytes], folder: Path, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = (folder / "dev.log").read_text(errors="replace")
        if "playline dev is up" in log:
            return log
        assert proc.poll() is None, log
        time.sleep(0.2)
    raise AssertionError((folder / "dev.log").read_text(errors="replace"))


def gone(pids: list[int], timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def record(folder: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((folder / ".playline" / "dev.json").read_text())
    return data


def test_dev_stops_everything_it_started_on_sigterm_and_on_sigkill(tmp_path: Path) -> None:
    env = environment(free_port())
    folder = tmp_path / "a"
    dev = start_dev(folder, env)
    try:
        wait_up(dev, folder)
        started = record(folder)
        pids = [int(str(started[k])) for k in ("temporal_pid", "provider_pid")]
        assert started["pid"] == dev.pid and all(alive(pid) for pid in pids), started
        dev.send_signal(signal.SIGTERM)
        assert dev.wait(timeout=60) == 0, (folder / "dev.log").read_text()
        assert gone(pids), pids
        assert not (folder / ".playline" / "dev.json").exists()
        assert "stopped the embedded Temporal server" in (folder / "dev.log").read_text()

        # Killed outright, it cannot clean up: its children go with it all the same.
        dev = start_dev(folder, env)
        wait_up(dev, folder)
        pids = [int(str(record(folder)[k])) for k in ("temporal_pid", "provider_pid")]
        dev.send_signal(signal.SIGKILL)
        dev.wait(timeout=10)
        assert gone(pids), pids
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()


def test_a_server_an_earlier_dev_left_is_named_and_stopped_not_reused(tmp_path: Path) -> None:
    env = environment(free_port())
    folder = tmp_path / "b"
    home = folder / ".playline"
    home.mkdir(parents=True)
    # What a dev killed where the kernel does not stop its children leaves: its record,
    # naming a process of its own that is gone and a server that still runs.
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    (home / "dev.json").write_text(
        json.dumps(
            {
                "pid": ended.pid,
                "task_queue": "playline",
                "temporal_address": env["TEMPORAL_ADDRESS"],
                "temporal_pid": left.pid,
                "provider_pid": None,
            }
        )
    )
    dev = start_dev(folder, env)
    try:
        log = wait_up(dev, folder)
        assert re.search(
            rf"a Temporal server \(pid {left.pid}\) left running by an earlier `playline dev` "
            rf"\(pid {ended.pid}, gone\)",
            log,
        ), log
        assert left.wait(timeout=20) is not None
        assert record(folder)["pid"] == dev.pid  # this dev's record now
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.wait(timeout=60)
        if left.poll() is None:
            left.kill()
            left.wait()


def test_a_demo_beside_a_running_dev_with_other_plays_succeeds(tmp_path: Path) -> None:
    """...and each serves the sheet view beside the Temporal UI: dev's (its port taken,
    on a free one) lists the demo's run; the demo's summary links to the run's sheet."""
    env = environment(free_port())
    other = tmp_path / "other"
    other.mkdir()
    (other / "other_plays.py").write_text(OTHER_PLAYS)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    dev = start_dev(other, env, "--plays", "other_plays", "--sheet-port", str(taken_port))
    try:
        log = wait_up(dev, other)
        found = re.search(r"sheet view on (http://127\.0\.0\.1:(\d+))", log)
        assert found and int(found[2]) != taken_port, log
        sheets = found[1]
        assert f"sheet view {sheets}" in log.replace("\n", " "), log
        demo_folder = tmp_path / "demo"
        demo_folder.mkdir()
        leads = LEADS_CSV.read_text().splitlines()
        (demo_folder / "leads.csv").write_text("\n".join(leads[:21]) + "\n")
        demo = subprocess.run(
            [
                sys.executable,
                "-m",
                "playline",
                "demo",
                "--csv",
                "leads.csv",
                "--out",
                "enriched.csv",
                "--ui-port",
                str(free_port()),
            ],
            cwd=demo_folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        said = demo.stdout + demo.stderr
        assert demo.returncode == 0, said
        assert f"reusing the Temporal server already running at {env['TEMPORAL_ADDRESS']}" in said
        assert "play enrich_leads completed" in said and "rows: 20 ok, 0 failed" in said, said
        assert len((demo_folder / "enriched.csv").read_text().splitlines()) == 21
        assert dev.poll() is None  # the other stack is untouched
        linked = re.search(r"sheet: (http://127\.0\.0\.1:\d+/sheet\?id=(\S+))", said)
        assert linked, said
        runs = httpx.get(sheets + "/", timeout=30)
        assert runs.status_code == 200 and linked[2] in runs.text, runs.text[:2000]
    finally:
        taken.close()
        dev.send_signal(signal.SIGTERM)
        dev.wait(timeout=60)
