"""Hostile rows end to end: a bad value fails its row only, nothing else is lost or leaked.

Real Temporal dev server, in-process workers, the real provider server, SQLite (and
PostgreSQL where marked). Each test is about one finding of the 2026-12-03 review:

* F9: a cell the sheet cannot store (NaN, Infinity, a NUL, a datetime) fails its own
  row, with a message naming the column; the chunk is not retried, the other rows
  are done;
* F10: keyless runs key rows by source and position, so two files run into one
  dataset never merge; ``mode='net_new'`` without a key is refused before anything
  runs; repeated row keys are reported (how many, the first few), by the result and
  by the CLI's summary;
* F17: with ``preview_rows=0`` neither a row's key nor a provider's error text reaches
  history (rows are named by position, errors by type);
* F4: ``ctx.tool``'s receipt lease is renewed while its call runs, so a second play
  asking for the same call meanwhile waits for the answer instead of paying again.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from playline import demo
from playline.contract import PlayRunResult, RunOptions
from playline.errors import root_cause
from tests.conftest import new_id
from tests.e2e.test_bad_input import assert_nothing_dispatched, fails_with
from tests.e2e.test_cli import playline
from tests.pg import pg_schema
from tests.plays import export_rows, lead, read_csv_rows, run, write_csv
from tests.plays_datasets import HOSTILE_KINDS

# -- helpers ------------------------------------------------------------------


def activity_attempts(history: Any) -> list[int]:
    return [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]


async def history_bytes(client: Client, *workflow_ids: str) -> bytes:
    """Every event of these workflows' histories (every run of each), as stored: without
    a codec, payloads and failure messages are plain text in them."""
    blob = b""
    for workflow_id in workflow_ids:
        handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(workflow_id)
        async for event in handle.fetch_history_events():
            blob += event.SerializeToString()
    return blob


# -- F9: an unstorable cell fails its row only --------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    if request.param == "sqlite":
        yield None
        return
    async with pg_schema() as url:
        yield url


async def test_an_unstorable_cell_fails_its_row_only_and_the_chunk_is_not_retried(
    client, provider, worker, task_queue, tmp_path, store_url
) -> None:
    """One chunk holds good rows and rows whose value is NaN, Infinity, a NUL or a
    datetime: each bad row fails with the column named, the good ones are stored, the
    chunk ran once and the play completes. (Before: PostgreSQL's jsonb refused the
    group's write, the chunk was retried 20 times and the play failed; SQLite kept
    NaN, which is not JSON, and failed the chunk on a datetime.)"""
    rows = [{"id": "g0", "kind": "ok"}]
    for n, kind in enumerate(HOSTILE_KINDS, start=1):  # good and bad rows interleaved
        rows += [{"id": f"bad-{kind}", "kind": kind}, {"id": f"g{n}", "kind": "ok"}]
    settings = {"store_url": store_url} if store_url else {}
    play_id = new_id("hostile")
    async with worker(**settings):
        result: PlayRunResult = await run(
            client,
            "t_hostile_cells",
            {"rows": rows},
            task_queue=task_queue,
            options=RunOptions(chunk_size=len(rows), preview_rows=20),
            workflow_id=play_id,
            timeout_s=90,
        )
        child_history = await client.get_workflow_handle(
            f"{play_id}/dataset/t_hostile"
        ).fetch_history()

    output = result.output or {}
    bad_ids = {f"bad-{kind}" for kind in HOSTILE_KINDS}
    ok_ids = {r["id"] for r in rows} - bad_ids
    assert output["count"] == len(rows)
    assert output["rows_failed"] == len(HOSTILE_KINDS)
    assert output["rows_ok"] == len(ok_ids)
    by_id = {r["id"]: r for r in output["rows"]}
    assert set(by_id) == {r["id"] for r in rows}
    for row_id in ok_ids:
        assert by_id[row_id]["value"] == f"ok:{row_id}"
        assert by_id[row_id]["after"] == f"after:ok:{row_id}"
        assert not by_id[row_id].get("_error")
    for row_id in bad_ids:
        # Nothing unstorable was stored: the column is empty, the row failed.
        value = by_id[row_id].get("value")
        assert value is None or not (isinstance(value, float) and math.isnan(value))
        assert by_id[row_id]["_error"].startswith(
            "UnstorableValue: column 'value' returned a value the sheet cannot store"
        ), by_id[row_id]
    assert "NUL" in by_id["bad-nul"]["_error"]
    assert result.stats.rows_failed == len(HOSTILE_KINDS)
    first_error = result.stats.first_error or ""
    assert "UnstorableValue" in first_error
    # One chunk, run once: no retry, let alone twenty.
    attempts = activity_attempts(child_history)
    assert attempts == [1]


async def test_the_export_shows_why_a_row_failed_and_holds_no_unstorable_value(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    rows = [{"id": "a", "kind": "ok"}, {"id": "b", "kind": "nan"}, {"id": "c", "kind": "nul"}]
    async with worker():
        result = await run(client, "t_hostile_cells", {"rows": rows}, task_queue=task_queue)
    assert result.stats.rows_ok == 1 and result.stats.rows_failed == 2
    await export_rows(home, result.datasets[0].run_ref, tmp_path / "out.csv")
    exported = {r["id"]: r for r in read_csv_rows(tmp_path / "out.csv")}
    assert exported["a"]["value"] == "ok:a" and exported["a"]["after"] == "after:ok:a"
    assert exported["a"]["_error"] == ""
    for row_id in ("b", "c"):
        assert exported[row_id]["value"] == ""
        assert exported[row_id]["_error"].startswith("UnstorableValue: column 'value'")
    assert exported["b"]["after"] == "after:nan"  # the row's other cells are kept
    # No NUL reached the sheet (nor, through it, the export).
    assert b"\x00" not in (tmp_path / "out.csv").read_bytes()


# -- F10: keyless runs never merge files; net_new needs a key; duplicate keys --


async def test_two_keyless_files_run_into_one_dataset_keep_their_rows_apart(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """Two different files, no row key, the same dataset: the second run's row 0 is not
    the first run's row 0, so the first run's export still shows its own people."""
    first = write_csv(tmp_path / "first.csv", [lead(n) for n in range(3)])
    second = write_csv(tmp_path / "second.csv", [lead(n) for n in range(100, 103)])
    play_input = {"column_tool": "email", "key": "", "dataset": "t_keyless"}
    async with worker():
        one = await run(
            client, "t_tool_column", {**play_input, "csv_path": str(first)}, task_queue=task_queue
        )
        two = await run(
            client, "t_tool_column", {**play_input, "csv_path": str(second)}, task_queue=task_queue
        )
        again = await run(
            client, "t_tool_column", {**play_input, "csv_path": str(first)}, task_queue=task_queue
        )
    assert one.stats.rows_ok == two.stats.rows_ok == 3
    # Every person of the second file was new: three calls of its own.
    assert two.stats.calls_made == 3 and two.stats.rows_cached == 0
    # The same file again finds its rows (and receipts): nothing paid.
    assert again.stats.calls_made == 0 and again.stats.rows_cached == 3
    ledger = provider.ledger()
    assert ledger["charged"] == 6 and ledger["double_charged"] == 0

    await export_rows(home, one.datasets[0].run_ref, tmp_path / "one.csv")
    await export_rows(home, two.datasets[0].run_ref, tmp_path / "two.csv")
    rows_one = read_csv_rows(tmp_path / "one.csv")
    rows_two = read_csv_rows(tmp_path / "two.csv")
    assert [r["lead_id"] for r in rows_one] == ["T0000", "T0001", "T0002"]
    assert [r["first_name"] for r in rows_one] == ["Fn0", "Fn1", "Fn2"]
    assert [r["lead_id"] for r in rows_two] == ["T0100", "T0101", "T0102"]
    # Each row's computed email is its own person's (the provider derives it from the name).
    for row in rows_one + rows_two:
        assert row["first_name"].lower() in row["value"].lower(), row


async def test_net_new_without_a_key_is_refused_before_anything_runs(
    client, provider, worker, task_queue, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(4)])
    play_id = new_id("netnew-nokey")
    async with worker():
        cause = await fails_with(
            client,
            task_queue,
            "t_tool_column",
            {"csv_path": str(csv_path), "key": "", "mode": "net_new"},
            workflow_id=play_id,
        )
    assert "mode='net_new' needs a row key" in cause.message
    assert "\n" not in cause.message
    assert_nothing_dispatched(provider)
    history = await client.get_workflow_handle(play_id).fetch_history()
    kinds = {e.event_type for e in history.events}
    assert EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED not in kinds
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert "playline.prepare_run" not in scheduled  # no run was even prepared


#: Four keys repeat (five repeated rows): a run shows the first three.
DUPLICATED = [lead(n) for n in (0, 1, 1, 2, 3, 3, 3, 4, 2, 4)]


async def test_duplicate_row_keys_are_reported_by_the_result(
    client, provider, worker, task_queue, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "dups.csv", DUPLICATED)
    async with worker():
        result = await run(
            client, "t_tool_column", {"csv_path": str(csv_path)}, task_queue=task_queue
        )
        hidden = await run(
            client,
            "t_tool_column",
            {"csv_path": str(csv_path), "dataset": "t_rows_hidden"},
            task_queue=task_queue,
            options=RunOptions(preview_rows=0),
        )
    dataset = result.datasets[0]
    assert dataset.total == 10 and dataset.admitted == 5 and dataset.duplicates == 5
    # The first repeated keys, in the order they first occur (at most three).
    assert dataset.duplicate_keys == ["T0001", "T0002", "T0003"]
    assert result.stats.rows_ok == 5
    # A run that may show no rows reports how many, not which.
    assert hidden.datasets[0].duplicates == 5 and hidden.datasets[0].duplicate_keys == []


async def test_the_cli_summary_counts_duplicate_row_keys_and_names_the_first(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "dups.csv", DUPLICATED)
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        done = await playline(
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--id",
            new_id("cli-dups"),
            *common,
            home=home,
        )
    assert done.returncode == 0, done.stderr
    assert "rows: 5 ok, 0 failed" in done.stdout
    assert "duplicate row keys: 5 (first: 'T0001', 'T0002', 'T0003')" in done.stdout


# -- F17: preview_rows=0 keeps row keys and provider text out of history ------

#: A person nobody else is: their key and names must not reach history.
SECRET_LEAD = ["jane.doe.x7q@acme.example", "Janeqx", "Doeqx", ""]
#: What the provider server says of a request without a domain.
PROVIDER_TEXT = b"must be a non-empty string"
#: email_finder as the demo catalog has it...
REQUIRED_DOMAIN = (
    'path = "/acme/v1/email/find"\n'
    'input = { first_name = "str", last_name = "str", domain = "str" }\n'
)


def optional_domain_catalog(tmp_path: Path) -> Path:
    """The demo catalog with email_finder's domain declared optional (``str?``), so a
    row without one is sent as it is and the provider rejects it (a required field left
    blank would never be sent: ``skipped_input``)."""
    text = demo.CATALOG.read_text()
    assert REQUIRED_DOMAIN in text
    path = tmp_path / "optional_domain.toml"
    path.write_text(text.replace(REQUIRED_DOMAIN, REQUIRED_DOMAIN.replace('"str" }', '"str?" }')))
    return path


@pytest.mark.parametrize("on_row_error", ["isolate", "fail"])
async def test_with_preview_rows_0_no_row_key_or_provider_text_reaches_history(
    client, provider, worker, task_queue, tmp_path, on_row_error
) -> None:
    """A row the provider rejects (422, its body names the problem) in a run with
    ``preview_rows=0``: the error is in the sheet for an export, while history (the
    chunk's result, the run's and the play's, the play's failure) names the row by
    position and the error by type."""
    rows = [lead(0), SECRET_LEAD, lead(2)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    play_id = new_id("quiet")
    play_input = {"csv_path": str(csv_path), "on_row_error": on_row_error}
    options = RunOptions(preview_rows=0, chunk_size=3)
    async with worker(catalog_path=str(optional_domain_catalog(tmp_path))):
        if on_row_error == "fail":
            with pytest.raises(WorkflowFailureError) as failure:
                await run(
                    client,
                    "t_tool_column",
                    play_input,
                    task_queue=task_queue,
                    options=options,
                    workflow_id=play_id,
                )
            said = root_cause(failure.value).message
        else:
            result = await run(
                client,
                "t_tool_column",
                play_input,
                task_queue=task_queue,
                options=options,
                workflow_id=play_id,
            )
            assert result.stats.rows_ok == 2 and result.stats.rows_failed == 1
            said = result.stats.first_error or ""
        blob = await history_bytes(client, play_id, f"{play_id}/dataset/t_rows")
    # The provider did reject the row with its text (so there was text to leak).
    assert provider.ledger()["invalid"] >= 1
    assert "row #1" in said and "ProviderRejected" in said
    for secret in (SECRET_LEAD[0], SECRET_LEAD[1], SECRET_LEAD[2]):
        assert secret.encode() not in blob, secret
    assert PROVIDER_TEXT not in blob
    for other in (lead(0), lead(2)):
        assert other[0].encode() not in blob  # no row key at all


# -- F4: ctx.tool renews its lease while its call runs -------------------------


async def test_a_scalar_tool_call_longer_than_its_lease_keeps_it_and_nobody_pays_again(
    client, provider, worker, task_queue
) -> None:
    """``ctx.tool``'s call takes longer than its lease TTL (the heartbeat timeout, 2 s);
    a second play asks for the same call after that TTL. The first call's lease was
    renewed, so the second waits for its answer instead of claiming the receipt and
    paying again (the provider here, like most real APIs, ignores Idempotency-Key)."""
    provider.configure(latency_ms=[5000, 5000], idempotency="ignore")
    options = RunOptions(heartbeat_timeout_s=2)
    play_input = {"domain": "slow-lease.example"}
    async with worker():
        first = asyncio.ensure_future(
            run(client, "t_scalar", play_input, task_queue=task_queue, options=options)
        )
        deadline = time.monotonic() + 30
        while provider.ledger()["in_flight"] < 1:
            assert time.monotonic() < deadline, "the first call never reached the provider"
            assert not first.done(), first
            await asyncio.sleep(0.05)
        # Outlive the first claim's TTL: a lease nobody renews would have lapsed now.
        await asyncio.sleep(3)
        assert provider.ledger()["charged"] == 0  # the first call is still in flight
        second = await run(client, "t_scalar", play_input, task_queue=task_queue, options=options)
        first_result = await first
    ledger = provider.ledger()
    assert ledger["received"] == 1 and ledger["charged"] == 1
    assert ledger["double_charged"] == 0
    # The second play got the first one's answer (scalar calls are not in a play's stats).
    assert second.output == first_result.output and first_result.output["company_name"]
