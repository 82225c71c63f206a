"""Bad input gets a clear, typed error before anything is dispatched to a provider.

Each test starts a play that must fail, then checks the root cause's type and
message and that the provider received nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from playline.errors import root_cause
from tests.conftest import new_id
from tests.plays import (
    DECLARED_UNKNOWN_TOOL,
    UNDECLARED_TOOL,
    lead,
    run,
    write_csv,
)

KNOWN_TOOLS = (
    "company_lookup, email_finder, mailfox_email, person_enrich, prospectr_contact, "
    "prospectr_email, verifly_verify"
)

#: Regression guard for f12e22a: an invalid play input used to hang the play (the
#: generated ``run`` was typed with the input model, so decoding the workflow
#: arguments failed the workflow *task*, retried forever). A correct failure takes
#: well under a second; a hang now fails the test fast with the task's failure.
INVALID_INPUT_TIMEOUT_S = 10.0


async def fails_with(
    client: Any,
    task_queue: str,
    play: str,
    play_input: Any,
    *,
    timeout_s: float = 60.0,
    workflow_id: str | None = None,
) -> ApplicationError:
    """Run a play that must fail (as ``workflow_id``, default a new id); its root cause.

    A play that hangs instead (e.g. its workflow task keeps failing) fails the test
    with the workflow task's failure message, and is terminated.
    """
    workflow_id = workflow_id or new_id(play)
    try:
        with pytest.raises(WorkflowFailureError) as info:
            await run(
                client,
                play,
                play_input,
                task_queue=task_queue,
                workflow_id=workflow_id,
                timeout_s=timeout_s,
            )
    except TimeoutError:
        handle = client.get_workflow_handle(workflow_id)
        task_failures = [
            event.workflow_task_failed_event_attributes.failure.message
            async for event in handle.fetch_history_events()
            if event.HasField("workflow_task_failed_event_attributes")
        ]
        await handle.terminate("test timed out")
        pytest.fail(
            f"play {play!r} hung instead of failing within {timeout_s:g}s; "
            f"workflow task failures: {task_failures[:1]}"
        )
    cause = root_cause(info.value)
    assert isinstance(cause, ApplicationError), repr(cause)
    return cause


def assert_nothing_dispatched(provider: Any) -> None:
    ledger = provider.ledger()
    assert ledger["received"] == 0, ledger
    assert ledger["charged"] == 0


async def test_missing_csv_file(client, provider, worker, task_queue, tmp_path) -> None:
    missing = tmp_path / "no-such.csv"
    async with worker():
        cause = await fails_with(client, task_queue, "t_tool_column", {"csv_path": str(missing)})
    assert cause.type == "InvalidPlayInput"
    assert cause.message == f"CSV file {missing} does not exist"
    assert_nothing_dispatched(provider)


async def test_missing_csv_path_field(client, provider, worker, task_queue) -> None:
    async with worker():
        cause = await fails_with(
            client,
            task_queue,
            "enrich_leads",
            {"mode": "upsert"},
            timeout_s=INVALID_INPUT_TIMEOUT_S,
        )
    assert cause.type == "InvalidPlayInput"
    assert "invalid input for play 'enrich_leads'" in cause.message
    assert "csv_path: Field required" in cause.message
    assert_nothing_dispatched(provider)


async def test_wrong_type_and_bad_enum_in_play_input(client, provider, worker, task_queue) -> None:
    async with worker():
        cause = await fails_with(
            client,
            task_queue,
            "t_tool_column",
            {"csv_path": 123, "mode": "sometimes"},
            timeout_s=INVALID_INPUT_TIMEOUT_S,
        )
    assert cause.type == "InvalidPlayInput"
    assert "invalid input for play 't_tool_column'" in cause.message
    assert "csv_path: Input should be a valid string" in cause.message
    assert "mode: Input should be 'upsert' or 'net_new'" in cause.message
    assert_nothing_dispatched(provider)


async def test_empty_csv(client, provider, worker, task_queue, tmp_path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("")
    async with worker():
        cause = await fails_with(client, task_queue, "t_tool_column", {"csv_path": str(path)})
    assert cause.type == "InvalidPlayInput"
    assert f"CSV file {path} is empty" in cause.message
    assert_nothing_dispatched(provider)


async def test_header_only_csv(client, provider, worker, task_queue, tmp_path) -> None:
    path = write_csv(tmp_path / "header.csv", [])
    async with worker():
        cause = await fails_with(client, task_queue, "t_tool_column", {"csv_path": str(path)})
    assert cause.type == "InvalidPlayInput"
    assert "has a header but no data rows" in cause.message
    assert_nothing_dispatched(provider)


async def test_csv_missing_a_required_column(
    client, provider, worker, task_queue, tmp_path
) -> None:
    path = write_csv(
        tmp_path / "no-domain.csv",
        [row[:3] for row in (lead(1), lead(2))],
        columns=["lead_id", "first_name", "last_name"],
    )
    async with worker():
        cause = await fails_with(client, task_queue, "enrich_leads", {"csv_path": str(path)})
    assert cause.type == "InvalidPlayInput"
    assert "missing required column(s) ['company_domain']" in cause.message
    assert str(path) in cause.message
    assert_nothing_dispatched(provider)


async def test_ragged_rows_name_the_line(client, provider, worker, task_queue, tmp_path) -> None:
    path = tmp_path / "ragged.csv"
    path.write_text(
        "lead_id,first_name,last_name,company_domain\n"
        "T1,Ada,Lovelace,a.example\n"
        "T2,Alan,Turing\n"
        "T3,Grace,Hopper,c.example\n"
    )
    async with worker():
        cause = await fails_with(client, task_queue, "t_tool_column", {"csv_path": str(path)})
    assert cause.type == "InvalidPlayInput"
    assert f"{path}: line 3: 3 field(s) but the header has 4" in cause.message
    assert_nothing_dispatched(provider)


async def test_declared_unknown_tool_is_rejected_before_the_run(
    client, provider, worker, task_queue, tmp_path
) -> None:
    path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(3)])
    async with worker():
        cause = await fails_with(
            client,
            task_queue,
            "t_tool_column",
            {"csv_path": str(path), "column_tool": "declared_unknown"},
        )
    assert cause.type == "UnknownTool"
    assert cause.message == (
        f"unknown tool {DECLARED_UNKNOWN_TOOL!r}; the catalog declares: {KNOWN_TOOLS}"
    )
    assert_nothing_dispatched(provider)


async def test_undeclared_unknown_tool_fails_the_play_at_run_time(
    client, provider, worker, task_queue, tmp_path
) -> None:
    path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(5)])
    async with worker():
        cause = await fails_with(
            client,
            task_queue,
            "t_tool_column",
            # isolate: an unknown tool is about the play, not a row, so it still fails.
            {"csv_path": str(path), "column_tool": "undeclared_unknown", "on_row_error": "isolate"},
        )
    assert cause.type == "UnknownTool"
    assert cause.message == f"unknown tool {UNDECLARED_TOOL!r}; the catalog declares: {KNOWN_TOOLS}"
    assert_nothing_dispatched(provider)


async def test_empty_key_value_in_a_row(client, provider, worker, task_queue, tmp_path) -> None:
    rows = [lead(1), ["", "Ada", "Lovelace", "a.example"], lead(3)]
    path = write_csv(tmp_path / "leads.csv", rows)
    async with worker():
        cause = await fails_with(client, task_queue, "t_tool_column", {"csv_path": str(path)})
    assert cause.type == "InvalidPlayInput"
    assert "row 2 has an empty key field 'lead_id'" in cause.message
    assert_nothing_dispatched(provider)


async def test_key_field_that_is_not_a_column(
    client, provider, worker, task_queue, tmp_path
) -> None:
    path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(3)])
    async with worker():
        cause = await fails_with(
            client, task_queue, "t_tool_column", {"csv_path": str(path), "key": "email"}
        )
    assert cause.type == "InvalidPlayInput"
    assert "row key field(s) ['email'] are not columns" in cause.message
    assert_nothing_dispatched(provider)


async def test_bad_input_does_not_lose_stored_rows(
    client, provider, worker, task_queue, tmp_path: Path
) -> None:
    """A failing run after a good one leaves the good one's rows (and receipts) intact."""
    good = write_csv(tmp_path / "good.csv", [lead(n) for n in range(4)])
    bad = write_csv(tmp_path / "bad.csv", [lead(10), ["", "X", "Y", "z.example"]])
    async with worker():
        first = await run(client, "t_tool_column", {"csv_path": str(good)}, task_queue=task_queue)
        assert first.datasets[0].stats.rows_ok == 4
        await fails_with(client, task_queue, "t_tool_column", {"csv_path": str(bad)})
        again = await run(client, "t_tool_column", {"csv_path": str(good)}, task_queue=task_queue)
    assert again.datasets[0].stats.rows_ok == 4
    assert again.stats.calls_made == 0  # the receipts of the first run still answer
    assert provider.ledger()["charged"] == 4


async def test_missing_api_key_fails_before_dispatch(
    client, provider, worker, task_queue, tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("ACME_API_KEY")
    path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(3)])
    async with worker():
        cause = await fails_with(client, task_queue, "t_tool_column", {"csv_path": str(path)})
    assert cause.type == "MissingApiKey"
    assert "provider 'acme' needs an API key in $ACME_API_KEY" in cause.message
    assert_nothing_dispatched(provider)
