"""The control and listing commands as a user runs them: ``playline runs pause|resume|
window|cancel|list``, ``plays list``, ``setup`` and ``--json``, against the real server."""

from __future__ import annotations

import asyncio
import csv
import json
import time

from playline.contract import PlayRunResult, RunOptions
from tests.conftest import new_id
from tests.e2e.test_cli import playline
from tests.e2e.test_controls import child_state, eventually
from tests.plays import lead, write_csv


def one_line_error(result, text: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert text in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


async def test_pause_window_resume_cancel_export_and_list_from_the_command_line(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    provider.configure(latency_ms=[400, 450])
    rows = 120  # with a window of 1 chunk of 4 rows, resumed it still runs for seconds
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(rows)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        handle = await client.start_workflow(
            "t_tool_column",
            args=[{"csv_path": str(csv_path)}, RunOptions(chunk_size=4, max_chunks_in_flight=2)],
            id=new_id("cli-ctl"),
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        await eventually(lambda: child_state(client, handle), lambda s: s.rows_done >= 4)
        run_id = handle.id

        paused = await playline("runs", "pause", run_id, *common, home=home)
        assert paused.returncode == 0, paused.stderr
        assert f"paused {run_id}" in paused.stdout
        again = await playline("runs", "pause", run_id, *common, home=home)
        one_line_error(again, "pause refused: play t_tool_column is already paused")
        bad = await playline("runs", "window", run_id, "0", *common, home=home)
        one_line_error(bad, "window refused: the window must be 1 to 64 chunks in flight, not 0")
        window = await playline("runs", "window", run_id, "1", "--json", *common, home=home)
        assert window.returncode == 0, window.stderr
        assert json.loads(window.stdout) == {
            "status": "paused",
            "paused": True,
            "window": 1,
            "dataset": "t_rows",
        }

        deadline = time.monotonic() + 30
        while True:  # the list is Temporal's visibility: it catches up within moments
            listed = await playline(
                "runs", "list", "--status", "paused", "--json", *common, home=home
            )
            assert listed.returncode == 0, listed.stderr
            found = [r for r in json.loads(listed.stdout)["runs"] if r["workflow_id"] == run_id]
            if found or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert found and found[0]["play"] == "t_tool_column"
        assert found[0]["status"] == "paused" and found[0]["rows_total"] == rows
        table = await playline("runs", "list", "--play", "t_tool_column", *common, home=home)
        assert run_id in table.stdout and "paused" in table.stdout

        resumed = await playline("runs", "resume", run_id, *common, home=home)
        assert resumed.returncode == 0 and f"resumed {run_id}" in resumed.stdout
        out = tmp_path / "done.csv"
        cancelled = await playline(
            "runs", "cancel", run_id, "--out", str(out), "--json", *common, home=home
        )
        assert cancelled.returncode == 0, cancelled.stderr
        document = json.loads(cancelled.stdout)
        got = await playline("runs", "get", run_id, "--json", *common, home=home)
        after = await playline("runs", "resume", run_id, *common, home=home)
    assert document["status"] == "CANCELED"
    assert document["failure"]["type"] == "CancelledError"
    done = document["state"]["rows_done"]
    assert 0 < done < rows and document["state"]["status"] == "cancelled"
    exported = list(csv.DictReader(out.open()))
    assert document["exported"] == {"path": str(out), "rows": rows}
    assert sum(1 for r in exported if r["value"]) == done  # the rows done, and only those
    assert provider.ledger()["double_charged"] == 0
    detail = json.loads(got.stdout)
    assert detail["status"] == "CANCELED" and detail["play"] == "t_tool_column"
    assert detail["search_attributes"]["PlaylineStatus"] == "cancelled"
    assert detail["search_attributes"]["PlaylineRowsDone"] == done
    one_line_error(after, f"run {run_id} is not running (CANCELED)")


async def test_run_json_plays_list_and_setup(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(5)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        run = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--json",
            "--id",
            new_id("json"),
            *common,
            home=home,
        )
        failed = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--input",
            '{"column_tool": "declared_unknown"}',
            "--json",
            *common,
            home=home,
        )
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)  # stdout is one JSON document and nothing else
    assert document["status"] == "COMPLETED"
    assert document["result"]["stats"]["rows_ok"] == 5
    assert "/namespaces/default/workflows/" in document["ui_url"]
    assert failed.returncode == 1
    failure = json.loads(failed.stdout)
    assert failure["status"] == "FAILED" and "nope" in failure["failure"]["message"]

    plays = await playline("plays", "list", "--plays", "tests.plays", "--json", *common, home=home)
    assert plays.returncode == 0, plays.stderr
    listing = json.loads(plays.stdout)
    assert {"enrich_leads", "t_tool_column", "t_scalar"} <= {
        p["play"] for p in listing["registered_here"]
    }
    seen = {p["play"]: p for p in listing["seen_on_namespace"]}
    assert seen["t_tool_column"]["runs"] >= 1

    setup = await playline("setup", *common, home=home)
    assert setup.returncode == 0, setup.stderr
    assert "namespace default already has PlaylinePlay (Keyword)" in setup.stdout
