"""The ``playline`` command as a user runs it: a real subprocess against the real server."""

from __future__ import annotations

import asyncio
import csv
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.plays import lead, write_csv


async def playline(
    *args: str, home: Path, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m playline ARGS`` without blocking the event loop (the worker runs here)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "playline",
        *args,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def test_run_watch_export_and_runs_commands(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(6)])
    out = tmp_path / "out.csv"
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        run = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--out",
            str(out),
            "--watch",
            "--id",
            "cli-run-1",
            *common,
            home=home,
        )
        assert run.returncode == 0, run.stderr
        assert "play t_tool_column completed" in run.stdout
        assert "rows: 6 ok, 0 failed" in run.stdout
        # 6 email_finder credits at the demo catalog's price for acme (0.012 USD).
        assert "credits spent: 6 (≈ 0.07 USD)" in run.stdout, run.stdout
        assert "/namespaces/default/workflows/cli-run-1/" in run.stdout
        assert "6 rows" in run.stdout and str(out) in run.stdout
        rows = list(csv.DictReader(out.open()))
        assert [r["lead_id"] for r in rows] == [f"T{i:04d}" for i in range(6)]
        assert all(r["value"] for r in rows)

        got = await playline("runs", "get", "cli-run-1", *common, home=home)
        assert got.returncode == 0, got.stderr
        assert "COMPLETED" in got.stdout and "rows: 6 ok" in got.stdout

        again = tmp_path / "again.csv"
        exported = await playline(
            "runs", "export", "cli-run-1", "--out", str(again), *common, home=home
        )
        assert exported.returncode == 0, exported.stderr
        assert again.read_bytes() == out.read_bytes()
    assert provider.ledger()["charged"] == 6


async def test_bad_input_is_one_clear_line_and_exit_1(
    provider, temporal_address, task_queue, home, tmp_path
) -> None:
    common = ("--address", temporal_address, "--task-queue", task_queue)
    bad_json = await playline("run", "t_tool_column", "--input", "{nope", *common, home=home)
    assert bad_json.returncode == 1
    assert "--input is not valid JSON" in bad_json.stderr
    assert "Traceback" not in bad_json.stderr
    missing = await playline(
        "run", "t_tool_column", "--csv", str(tmp_path / "absent.csv"), *common, home=home
    )
    assert missing.returncode == 1 and "no such file" in missing.stderr
    assert provider.ledger()["received"] == 0


async def test_help_everywhere(home) -> None:
    for args in (
        ("--help",),
        ("run", "--help"),
        ("runs", "get", "--help"),
        ("worker", "--help"),
        ("dev", "--help"),
        ("demo", "--help"),
        ("limits", "--help"),
        ("provider-server", "--help"),
    ):
        result = await playline(*args, home=home)
        assert result.returncode == 0, (args, result.stderr)
        assert "usage:" in result.stdout.lower(), args


async def test_temporal_cli_starts_a_play_by_its_workflow_type(
    client, provider, worker, temporal_address, task_queue, tmp_path
) -> None:
    """Each play is its own workflow type: the stock ``temporal`` CLI can start it by name."""
    from playline.cli.devserver import temporal_binary
    from playline.contract import PlayRunResult

    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(3)])
    async with worker():
        proc = await asyncio.create_subprocess_exec(
            temporal_binary(),
            "workflow",
            "start",
            "--address",
            temporal_address,
            "--task-queue",
            task_queue,
            "--type",
            "t_tool_column",
            "--workflow-id",
            "started-by-temporal-cli",
            "--input",
            f'{{"csv_path": "{csv_path}"}}',
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        handle = client.get_workflow_handle("started-by-temporal-cli", result_type=PlayRunResult)
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.play == "t_tool_column" and result.stats.rows_ok == 3
    assert (await handle.describe()).workflow_type == "t_tool_column"
