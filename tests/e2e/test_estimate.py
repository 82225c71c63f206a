"""``playline estimate`` end to end: the demo play estimated on a real worker.

Real Temporal dev server, an in-process worker, real SQLite stores and the real local
provider server, whose ledger is the judge: an estimate sends it nothing, its worst
case bounds what the run that follows is charged, and right after a completed run it
finds every call answered by a receipt.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from playline import Estimate, estimate_play
from playline import search_attributes as sa
from playline.cli.estimate import credits_text
from playline.contract import RunOptions
from playline.package_data import DEMO_CATALOG
from tests import plays_fallback  # noqa: F401  (registers the t_fallback play)
from tests.conftest import LEADS_CSV, new_id
from tests.e2e.test_cli import playline
from tests.pg import pg_schema
from tests.plays import lead, run, write_csv

PLAY = "enrich_leads"


def _line(estimate: Estimate, column: str, tool: str) -> Any:
    (found,) = [x for x in estimate.lines if x.column == column and x.tool == tool]
    return found


async def _estimate(client: Any, task_queue: str, csv_path: str) -> Estimate:
    return await estimate_play(client, PLAY, {"csv_path": csv_path}, task_queue=task_queue)


async def test_an_estimate_on_a_fresh_store_bounds_the_run_and_sends_nothing(
    client, provider, worker, task_queue
) -> None:
    async with worker():
        estimate = await _estimate(client, task_queue, str(LEADS_CSV))
        assert provider.ledger()["received"] == 0  # not one request during the estimate
        result = await run(client, PLAY, {"csv_path": str(LEADS_CSV)}, task_queue=task_queue)
    ledger = provider.ledger()

    assert estimate.rows == 236 and estimate.rows_failed == 0
    assert estimate.total.cached == 0
    # One company call per distinct domain (the industry column shares it), one email
    # call per lead; the title needs the unpaid email: a dependent call, input unknown.
    assert _line(estimate, "company_name", "company_lookup").to_pay == 40
    assert _line(estimate, "work_email", "email_finder").to_pay == 236
    title = _line(estimate, "title", "person_enrich")
    assert (title.to_pay, title.unknown_input) == (0, 236)
    # The waterfall: both steps may run for every lead, and a validation after each.
    assert _line(estimate, "verified_email", "mailfox_email").to_pay == 236
    assert _line(estimate, "verified_email", "prospectr_email").to_pay == 236
    assert _line(estimate, "verified_email", "verifly_verify").unknown_input == 472
    assert all(x.basis == "worst case" for x in estimate.lines)  # no receipts yet
    assert estimate.total.worst_credits == pytest.approx(
        40 * 0.5 + 236 * 1 + 236 * 2 + 236 * 1 + 236 * 2 + 472 * 0.5
    )
    assert estimate.total.expected_credits == pytest.approx(estimate.total.worst_credits)
    # What the run was charged stays within the worst case, provider by provider.
    assert ledger["credits"] > 0
    assert estimate.total.worst_credits >= ledger["credits"]
    for name, billed in ledger["credits_by_provider"].items():
        assert estimate.by_provider[name].worst_credits >= billed - 1e-9, name
    assert result.stats.credits == pytest.approx(ledger["credits"])


async def test_right_after_a_run_an_estimate_finds_every_call_in_receipts(
    client, provider, worker, task_queue
) -> None:
    async with worker():
        result = await run(client, PLAY, {"csv_path": str(LEADS_CSV)}, task_queue=task_queue)
        received = provider.ledger()["received"]
        estimate = await _estimate(client, task_queue, str(LEADS_CSV))
    assert provider.ledger()["received"] == received
    assert estimate.total.to_pay == 0 and estimate.total.unknown_input == 0
    assert estimate.total.worst_credits == 0 and estimate.total.expected_credits == 0
    # Each call the run paid for is one receipt, and the estimate meets each once.
    assert estimate.total.cached == result.stats.calls_made
    assert estimate.total.calls == estimate.total.cached


async def test_expected_credits_come_from_the_receipts_of_other_leads(
    client, provider, worker, task_queue, tmp_path
) -> None:
    """Receipts of one lead set give hit rates and prices for another's estimate."""
    known = write_csv(tmp_path / "known.csv", [lead(i) for i in range(60)])
    fresh = write_csv(tmp_path / "fresh.csv", [lead(i) for i in range(100, 160)])
    async with worker():
        await run(client, PLAY, {"csv_path": str(known)}, task_queue=task_queue)
        estimate = await _estimate(client, task_queue, str(fresh))
        before = provider.ledger()["credits"]
        await run(client, PLAY, {"csv_path": str(fresh)}, task_queue=task_queue)
    actual = provider.ledger()["credits"] - before
    mailfox = _line(estimate, "verified_email", "mailfox_email")
    prospectr = _line(estimate, "verified_email", "prospectr_email")
    assert mailfox.basis == "receipts" and mailfox.to_pay == 60
    # mailfox is always asked; prospectr only when mailfox found no valid email.
    assert mailfox.expected_credits < mailfox.worst_credits
    assert prospectr.expected_credits < prospectr.worst_credits
    assert estimate.total.expected_credits < estimate.total.worst_credits
    assert actual <= estimate.total.worst_credits
    assert estimate.total.expected_credits == pytest.approx(actual, rel=0.5)


async def test_estimate_command_prints_the_table_and_confirm_over_refuses_a_large_run(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(8)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        shown = await playline("estimate", PLAY, "--csv", str(csv_path), *common, home=home)
        as_json = await playline(
            "estimate", PLAY, "--csv", str(csv_path), "--json", *common, home=home
        )
        refused = await playline(
            "run", PLAY, "--csv", str(csv_path), "--confirm-over", "1", *common, home=home
        )
        assert provider.ledger()["received"] == 0
        ran = await playline(
            "run",
            PLAY,
            "--csv",
            str(csv_path),
            "--confirm-over",
            "1",
            "--yes",
            "--id",
            new_id("confirmed"),
            *common,
            home=home,
        )
    assert shown.returncode == 0, shown.stderr
    for heading in ("column", "tool", "provider", "free", "to pay", "unknown", "worst", "basis"):
        assert heading in shown.stdout.lower(), shown.stdout
    assert "company_lookup" in shown.stdout and "verified_email" in shown.stdout
    assert "dependent calls with unknown input are counted in the worst case" in shown.stdout
    document = Estimate.model_validate_json(as_json.stdout)
    assert document.rows == 8 and document.total.worst_credits > 1
    # The demo catalog states what a credit costs: the worst case and expected in money.
    assert set(document.prices) == set(document.by_provider), document.prices
    worst_money = sum(
        document.by_provider[p].worst_credits * price["credit_price"]
        for p, price in document.prices.items()
    )
    assert f"in money: worst case ≈ {worst_money:,.2f} USD, expected ≈ " in shown.stdout

    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = [x for x in (refused.stdout + refused.stderr).splitlines() if x.startswith("estimate:")]
    worst = credits_text(document.total.worst_credits)
    expected = credits_text(document.total.expected_credits)
    assert said == [
        f"estimate: worst case {worst} credits (expected {expected}) is over "
        "--confirm-over 1; add --yes to run anyway"
    ]
    assert refused.stdout == ""

    assert ran.returncode == 0, ran.stderr
    assert provider.ledger()["credits"] > 0


async def test_an_estimate_of_a_fixture_run_is_keyed_like_one(
    client, provider, worker, task_queue
) -> None:
    """Fixture receipts answer a fixture estimate (the same auth scope), not a live one,
    and a fixture run costs nothing."""
    from playline import demo

    options = RunOptions(integration_mode="fixture", fixtures=[str(demo.FIXTURES)])
    leads = {"csv_path": str(LEADS_CSV)}
    async with worker():
        before = await estimate_play(client, PLAY, leads, task_queue=task_queue, options=options)
        await run(client, PLAY, leads, task_queue=task_queue, options=options)
        fixture = await estimate_play(client, PLAY, leads, task_queue=task_queue, options=options)
        live = await _estimate(client, task_queue, str(LEADS_CSV))
    # A fixture run replays recorded answers: its calls are counted, at no credit.
    assert before.total.to_pay > 0 and before.total.worst_credits == 0
    assert fixture.total.to_pay == 0 and fixture.total.cached > 0
    assert live.total.cached == 0 and live.total.worst_credits > 0
    assert provider.ledger()["received"] == 0


@pytest.mark.postgres
async def test_on_the_postgres_store_receipts_price_and_answer_the_estimate(
    client, provider, worker, task_queue, tmp_path
) -> None:
    known = write_csv(tmp_path / "known.csv", [lead(i) for i in range(30)])
    fresh = write_csv(tmp_path / "fresh.csv", [lead(i) for i in range(200, 230)])
    async with pg_schema() as url, worker(store_url=url, home=tmp_path / "worker-home"):
        await run(client, PLAY, {"csv_path": str(known)}, task_queue=task_queue)
        received = provider.ledger()["received"]
        priced = await _estimate(client, task_queue, str(fresh))
        again = await _estimate(client, task_queue, str(known))
        assert provider.ledger()["received"] == received
    mailfox = _line(priced, "verified_email", "mailfox_email")
    assert mailfox.basis == "receipts" and mailfox.expected_credits < mailfox.worst_credits
    assert again.total.to_pay == again.total.unknown_input == 0 and again.total.cached > 0


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_receipt_sample_is_a_tools_latest_completed_answers(backend, tmp_path) -> None:
    """The read an estimate prices calls from, on both stores: newest first, completed
    receipts of the one tool only, at most ``limit``."""
    from contextlib import AsyncExitStack

    from playline.config import Settings
    from playline.stores.backends import open_stores
    from playline.stores.receipts import ClaimRequest

    async with AsyncExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / 'store'}"
        else:
            url = await stack.enter_async_context(pg_schema())
        now = [1000.0]
        stores = await open_stores(Settings(store_url=url), create=True, clock=lambda: now[0])
        stack.push_async_callback(stores.close)
        receipts = stores.receipts
        keys = [f"finder:{i}" for i in range(5)] + ["other:0", "finder:open"]
        tools = ["finder"] * 5 + ["other", "finder"]
        await receipts.claim(
            [ClaimRequest(key=k, tool_id=t) for k, t in zip(keys, tools, strict=True)],
            owner="o",
            lease_id="l",
            ttl_s=60,
        )
        for i, key in enumerate(keys[:6]):
            now[0] = 1000.0 + i
            await receipts.complete(key, lease_id="l", result={"n": i}, credits=float(i))
        assert await receipts.sample("finder", 3) == [
            ({"n": 4}, 4.0),
            ({"n": 3}, 3.0),
            ({"n": 2}, 2.0),
        ]
        assert len(await receipts.sample("finder")) == 5
        assert await receipts.sample("nothing") == []


async def test_a_scalar_waterfall_is_counted_under_the_play_and_answered_by_receipts(
    client, provider, worker, task_queue
) -> None:
    person = {"first_name": "Ada", "last_name": "Lovelace", "domain": "acme.example"}
    async with worker():
        before = await estimate_play(client, "t_scalar_waterfall", person, task_queue=task_queue)
        ran = await run(client, "t_scalar_waterfall", person, task_queue=task_queue)
        received = provider.ledger()["received"]
        after = await estimate_play(client, "t_scalar_waterfall", person, task_queue=task_queue)
        assert provider.ledger()["received"] == received
    assert {x.column for x in before.lines} == {"(play)"}
    assert _line(before, "(play)", "mailfox_email").to_pay == 1
    assert _line(before, "(play)", "prospectr_email").to_pay == 1
    assert before.total.worst_credits == pytest.approx(1 + 2 + 2 * 0.5)
    assert after.total.to_pay == after.total.unknown_input == 0
    # Every request the run sent (no faults: one per call) is now a receipt the estimate reuses.
    assert after.total.cached == received > 0
    assert ran.output["found"]["value"]


async def test_a_play_whose_code_needs_a_skipped_step_still_ends_its_estimate(
    client, provider, worker, task_queue
) -> None:
    # t_scalar builds its output from a ctx.step result, which an estimate skips (None):
    # the output model refuses it, and the estimate ends with what it counted.
    async with worker():
        found = await asyncio.wait_for(
            estimate_play(client, "t_scalar", {"domain": "acme.example"}, task_queue=task_queue),
            60,
        )
    assert found.total.to_pay == 1 and found.total.worst_credits > 0
    assert provider.ledger()["received"] == 0


async def test_an_estimate_counts_a_resolvers_fallbacks_and_its_worst_case_covers_the_bill(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    """``if not found.get("email"): <dearer tool>`` and ``== "valid"`` branches: the
    estimate takes one way, the run pays for both; the worst case counts them all."""
    rows = 40
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(rows)])
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        shown = await playline(
            "estimate", "t_fallback", "--csv", str(csv_path), "--json", *common, home=home
        )
        assert shown.returncode == 0, shown.stderr
        assert provider.ledger()["received"] == 0  # an estimate sends nothing
        result = await run(client, "t_fallback", {"csv_path": str(csv_path)}, task_queue=task_queue)
    ledger = provider.ledger()
    estimate = Estimate.model_validate_json(shown.stdout)

    assert estimate.rows == rows and estimate.rows_failed == 0
    assert _line(estimate, "email", "mailfox_email").to_pay == rows
    # The fallback and the call behind the "valid" branch: dependent calls in every row.
    assert _line(estimate, "email", "prospectr_email").unknown_input == rows
    assert _line(estimate, "title", "verifly_verify").unknown_input == rows
    assert _line(estimate, "title", "person_enrich").unknown_input == rows
    assert estimate.total.worst_credits == pytest.approx(rows * (1 + 2 + 0.5 + 2))

    # The run paid on both sides of each branch, and the worst case covers its bill,
    # provider by provider (person_enrich is acme's).
    billed = ledger["credits_by_provider"]
    assert billed.get("prospectr", 0) > 0 and billed.get("acme", 0) > 0, billed
    assert result.stats.credits == pytest.approx(ledger["credits"])
    assert estimate.total.worst_credits >= ledger["credits"]
    for name, credits in billed.items():
        assert estimate.by_provider[name].worst_credits >= credits - 1e-9, name


async def test_an_estimate_needs_no_api_key_and_a_run_still_does(
    client, provider, worker, task_queue, tmp_path
) -> None:
    """An estimate sends nothing, so a worker without the providers' keys prices the
    play; a run on it is still refused, naming the missing variable."""
    keyless = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(5)])
    async with worker(environ=keyless):
        estimate = await estimate_play(
            client, "t_tool_column", {"csv_path": str(csv_path)}, task_queue=task_queue
        )
        assert estimate.rows == 5 and estimate.total.to_pay == 5
        assert estimate.total.worst_credits > 0
        with pytest.raises(WorkflowFailureError) as refused:
            await run(client, "t_tool_column", {"csv_path": str(csv_path)}, task_queue=task_queue)
    assert "ACME_API_KEY" in str(refused.value.cause), refused.value.cause
    assert provider.ledger()["received"] == 0


async def test_estimates_are_marked_and_left_out_of_runs_list_unless_asked_for(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(3)])
    async with worker():
        estimate = await estimate_play(
            client, "t_tool_column", {"csv_path": str(csv_path)}, task_queue=task_queue
        )
        result = await run(
            client, "t_tool_column", {"csv_path": str(csv_path)}, task_queue=task_queue
        )
    assert estimate.workflow_id is not None and result.stats.rows_ok == 3
    described = await client.get_workflow_handle(estimate.workflow_id).describe()
    assert described.typed_search_attributes.get(sa.KIND) == "estimate"
    common = ("--address", temporal_address, "--play", "t_tool_column", "--json")

    async def listed(*flags: str) -> set[str]:
        shown = await playline("runs", "list", *common, *flags, home=home)
        assert shown.returncode == 0, shown.stderr
        return {r["workflow_id"] for r in json.loads(shown.stdout)["runs"]}

    deadline = asyncio.get_running_loop().time() + 30
    while estimate.workflow_id not in await listed("--estimates"):  # visibility lags
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.5)
    plain = await listed()
    assert estimate.workflow_id not in plain
    assert plain  # the run itself is listed


async def test_a_stated_hit_rate_prices_a_tool_until_receipts_exist(
    client, provider, worker, task_queue, tmp_path
) -> None:
    """Without receipts, a tool whose catalog states its typical hit rate is expected at
    that rate (mailfox bills only what it finds); without a rate, expected is the
    worst case."""
    text = DEMO_CATALOG.read_text().replace(
        'path = "/mailfox/v1/email/find"',
        'path = "/mailfox/v1/email/find"\ntypical_hit_rate = 0.4',
    )
    assert "typical_hit_rate = 0.4" in text
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(text)
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(10)])
    async with worker(catalog_path=str(catalog)):
        estimate = await _estimate(client, task_queue, str(csv_path))
    assert provider.ledger()["received"] == 0
    mailfox = _line(estimate, "verified_email", "mailfox_email")
    assert mailfox.basis == "stated hit rate"
    assert mailfox.worst_credits == pytest.approx(10 * 1)
    assert mailfox.expected_credits == pytest.approx(10 * 1 * 0.4)
    prospectr = _line(estimate, "verified_email", "prospectr_email")
    assert prospectr.basis == "worst case"  # no rate stated: its price is the worst case
    assert estimate.total.expected_credits < estimate.total.worst_credits
