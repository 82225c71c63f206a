"""End to end: plays on a real Temporal dev server against the real local provider server.

Every test reads what happened from the outside: the provider's ledger (what was
received and charged), the rows exported from the sheet store, the play's result
and, for failures, the root cause's error type and message.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from playline.contract import PlayState
from playline.errors import root_cause
from playline.provider_server.fake_data import find_email, lookup_company
from tests.conftest import LEADS_CSV, new_id
from tests.plays import BOOM, export_rows, lead, read_csv_rows, run, write_csv

EMAIL_PATH = "/acme/v1/email/find"
COMPANY_PATH = "/firmo/v1/company/lookup"
COMPANY_BULK_PATH = "/firmo/v1/company/lookup/bulk"


def email_of(row: list[str]) -> str:
    _, first, last, domain = row
    return find_email(first, last, domain)["email"]


def company_charges(ledger: dict) -> int:
    by_path = ledger["charged_by_path"]
    return by_path.get(COMPANY_PATH, 0) + by_path.get(COMPANY_BULK_PATH, 0)


async def test_example_play_completes_and_pays_once_per_distinct_input(
    client, provider, worker, task_queue
) -> None:
    workflow_id = new_id("enrich")
    async with worker():
        result = await run(
            client,
            "enrich_leads",
            {"csv_path": str(LEADS_CSV)},
            task_queue=task_queue,
            workflow_id=workflow_id,
        )
        state = await client.get_workflow_handle(workflow_id).query("state", result_type=PlayState)

    ledger = provider.ledger()
    (dataset,) = result.datasets
    assert dataset.total == 240
    assert dataset.admitted == 236
    assert dataset.duplicates == 4
    assert dataset.stats.rows_ok == 236
    assert dataset.stats.rows_failed == 0
    assert result.output["rows"] == 236
    assert result.output["rows_failed"] == 0

    preview = result.output["preview"]
    assert len(preview) == 5
    for row in preview:
        assert row["company_name"] == lookup_company(row["company_domain"])["name"]
        assert row["work_email"] and row["work_email"].endswith("@" + row["company_domain"])
        assert row["title"]
        assert "_error" not in row

    assert ledger["double_charged"] == 0
    assert ledger["double_charged_items"] == 0
    assert ledger["charged"] == result.stats.calls_made
    # company_name and industry ask for the same input: one call per distinct domain.
    assert company_charges(ledger) == 40
    single_calls = ledger["charged"] - ledger["charged_by_provider"].get("firmo", 0)
    assert ledger["items_charged"] - single_calls == 40  # company items, bulk or single
    # The verified_email waterfall asked mailfox once per lead, and every billing rule
    # (per request, per hit, refund on miss, a verifier) adds up to the provider's bill.
    assert ledger["charged_by_path"]["/mailfox/v1/email/find"] == 236
    assert result.stats.credits == pytest.approx(ledger["credits"])
    assert ledger["charged_by_path"][EMAIL_PATH] == 236
    assert ledger["charged_by_path"]["/acme/v1/person/enrich"] == 236
    assert ledger["rate_limited"] == 0

    assert state.phase == "completed"
    assert state.rows_total == state.rows_done == 236
    assert state.rows_failed == 0
    assert state.calls_made == result.stats.calls_made
    assert "loaded 240 rows into leads@" in state.log[0]
    assert "dataset enriched_leads: 236 of 240 rows admitted, 4 duplicate keys" in state.log


async def test_rerun_with_same_home_pays_nothing_and_exports_identical_rows(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    play_input = {"csv_path": str(LEADS_CSV)}
    async with worker():
        first = await run(client, "enrich_leads", play_input, task_queue=task_queue)
    first_csv = await export_rows(home, first.datasets[0].run_ref, tmp_path / "first.csv")
    after_first = provider.ledger()
    charged_after_first = after_first["charged"]
    assert first.stats.calls_made == charged_after_first > 0

    # A new worker process-equivalent over the same SQLite files.
    async with worker():
        second = await run(client, "enrich_leads", play_input, task_queue=task_queue)
    second_csv = await export_rows(home, second.datasets[0].run_ref, tmp_path / "second.csv")

    ledger = provider.ledger()
    assert second.stats.calls_made == 0
    assert second.stats.credits == 0
    assert second.stats.calls_cached > 0
    assert second.datasets[0].stats.rows_ok == 236
    assert second.datasets[0].run_ref != first.datasets[0].run_ref
    assert ledger["charged"] == charged_after_first
    assert ledger["received"] == after_first["received"]
    assert ledger["double_charged"] == 0
    assert second_csv == first_csv
    assert len(read_csv_rows(tmp_path / "second.csv")) == 236


async def test_net_new_admits_only_unseen_keys(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = [lead(n) for n in range(10)]
    more = [lead(n) for n in range(10, 15)]
    first_csv = write_csv(tmp_path / "ten.csv", rows)
    second_csv = write_csv(tmp_path / "fifteen.csv", rows + more)
    async with worker():
        first = await run(
            client,
            "t_tool_column",
            {"csv_path": str(first_csv), "mode": "net_new"},
            task_queue=task_queue,
        )
        assert first.datasets[0].admitted == 10
        assert provider.ledger()["charged"] == 10
        second = await run(
            client,
            "t_tool_column",
            {"csv_path": str(second_csv), "mode": "net_new"},
            task_queue=task_queue,
        )

    ledger = provider.ledger()
    (dataset,) = second.datasets
    assert dataset.total == 15
    assert dataset.admitted == 5
    assert dataset.seen_before == 10
    assert dataset.stats.rows_ok == 5
    assert second.output["rows"] == 5
    assert {r["lead_id"] for r in second.output["preview"]} == {r[0] for r in more}
    assert second.stats.calls_made == 5
    assert ledger["charged"] == 15
    assert ledger["charged_by_path"] == {EMAIL_PATH: 15}
    assert ledger["double_charged"] == 0


async def test_isolate_records_failing_rows_and_keeps_the_others(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    rows = [lead(n, first_name=BOOM if n in (2, 5) else None) for n in range(8)]
    path = write_csv(tmp_path / "leads.csv", rows)
    async with worker():
        result = await run(
            client,
            "t_tool_column",
            {"csv_path": str(path), "column_tool": "fail_on_boom", "on_row_error": "isolate"},
            task_queue=task_queue,
        )
    (dataset,) = result.datasets
    assert dataset.stats.rows_ok == 6
    assert dataset.stats.rows_failed == 2
    assert result.output["rows_failed"] == 2
    assert "boom: refusing lead" in (result.stats.first_error or "")

    await export_rows(home, dataset.run_ref, tmp_path / "out.csv")
    exported = {r["lead_id"]: r for r in read_csv_rows(tmp_path / "out.csv")}
    assert len(exported) == 8
    for n, row in enumerate(rows):
        out = exported[row[0]]
        if n in (2, 5):
            assert out["_error"] == f"ValueError: boom: refusing lead {row[0]}"
            assert out["value"] == ""
        else:
            assert out["_error"] == ""
            assert out["value"] == email_of(row)
    # Failing rows raised before calling the provider: only the 6 good rows were paid.
    assert provider.ledger()["charged"] == 6


async def test_fail_mode_fails_the_play_naming_the_row(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = [lead(n, first_name=BOOM if n == 3 else None) for n in range(6)]
    path = write_csv(tmp_path / "leads.csv", rows)
    async with worker():
        with pytest.raises(WorkflowFailureError) as info:
            await run(
                client,
                "t_tool_column",
                {"csv_path": str(path), "column_tool": "fail_on_boom", "on_row_error": "fail"},
                task_queue=task_queue,
            )
    cause = root_cause(info.value)
    assert isinstance(cause, ApplicationError)
    assert cause.type == "RowFailed"
    assert "row 'T0003'" in cause.message
    assert "boom: refusing lead T0003" in cause.message
    assert "'value'" in cause.message  # the failing column
    assert provider.ledger()["double_charged"] == 0


@pytest.fixture
def acme_rejects_our_key(provider) -> Iterator[None]:
    """The acme provider accepts only a key the worker does not have: every call is a 401."""
    provider.configure(api_keys={"acme": "a-key-the-worker-does-not-have"})
    try:
        yield
    finally:
        provider.configure(api_keys={})


async def test_provider_rejection_is_recorded_per_row_and_not_retried(
    client, provider, worker, task_queue, home, tmp_path, acme_rejects_our_key
) -> None:
    rows = [lead(n) for n in range(6)]
    path = write_csv(tmp_path / "leads.csv", rows)
    async with worker():
        result = await run(client, "t_tool_column", {"csv_path": str(path)}, task_queue=task_queue)

    ledger = provider.ledger()
    (dataset,) = result.datasets
    assert dataset.stats.rows_failed == 6
    assert dataset.stats.rows_ok == 0
    assert result.stats.retries == 0
    assert result.stats.calls_failed == 6
    assert result.stats.calls_made == 0
    assert ledger["received"] == 6  # one request per row: a 4xx is not retried
    assert ledger["unauthorized"] == 6
    assert ledger["charged"] == 0

    await export_rows(home, dataset.run_ref, tmp_path / "out.csv")
    for row in read_csv_rows(tmp_path / "out.csv"):
        assert row["_error"].startswith(
            "ProviderRejected: email_finder: acme rejected the request with 401"
        )
        assert "a-key-the-worker-does-not-have" not in row["_error"]
        assert "test-acme-key" not in row["_error"]
        assert row["value"] == ""


async def test_transient_5xx_are_retried_without_paying_twice(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = [lead(n) for n in range(6)]
    path = write_csv(tmp_path / "leads.csv", rows)
    provider.configure(fail_next={"5xx": 3})
    async with worker():
        result = await run(client, "t_tool_column", {"csv_path": str(path)}, task_queue=task_queue)

    ledger = provider.ledger()
    (dataset,) = result.datasets
    assert dataset.stats.rows_ok == 6
    assert dataset.stats.rows_failed == 0
    assert result.stats.retries >= 3
    assert ledger["faults_by_kind"] == {"5xx": 3}
    assert ledger["received"] == 6 + 3
    assert ledger["charged"] == 6 == result.stats.calls_made
    assert ledger["double_charged"] == 0
    assert {r["value"] for r in result.output["preview"]} == {email_of(r) for r in rows[:5]}


async def test_ctx_tool_and_step_and_receipt_hit_on_rerun(
    client, provider, worker, task_queue
) -> None:
    domain = "scalar.example"
    expected = lookup_company(domain)
    async with worker():
        first = await run(
            client, "t_scalar", {"domain": domain, "a": 20, "b": 22}, task_queue=task_queue
        )
        after_first = provider.ledger()
        second = await run(
            client, "t_scalar", {"domain": domain, "a": 1, "b": 2}, task_queue=task_queue
        )
    after_second = provider.ledger()

    assert first.output == {
        "company_name": expected["name"],
        "industry": expected["industry"],
        "step": {"sum": 42},
    }
    assert after_first["charged_by_path"] == {COMPANY_PATH: 1}
    assert after_first["received"] == 1
    # The second ctx.tool is answered by the receipt: nothing reaches the provider.
    assert second.output == {
        "company_name": expected["name"],
        "industry": expected["industry"],
        "step": {"sum": 3},
    }
    assert after_second["received"] == 1
    assert after_second["charged"] == 1


async def test_run_play_child_completes_and_its_stats_roll_up(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = [lead(n) for n in range(7)]
    path = write_csv(tmp_path / "leads.csv", rows)
    async with worker():
        result = await run(client, "t_parent", {"csv_path": str(path)}, task_queue=task_queue)

    assert result.play == "t_parent"
    assert result.output["child_play"] == "t_tool_column"
    assert result.output["child_rows"] == 7
    assert result.output["child_output"]["rows"] == 7
    assert result.output["child_output"]["rows_failed"] == 0
    assert result.output["child_calls_made"] == 7
    assert result.stats.calls_made == 7
    assert result.stats.rows_ok == 7
    assert provider.ledger()["charged"] == 7


async def test_rows_rejected_by_the_provider_succeed_on_a_rerun_once_fixed(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """A failed call is not a cached answer: the rerun calls again and clears the row errors."""
    rows = [lead(n) for n in range(5)]
    path = write_csv(tmp_path / "leads.csv", rows)
    provider.configure(api_keys={"acme": "a-key-the-worker-does-not-have"})
    try:
        async with worker():
            first = await run(
                client, "t_tool_column", {"csv_path": str(path)}, task_queue=task_queue
            )
    finally:
        provider.configure(api_keys={})
    assert first.datasets[0].stats.rows_failed == 5
    assert provider.ledger()["charged"] == 0

    async with worker():
        second = await run(client, "t_tool_column", {"csv_path": str(path)}, task_queue=task_queue)
    (dataset,) = second.datasets
    assert dataset.stats.rows_ok == 5
    assert dataset.stats.rows_failed == 0
    assert second.stats.calls_made == 5
    assert provider.ledger()["charged"] == 5
    await export_rows(home, dataset.run_ref, tmp_path / "out.csv")
    exported = read_csv_rows(tmp_path / "out.csv")
    assert "_error" not in exported[0]
    assert {r["lead_id"]: r["value"] for r in exported} == {r[0]: email_of(r) for r in rows}
