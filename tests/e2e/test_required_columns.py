"""A ``--csv`` without a column the play declares costs nothing: ``playline run`` (and
``estimate``) read its header on the user's machine and refuse it before any upload
or workflow start, exit 2, in one line; the columns are the ones the workers
published with their plays, or, with no worker, the play's as the CLI imports it.

Real processes: the ``playline`` command against the session's Temporal dev server,
an in-process worker with the demo's and the test plays, the real SQLite store.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from playline.cli.run import EXIT_REFUSED
from playline.config import Settings
from playline.datasets.csv_io import scan_csv
from playline.demo.enrich_leads import REQUIRED_COLUMNS
from playline.published_plays import read_published_plays
from playline.stores.backends import open_stores
from tests.conftest import new_id
from tests.e2e.test_cli_exit_codes import error_line
from tests.e2e.test_cli_failures import playline

#: The demo's leads with ``domain`` where ``company_domain`` is required.
BAD_HEADER = ["lead_id", "first_name", "last_name", "domain"]


async def play_runs(client: Client, play: str) -> int:
    return (await client.count_workflows(f"WorkflowType = '{play}'")).count


async def assert_nothing_left(client: Client, home: Path, csv_path: Path, run_id: str) -> None:
    """No workflow of that id, and no dataset of the file's bytes in the store."""
    with pytest.raises(RPCError) as missing:
        await client.get_workflow_handle(run_id).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND
    dataset_id = f"{csv_path.name}@{scan_csv(csv_path)[:16]}"
    async with await open_stores(Settings.from_env(home=home), create=True) as stores:
        assert await stores.sheet.source(dataset_id) is None


async def test_a_csv_without_a_required_column_is_refused_before_any_upload_or_start(
    client: Client, worker, temporal_address: str, task_queue: str, home: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "my_leads.csv"
    bad.write_text(",".join(BAD_HEADER) + "\nL1,Ada,Lovelace,analytical.example\n")
    common = ("--address", temporal_address, "--task-queue", task_queue)
    before = await play_runs(client, "enrich_leads")
    header = "the header has 4 columns: 'lead_id', 'first_name', 'last_name', 'domain'"
    async with worker():
        deadline = time.monotonic() + 60
        published = None
        while published is None and time.monotonic() < deadline:
            published = await read_published_plays(client, task_queue)
            await asyncio.sleep(0.2)
        assert published is not None
        assert published.columns["enrich_leads"] == REQUIRED_COLUMNS
        assert published.columns["t_tool_column"] == []

        # The workers' declaration, read before anything is uploaded or started.
        run_id = new_id("cols")
        refused = await playline(
            "run", "enrich_leads", "--csv", str(bad), "--id", run_id, *common, home=home
        )
        error_line(
            refused,
            EXIT_REFUSED,
            f"error: {bad} lacks column(s) play 'enrich_leads' requires: "
            "'company_domain' (did you mean 'domain'?);",
            header,
            "nothing was uploaded or started",
            f"declared by the workers on task queue {task_queue!r}",
        )
        # The upload and the start each print a line: neither did.
        assert "to the store as" not in refused.stderr + refused.stdout
        assert "started enrich_leads" not in refused.stderr + refused.stdout
        await assert_nothing_left(client, home, bad, run_id)

        # `plays list` shows each play's columns, from the workers and from here.
        listing = await playline("plays", "list", "--json", *common, home=home)
        assert listing.returncode == 0, listing.stderr
        document = json.loads(listing.stdout)
        by_worker = {p["play"]: p for p in document["workers"]["plays"]}
        assert by_worker["enrich_leads"]["required_columns"] == REQUIRED_COLUMNS
        assert by_worker["t_tool_column"]["required_columns"] == []
        here = {p["play"]: p for p in document["registered_here"]}
        assert here["enrich_leads"]["required_columns"] == REQUIRED_COLUMNS
        text = await playline("plays", "list", *common, home=home)
        assert text.returncode == 0, text.stderr
        # The play's lines in the registered lists (not its line of recent runs, which
        # other tests on this namespace fill).
        shown = [
            line
            for line in text.stdout.splitlines()
            if "enrich_leads" in line and " runs, " not in line
        ]
        columns = f"requires columns {', '.join(REQUIRED_COLUMNS)}"
        assert len(shown) >= 2 and all(columns in line for line in shown), text.stdout

    # No worker answers: the play as this CLI imports it (the demo's module) decides,
    # for `estimate` as for `run`.
    for command in ("run", "estimate"):
        run_id = new_id(f"cols-{command}")
        refused = await playline(
            command, "enrich_leads", "--csv", str(bad), "--id", run_id, *common, home=home
        )
        error_line(
            refused,
            EXIT_REFUSED,
            "'company_domain' (did you mean 'domain'?)",
            header,
            "declared by the play as imported here (playline.demo.enrich_leads)",
        )
        await assert_nothing_left(client, home, bad, run_id)
    # Nothing of the play was started on the namespace by any of the three.
    assert await play_runs(client, "enrich_leads") == before
