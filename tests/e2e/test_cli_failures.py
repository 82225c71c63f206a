"""Every way a command can go wrong ends in one line and exit 1, never a hang or a traceback.

Real processes: the ``playline`` command as a user runs it, real Temporal dev servers
(the session's, and a dedicated one this module restarts), real workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from playline.cli.devserver import DevServer
from playline.provider_server.process import free_port
from tests.conftest import REPO, new_id, start_worker_process
from tests.plays import lead, read_csv_rows, write_csv


async def playline(
    *args: str, home: Path, env: dict[str, str] | None = None, timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m playline ARGS``; returns the finished process (text output)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "playline",
        *args,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home), **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


def one_clear_line(result: subprocess.CompletedProcess[str], *needles: str, code: int = 1) -> str:
    """The error line, after checking: exit ``code``, no traceback, every needle present."""
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


async def test_a_worker_with_a_bad_catalog_exits_with_the_cause(
    temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text('[providers.acme]\nbase_url = "http://x"\npacing = { rps = -1 }\n')
    result = await playline(
        "worker",
        "--address",
        temporal_address,
        "--task-queue",
        task_queue,
        home=tmp_path / "home",
        env={"PLAYLINE_CATALOG": str(catalog)},
    )
    one_clear_line(result, f"catalog file {catalog} is invalid", "rps")


async def test_a_worker_with_a_missing_plays_module_or_catalog_exits_with_the_cause(
    temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    common = ("--address", temporal_address, "--task-queue", task_queue)
    no_module = await playline("worker", *common, "--plays", "no_such.plays", home=tmp_path)
    one_clear_line(no_module, "cannot import plays module 'no_such.plays'")
    no_file = await playline(
        "worker", *common, home=tmp_path, env={"PLAYLINE_CATALOG": str(tmp_path / "none.toml")}
    )
    one_clear_line(no_file, "does not exist")


async def test_a_worker_whose_store_is_unreachable_exits_with_the_cause(
    temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    dead = f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/test"
    result = await playline(
        "worker",
        "--address",
        temporal_address,
        "--task-queue",
        task_queue,
        home=tmp_path,
        env={"PLAYLINE_STORE_URL": dead},
    )
    line = one_clear_line(result, "127.0.0.1")
    assert "s3cret" not in result.stderr + result.stdout  # the password is never printed
    print(line)


async def test_demo_with_a_bad_catalog_reports_it_instead_of_waiting(
    temporal_address: str, tmp_path: Path
) -> None:
    result = await playline(
        "demo",
        "--address",
        temporal_address,
        home=tmp_path / "home",
        env={"PLAYLINE_CATALOG": str(tmp_path / "missing.toml")},
    )
    one_clear_line(result, "missing.toml does not exist")


async def test_commands_against_an_unreachable_temporal_are_one_line(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    for args in (
        ("run", "enrich_leads", "--input", "{}"),
        ("runs", "get", "some-id"),
        ("worker",),
    ):
        result = await playline(*args, "--address", dead, home=tmp_path)
        one_clear_line(result, f"cannot reach Temporal at {dead}", "connection refused")


async def test_bad_chunk_sizes_are_rejected_before_anything_starts(
    temporal_address: str, tmp_path: Path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(0)])
    for size in ("-1", "0", "99999"):
        result = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--chunk-size",
            size,
            "--address",
            temporal_address,
            home=tmp_path,
        )
        one_clear_line(result, "invalid run options", "chunk-size")


async def test_an_unknown_play_is_refused_at_once_naming_the_workers_plays_leaving_nothing(
    client, worker, temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    async with worker():
        started = time.monotonic()
        result = await playline(
            "run",
            "no_such_play",
            "--id",
            "unknown-play-run",
            "--address",
            temporal_address,
            "--task-queue",
            task_queue,
            home=tmp_path,
        )
        took = time.monotonic() - started
        # The workers published their plays: the name is refused before anything starts.
        line = one_clear_line(
            result, "no play named 'no_such_play'", "enrich_leads", "t_async", code=2
        )
        assert "playline.DatasetRun" not in line and "playline.Plays" not in line
        assert "did you mean" not in line  # nothing like it
        with pytest.raises(RPCError) as missing:
            await client.get_workflow_handle("unknown-play-run").describe()
        assert missing.value.status == RPCStatusCode.NOT_FOUND
        # One letter off: the closest is suggested.
        typo = await playline(
            "run",
            "t_tool_colum",
            "--address",
            temporal_address,
            "--task-queue",
            task_queue,
            home=tmp_path,
        )
        one_clear_line(typo, "did you mean 't_tool_column'?", code=2)
    print(f"unknown play refused after {took:.1f}s")  # a figure for the record, not asserted


async def test_a_duplicate_id_names_the_existing_run(
    client, provider, worker, temporal_address: str, task_queue: str, home: Path, tmp_path: Path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(2)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    run_id = new_id("dup")
    async with worker():
        first = await playline(
            "run", "t_tool_column", "--csv", str(csv_path), "--id", run_id, *common, home=home
        )
        assert first.returncode == 0, first.stderr
        again = await playline(
            "run", "t_tool_column", "--csv", str(csv_path), "--id", run_id, *common, home=home
        )
    one_clear_line(again, f"a run with id {run_id!r} already exists")


async def test_runs_get_of_a_failed_play_shows_the_root_cause(
    client, provider, worker, temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    common = ("--address", temporal_address, "--task-queue", task_queue)
    run_id = new_id("fails")
    missing = tmp_path / "nonexistent" / "leads.csv"  # in a data dir, so only its absence fails
    async with worker():
        failed = await playline(
            "run",
            "t_tool_column",
            "--input",
            json.dumps({"csv_path": str(missing)}),
            "--id",
            run_id,
            *common,
            home=tmp_path,
        )
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert f"CSV file {missing} does not exist" in failed.stderr
    got = await playline("runs", "get", run_id, *common, home=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "FAILED" in got.stdout
    assert f"CSV file {missing} does not exist" in got.stdout
    assert "InvalidPlayInput" in got.stdout
    # The play's own failure (its top event in the UI) is the root cause, not a wrapper.
    history = await client.get_workflow_handle(run_id).fetch_history()
    failure = history.events[-1].workflow_execution_failed_event_attributes.failure
    assert failure.message == f"CSV file {missing} does not exist"
    assert failure.application_failure_info.type == "InvalidPlayInput"


async def test_runs_stop_terminate_ends_a_running_play(
    client, provider, worker, temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    provider.configure(latency_ms=[15000, 15000])  # no row can finish before the stop
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(40)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        handle = await client.start_workflow(
            "t_tool_column",
            args=[{"csv_path": str(csv_path)}, None],
            id=new_id("stop"),
            task_queue=task_queue,
        )
        stopped = await playline("runs", "stop", handle.id, "--terminate", *common, home=tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        assert f"terminated {handle.id}" in stopped.stdout
        assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED
        again = await playline("runs", "stop", handle.id, *common, home=tmp_path)
    one_clear_line(again, "is not running (TERMINATED)")


@pytest.fixture
def own_temporal(tmp_path: Path) -> Iterator[DevServer]:
    """A dev server of this test's own (persisted to a file), so it can be restarted."""
    server = DevServer(home=tmp_path / "temporal", port=free_port(), ui_port=free_port())
    asyncio.run(server.start())
    try:
        yield server
    finally:
        server.stop()


async def test_run_watch_rides_out_a_temporal_restart(
    own_temporal: DevServer, provider, tmp_path: Path
) -> None:
    """Temporal goes away mid-play for longer than the SDK's own RPC retries (about 10 s);
    the play and ``run --watch`` both finish."""
    provider.configure(latency_ms=[100, 150])
    rows = 400  # paced at the catalog's 100 rps, this takes several seconds
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(rows)])
    address, queue = own_temporal.address, "restart-queue"
    log = tmp_path / "worker.log"
    worker = start_worker_process(address, queue, tmp_path / "home", log)
    try:
        run = asyncio.ensure_future(
            playline(
                "-v",
                "run",
                "t_tool_column",
                "--csv",
                str(csv_path),
                "--watch",
                "--reconnect-timeout",
                "90",
                "--out",
                str(tmp_path / "out.csv"),
                "--address",
                address,
                "--task-queue",
                queue,
                home=tmp_path / "home",
                timeout_s=180,
            )
        )
        deadline = time.monotonic() + 60
        while provider.ledger()["charged"] < 5:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            await asyncio.sleep(0.1)
        assert provider.ledger()["charged"] < rows, "the play finished before the outage"
        own_temporal.stop()
        await asyncio.sleep(15)
        await own_temporal.start()
        result = await run
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "lost contact with Temporal" in result.stderr
    errors = {r.get("_error") for r in read_csv_rows(tmp_path / "out.csv") if r.get("_error")}
    assert f"rows: {rows} ok, 0 failed" in result.stdout, (result.stdout, errors)
    assert provider.ledger()["double_charged"] == 0


async def test_run_gives_up_on_a_temporal_that_stays_away_and_says_how_to_follow(
    own_temporal: DevServer, provider, tmp_path: Path
) -> None:
    provider.configure(latency_ms=[200, 300])
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(30)])
    address, queue = own_temporal.address, "gone-queue"
    log = tmp_path / "worker.log"
    worker = start_worker_process(address, queue, tmp_path / "home", log)
    try:
        run = asyncio.ensure_future(
            playline(
                "run",
                "t_tool_column",
                "--csv",
                str(csv_path),
                "--id",
                "gone-run",
                "--reconnect-timeout",
                "3",
                "--address",
                address,
                "--task-queue",
                queue,
                home=tmp_path / "home",
            )
        )
        deadline = time.monotonic() + 60
        while provider.ledger()["charged"] < 2:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            await asyncio.sleep(0.1)
        own_temporal.stop()
        result = await run
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
    one_clear_line(
        result, "lost contact with Temporal", "may still be running", "playline runs get gone-run"
    )
