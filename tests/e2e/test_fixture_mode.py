"""Fixture integration mode end to end: tools resolve from fixture files, never over HTTP."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from playline.contract import PlayState, RunOptions
from playline.errors import root_cause
from playline.provider_server.fake_data import find_email
from tests.conftest import new_id
from tests.plays import export_rows, lead, read_csv_rows, run, write_csv

BYPASSED = "Fixture mode: provider pacing bypassed because no provider request is dispatched."
ENFORCED = "Fixture mode: provider pacing explicitly enforced for production-parity testing."


def fixture_email(row: list[str]) -> str:
    return f"fixture.{row[0].lower()}@{row[3]}"


def write_fixtures(path: Path, rows: list[list[str]]) -> Path:
    """One ``email_finder`` fixture per row, with the input exactly as the resolver sends it."""
    lines = []
    for lead_id, first, last, domain in rows:
        lines.append(
            json.dumps(
                {
                    "tool": "email_finder",
                    # Key order differs from the resolver's: matching is canonical.
                    "input": {"domain": domain, "last_name": last, "first_name": first},
                    "result": {"email": fixture_email([lead_id, first, last, domain])},
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


async def run_with_state(
    client: Any,
    task_queue: str,
    play_input: dict[str, Any],
    options: RunOptions,
    workflow_id: str | None = None,
) -> tuple[Any, PlayState]:
    """Run a play, then query its ``state`` (answered by replay while the worker runs)."""
    workflow_id = workflow_id or new_id("fixture")
    result = await run(
        client,
        "t_tool_column",
        play_input,
        task_queue=task_queue,
        options=options,
        workflow_id=workflow_id,
    )
    state = await client.get_workflow_handle(workflow_id).query("state", result_type=PlayState)
    return result, state


def assert_no_http(provider: Any) -> None:
    ledger = provider.ledger()
    assert ledger["received"] == 0, ledger
    assert ledger["charged"] == 0


@pytest.fixture
def no_api_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixture mode needs no provider credentials: prove it by removing them."""
    monkeypatch.delenv("ACME_API_KEY", raising=False)
    monkeypatch.delenv("FIRMO_API_KEY", raising=False)


async def test_fixture_mode_resolves_from_fixtures_without_http(
    client, provider, worker, task_queue, home, tmp_path, no_api_keys
) -> None:
    rows = [lead(n) for n in range(6)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    fixtures = write_fixtures(tmp_path / "email.jsonl", rows)
    options = RunOptions(integration_mode="fixture", fixtures=[str(fixtures)])
    async with worker():
        result, state = await run_with_state(
            client, task_queue, {"csv_path": str(csv_path)}, options
        )

    assert result.integration_mode == "fixture"
    (dataset,) = result.datasets
    assert dataset.stats.rows_ok == 6
    assert dataset.stats.rows_failed == 0
    assert result.stats.credits == 0
    assert BYPASSED in state.log
    assert ENFORCED not in state.log
    assert state.phase == "completed"
    await export_rows(home, dataset.run_ref, tmp_path / "out.csv")
    exported = {r["lead_id"]: r["value"] for r in read_csv_rows(tmp_path / "out.csv")}
    assert exported == {row[0]: fixture_email(row) for row in rows}
    assert_no_http(provider)


async def test_missing_fixture_is_recorded_on_its_row(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    rows = [lead(n) for n in range(5)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    fixtures = write_fixtures(tmp_path / "email.jsonl", [r for r in rows if r[0] != "T0003"])
    options = RunOptions(integration_mode="fixture", fixtures=[str(fixtures)])
    async with worker():
        result, _ = await run_with_state(
            client, task_queue, {"csv_path": str(csv_path), "on_row_error": "isolate"}, options
        )

    (dataset,) = result.datasets
    assert dataset.stats.rows_ok == 4
    assert dataset.stats.rows_failed == 1
    await export_rows(home, dataset.run_ref, tmp_path / "out.csv")
    exported = {r["lead_id"]: r for r in read_csv_rows(tmp_path / "out.csv")}
    missing = exported["T0003"]
    assert missing["_error"].startswith(
        "FixtureMissing: fixture mode: no fixture for tool 'email_finder' with input digest "
    )
    assert missing["value"] == ""
    for row in rows:
        if row[0] != "T0003":
            assert exported[row[0]]["_error"] == ""
            assert exported[row[0]]["value"] == fixture_email(row)
    assert_no_http(provider)


async def test_enforced_fixture_pacing_still_makes_no_http_call(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = [lead(n) for n in range(5)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    fixtures = write_fixtures(tmp_path / "email.jsonl", rows)
    options = RunOptions(
        integration_mode="fixture", fixtures=[str(fixtures)], enforce_fixture_pacing=True
    )
    async with worker():
        result, state = await run_with_state(
            client, task_queue, {"csv_path": str(csv_path)}, options
        )

    assert result.datasets[0].stats.rows_ok == 5
    assert {r["value"] for r in result.output["preview"]} == {fixture_email(r) for r in rows}
    assert ENFORCED in state.log
    assert BYPASSED not in state.log
    assert_no_http(provider)


async def test_fixture_answers_never_leak_into_a_live_run(
    client, provider, worker, task_queue, tmp_path
) -> None:
    """Fixture receipts have their own scope: a live run on the same home pays for real answers."""
    rows = [lead(n) for n in range(4)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    fixtures = write_fixtures(tmp_path / "email.jsonl", rows)
    play_input = {"csv_path": str(csv_path), "dataset": "t_scope"}
    async with worker():
        fixture_run = await run(
            client,
            "t_tool_column",
            play_input,
            task_queue=task_queue,
            options=RunOptions(integration_mode="fixture", fixtures=[str(fixtures)]),
        )
        assert_no_http(provider)
        live_run = await run(client, "t_tool_column", play_input, task_queue=task_queue)

    assert fixture_run.datasets[0].stats.rows_ok == 4
    assert live_run.integration_mode == "live"
    assert live_run.stats.calls_made == 4
    assert live_run.stats.calls_cached == 0
    assert provider.ledger()["charged"] == 4
    live_values = {r["lead_id"]: r["value"] for r in live_run.output["preview"]}
    assert live_values == {row[0]: find_email(row[1], row[2], row[3])["email"] for row in rows}


async def fixture_failure(
    client: Any, task_queue: str, csv_path: Path, options: RunOptions
) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as info:
        await run(
            client,
            "t_tool_column",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=options,
        )
    cause = root_cause(info.value)
    assert isinstance(cause, ApplicationError)
    return cause


async def test_fixture_mode_without_fixtures_or_with_a_bad_file_fails_before_dispatch(
    client, provider, worker, task_queue, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(3)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tool": "email_finder", "input": {}, "result": {}}\nnot json\n')
    async with worker():
        none_given = await fixture_failure(
            client, task_queue, csv_path, RunOptions(integration_mode="fixture")
        )
        malformed = await fixture_failure(
            client,
            task_queue,
            csv_path,
            RunOptions(integration_mode="fixture", fixtures=[str(bad)]),
        )
        absent = await fixture_failure(
            client,
            task_queue,
            csv_path,
            RunOptions(integration_mode="fixture", fixtures=[str(tmp_path / "nope.jsonl")]),
        )

    assert none_given.type == "InvalidPlayInput"
    assert "fixture mode needs at least one fixture file" in none_given.message
    assert malformed.type == "InvalidPlayInput"
    assert f"{bad}:2: a fixture line needs JSON" in malformed.message
    assert absent.type == "InvalidPlayInput"
    assert "nope.jsonl does not exist" in absent.message
    assert_no_http(provider)


def chunk_ranges(events: Any) -> list[tuple[int, int]]:
    """The ``(start, end)`` of every chunk activity scheduled in a DatasetRun history."""
    ranges = []
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "playline.run_chunk":
                payload = json.loads(attrs.input.payloads[0].data)
                ranges.append((payload["start"], payload["end"]))
    return sorted(ranges)


async def test_chunks_are_sized_by_time_unless_pinned(
    client, provider, worker, task_queue, tmp_path
) -> None:
    """Fast (fixture) rows get ever larger chunks; ``chunk_size`` pins them; no row is lost."""
    rows = [lead(n) for n in range(1200)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    fixtures = write_fixtures(tmp_path / "fixtures.jsonl", rows)
    sized, pinned = new_id("sized"), new_id("pinned")
    async with worker():
        for workflow_id, options in (
            (sized, RunOptions(integration_mode="fixture", fixtures=[str(fixtures)])),
            (
                pinned,
                RunOptions(integration_mode="fixture", fixtures=[str(fixtures)], chunk_size=50),
            ),
        ):
            result = await run(
                client,
                "t_tool_column",
                {"csv_path": str(csv_path), "dataset": workflow_id},
                task_queue=task_queue,
                options=options,
                workflow_id=workflow_id,
            )
            assert result.stats.rows_ok == 1200
    sized_chunks = chunk_ranges(
        (await client.get_workflow_handle(f"{sized}/dataset/{sized}").fetch_history()).events
    )
    pinned_chunks = chunk_ranges(
        (await client.get_workflow_handle(f"{pinned}/dataset/{pinned}").fetch_history()).events
    )
    for chunks in (sized_chunks, pinned_chunks):  # contiguous, no gap, no overlap
        assert chunks[0][0] == 0 and chunks[-1][1] == 1200
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    assert {end - start for start, end in pinned_chunks} == {50}
    sizes = [end - start for start, end in sized_chunks]
    assert sizes[0] == 25 and max(sizes) > 100
    assert len(sized_chunks) < len(pinned_chunks) < 1200 / 25
    assert_no_http(provider)


async def test_counts_and_progress_carry_across_continue_as_new(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """A dataset run that continues as new (3 chunks per run, 4 runs) loses no row, counts
    each once, and the play's progress ends at the full count."""
    rows = [lead(n) for n in range(100)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    fixtures = write_fixtures(tmp_path / "fixtures.jsonl", rows)
    options = RunOptions(
        integration_mode="fixture",
        fixtures=[str(fixtures)],
        chunk_size=10,
        chunks_per_workflow_run=3,
        max_chunks_in_flight=2,
    )
    workflow_id = new_id("rolled")
    child_id = f"{workflow_id}/dataset/{workflow_id}"
    async with worker():
        play_input = {"csv_path": str(csv_path), "dataset": workflow_id}
        result, state = await run_with_state(client, task_queue, play_input, options, workflow_id)
        (dataset,) = result.datasets
        runs = [w async for w in client.list_workflows(f'WorkflowId = "{child_id}"')]
    assert len(runs) == 4  # 10 chunks at 3 per run: three continued as new, one completed
    assert dataset.stats.rows_ok == 100 and dataset.stats.rows_failed == 0
    assert result.stats.rows_ok == 100
    assert (state.rows_total, state.rows_done, state.rows_failed) == (100, 100, 0)
    assert state.phase == "completed"
    await export_rows(home, dataset.run_ref, tmp_path / "out.csv")
    exported = {r["lead_id"]: r["value"] for r in read_csv_rows(tmp_path / "out.csv")}
    assert exported == {row[0]: fixture_email(row) for row in rows}
    assert_no_http(provider)
