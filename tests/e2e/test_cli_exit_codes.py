"""``playline run``'s exit codes, as a cron job sees them.

0: the play completed; 3: it completed but no row succeeded (or, with
``--fail-on-row-errors``, a row failed), said in one line on stderr, the summary or
the JSON document still printed; 2: a mistyped play name, refused before anything
was uploaded or started. Real processes: the ``playline`` command as a user runs it
against the session's Temporal dev server, an in-process worker with the test plays
and the local provider server.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from playline.cli.run import EXIT_REFUSED, EXIT_ROWS_FAILED, rows_failed
from playline.cli.starting import SUGGEST_CUTOFF, _close, typo_of
from playline.config import Settings
from playline.contract import ChunkStats, PlayRunResult
from playline.datasets.csv_io import scan_csv
from playline.stores.backends import open_stores
from tests.conftest import new_id
from tests.e2e.test_cli_failures import playline
from tests.plays import BOOM, lead, write_csv

#: ``t_tool_column``'s resolver that fails the rows whose first name is ``BOOM``.
FAIL_ON_BOOM = json.dumps({"column_tool": "fail_on_boom"})


def error_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The one ``error:`` line on stderr, after checking the exit code and the needles."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# -- which runs exit 3 (no server) ----------------------------------------------


def result_of(**stats: int) -> PlayRunResult:
    return PlayRunResult(play="p", stats=ChunkStats(**stats))


def test_only_failed_rows_count_against_a_run() -> None:
    # Nothing admitted, every row skipped for budget, rows answered from receipts:
    # nothing failed, so nothing to exit for, even with --fail-on-row-errors.
    for quiet in (
        result_of(),
        result_of(rows_skipped_budget=60),
        result_of(rows_ok=60, rows_cached=60),
        result_of(rows_not_sent=3),
    ):
        assert rows_failed(quiet, "id") is None
        assert rows_failed(quiet, "id", any_row=True) is None
    mixed = result_of(rows_ok=59, rows_failed=1)
    assert rows_failed(mixed, "id") is None
    assert rows_failed(mixed, "id", any_row=True) == (
        "1 of 60 rows failed (--fail-on-row-errors); see `playline runs get id`"
    )
    # Failed rows next to rows skipped for budget and none succeeded: none succeeded.
    stopped = PlayRunResult(
        play="p",
        stats=ChunkStats(rows_failed=2, rows_skipped_budget=58, first_error="E: x\n  y"),
    )
    for any_row in (False, True):
        assert rows_failed(stopped, "id", any_row=any_row) == (
            "no row succeeded (2 failed; first error: E: x y); see `playline runs get id`"
        )


def test_only_a_near_copy_of_a_known_play_is_taken_for_a_typo() -> None:
    known = ["enrich_leads", "t_async_waterfall", "t_scalar_waterfall", "t_tool_column"]
    assert typo_of("enrich_leds", known) == "enrich_leads"
    assert typo_of("Enrich_Leads", known) == "enrich_leads"
    assert typo_of("t_tool_colunm", known) == "t_tool_column"
    # Siblings a worker may well have are not typos: they are started (with a hint).
    for sibling in ("t_waterfall", "enrich_leads_v2", "enrich_leads2", "enrich_contacts"):
        assert typo_of(sibling, known) is None, sibling
    assert _close("t_waterfall", known, SUGGEST_CUTOFF, 3)
    assert _close("no_such_play", known, SUGGEST_CUTOFF, 3) == []


# -- exit 3 -------------------------------------------------------------------


async def test_a_run_whose_every_row_failed_exits_3_with_one_line(
    provider, worker, temporal_address: str, task_queue: str, home: Path, tmp_path: Path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i, first_name=BOOM) for i in range(3)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    plain_id, json_id = new_id("all-failed"), new_id("all-failed-json")
    async with worker():
        plain = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--input",
            FAIL_ON_BOOM,
            "--id",
            plain_id,
            *common,
            home=home,
        )
        as_json = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--input",
            FAIL_ON_BOOM,
            "--id",
            json_id,
            "--json",
            *common,
            home=home,
        )
    line = error_line(
        plain,
        EXIT_ROWS_FAILED,
        "error: no row succeeded (3 failed; first error: ",
        "boom: refusing lead T000",
        f"see `playline runs get {plain_id}`",
    )
    print(line)
    assert "play t_tool_column completed" in plain.stdout  # the summary still comes first
    assert "rows: 0 ok, 3 failed" in plain.stdout
    error_line(as_json, EXIT_ROWS_FAILED, "no row succeeded (3 failed", json_id)
    document = json.loads(as_json.stdout)  # stdout is still one JSON document, whole
    assert document["status"] == "COMPLETED"
    assert (document["result"]["stats"]["rows_ok"], document["result"]["stats"]["rows_failed"]) == (
        0,
        3,
    )
    assert provider.ledger()["received"] == 0  # the resolver fails before any call


async def test_fail_on_row_errors_exits_3_for_one_failed_row_and_a_normal_run_exits_0(
    provider, worker, temporal_address: str, task_queue: str, home: Path, tmp_path: Path
) -> None:
    one_boom = write_csv(
        tmp_path / "one-boom.csv", [lead(0), lead(1, first_name=BOOM), lead(2), lead(3)]
    )
    clean = write_csv(tmp_path / "clean.csv", [lead(i) for i in range(10, 13)])
    common = ("--address", temporal_address, "--task-queue", task_queue, "--input", FAIL_ON_BOOM)
    strict_id = new_id("strict")
    async with worker():
        lenient = await playline("run", "t_tool_column", "--csv", str(one_boom), *common, home=home)
        strict = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(one_boom),
            "--fail-on-row-errors",
            "--id",
            strict_id,
            *common,
            home=home,
        )
        clean_strict = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(clean),
            "--fail-on-row-errors",
            "--json",
            *common,
            home=home,
        )
    # Without the flag a run with rows that succeeded exits 0, as before.
    assert lenient.returncode == 0, lenient.stderr
    assert "rows: 3 ok, 1 failed" in lenient.stdout
    assert not [x for x in lenient.stderr.splitlines() if x.startswith("error:")], lenient.stderr
    error_line(
        strict,
        EXIT_ROWS_FAILED,
        "error: 1 of 4 rows failed (--fail-on-row-errors; first error: ",
        "boom: refusing lead T0001",
        f"see `playline runs get {strict_id}`",
    )
    assert "rows: 3 ok, 1 failed" in strict.stdout
    # No failed row: 0 with the flag too.
    assert clean_strict.returncode == 0, clean_strict.stderr
    assert json.loads(clean_strict.stdout)["result"]["stats"]["rows_ok"] == 3


# -- exit 2: a mistyped play ----------------------------------------------------


async def test_a_mistyped_play_is_refused_before_anything_is_uploaded_or_started(
    client: Client, worker, temporal_address: str, task_queue: str, home: Path, tmp_path: Path
) -> None:
    csv_path = write_csv(tmp_path / "typo.csv", [lead(i) for i in range(20, 23)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    run_id, forced_id = new_id("typo"), new_id("typo-forced")
    async with worker():
        started = time.monotonic()
        refused = await playline(
            "run", "enrich_leds", "--csv", str(csv_path), "--id", run_id, *common, home=home
        )
        took = time.monotonic() - started
        line = error_line(
            refused,
            EXIT_REFUSED,
            "error: no play named 'enrich_leds'; did you mean 'enrich_leads'? (the worker on "
            f"task queue {task_queue!r} has: ",
            "--no-play-check",
        )
        print(f"{line}\n(refused after {took:.1f}s)")  # a figure for the record, not asserted
        assert "uploaded" not in refused.stderr and "started enrich_leds" not in refused.stderr
        # Nothing was started...
        with pytest.raises(RPCError) as missing:
            await client.get_workflow_handle(run_id).describe()
        assert missing.value.status == RPCStatusCode.NOT_FOUND
        assert [w async for w in client.list_workflows(f"WorkflowId = '{run_id}'")] == []
        # ...and nothing uploaded: the store has no dataset of this file's bytes.
        dataset_id = f"typo.csv@{scan_csv(csv_path)[:16]}"
        async with await open_stores(Settings.from_env(home=home), create=True) as stores:
            assert await stores.sheet.source(dataset_id) is None

        # A worker that did have such a play: --no-play-check starts it; here none has
        # it, so the workers' guard ends it, as for any play no worker has.
        forced = await playline(
            "run",
            "enrich_leds",
            "--no-play-check",
            "--input",
            "{}",
            "--id",
            forced_id,
            *common,
            home=home,
        )
    error_line(forced, 1, "no worker on task queue", "enrich_leads", "terminated")
    desc = await client.get_workflow_handle(forced_id).describe()
    assert desc.status == WorkflowExecutionStatus.TERMINATED
