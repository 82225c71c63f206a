"""Waterfalls, billing rules and provenance end to end.

Real Temporal dev server, real worker (in process, or a process killed with SIGKILL),
real SQLite, real HTTP to the provider server, whose ledger is the judge: which calls
were made, which were charged, and what each provider billed. playline's own figures
(the cells' provenance, summed from the sheet store) must equal the ledger's exactly,
per provider, for every billing rule: per request (firmo), per hit (mailfox), refund on
miss (prospectr's finder), per field with the charge reported in a header
(prospectr's contact enrich), a verifier per request (verifly), and per bulk member.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from playline import demo
from playline.calls.provenance import SpendTally, run_spend
from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.datasets import export_run
from playline.services import Services
from tests.conftest import bulk_catalog, new_id, start_worker_process
from tests.e2e.test_cli import playline
from tests.e2e.test_crash_recovery import first_rows, wait_for
from tests.plays import read_csv_rows, run

MAILFOX = "/mailfox/v1/email/find"
PROSPECTR = "/prospectr/v1/email/find"
PROVIDERS = ("firmo", "mailfox", "prospectr", "verifly")


async def _provenance(home: Path, run_ref: str) -> tuple[list[dict[str, Any]], SpendTally]:
    """Every row's provenance, in order, and the run's spend summed from the store."""
    services = await Services.open(Settings.from_env(home=home))
    try:
        info = await services.sheet.run_info(run_ref)
        assert info is not None
        rows = [p for _, p in await services.sheet.read_provenance(run_ref, 0, info.admitted)]
        return rows, await run_spend(services.sheet, run_ref)
    finally:
        await services.close()


def _assert_credits_match_the_ledger(spend: SpendTally, ledger: dict[str, Any]) -> None:
    billed = ledger["credits_by_provider"]
    for provider in PROVIDERS:
        assert spend.by_provider.get(provider, 0.0) == pytest.approx(
            billed.get(provider, 0.0), abs=1e-9
        ), provider
    assert spend.credits == pytest.approx(ledger["credits"], abs=1e-9)


def _outcomes(row: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["tool"], s["outcome"]) for s in row["verified_email"]["steps"]]


@pytest.mark.parametrize("company", ["single", "bulk"])
async def test_a_waterfall_stops_at_the_first_accepted_step_and_credits_equal_the_ledger(
    client, provider, worker, task_queue, home, tmp_path, company
) -> None:
    csv_path = first_rows(60, tmp_path / "leads.csv")
    settings: dict[str, Any] = {}
    if company == "bulk":
        settings["catalog_path"] = str(bulk_catalog(tmp_path))
    async with worker(**settings):
        result = await run(
            client, "t_waterfall", {"csv_path": str(csv_path)}, task_queue=task_queue
        )
    ledger = provider.ledger()
    rows, spend = await _provenance(home, result.datasets[0].run_ref)
    assert len(rows) == 60 and result.stats.rows_ok == 60

    outcomes = [_outcomes(row) for row in rows]
    first_hits = sum(o == [("mailfox_email", "hit")] for o in outcomes)
    invalid_then_hit = sum(
        o == [("mailfox_email", "invalid"), ("prospectr_email", "hit")] for o in outcomes
    )
    missed_then = sum(o[0] == ("mailfox_email", "no_match") for o in outcomes)
    assert first_hits and invalid_then_hit and missed_then, outcomes
    # The ledger: mailfox was asked once per row, prospectr only for the rows mailfox
    # did not answer with a valid email: never after a hit.
    assert _received(provider, MAILFOX) == 60  # 60 distinct people
    asked_prospectr = sum(any(t == "prospectr_email" for t, _ in o) for o in outcomes)
    assert asked_prospectr == 60 - first_hits
    assert _received(provider, PROSPECTR) == asked_prospectr
    # Each cell says which provider filled it, how, and what it cost.
    for row, o in zip(rows, outcomes, strict=True):
        cell = row["verified_email"]
        assert cell.get("receipt") in ("paid", None)  # 60 distinct people: nothing shared
        if o[-1][1] == "hit":
            assert cell["tool"] == o[-1][0] and cell["miss"] is None and cell["fetched_at"]
        else:
            assert cell["tool"] is None and cell["miss"]
    assert ledger["double_charged"] == 0
    _assert_credits_match_the_ledger(spend, ledger)
    # The chunks' own tally (the current details) agrees when nothing was retried.
    assert result.stats.spend["by_provider"] == pytest.approx(spend.by_provider)
    assert result.stats.credits == pytest.approx(ledger["credits"])
    assert spend.steps["verified_email"]["mailfox_email"] == first_hits


def _received(provider, path: str) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for call in provider.calls() if call["path"] == path)


async def test_a_rerun_makes_no_provider_call_and_keeps_the_provenance_marked_reused(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    csv_path = first_rows(30, tmp_path / "leads.csv")
    async with worker():
        first = await run(client, "t_waterfall", {"csv_path": str(csv_path)}, task_queue=task_queue)
        received = provider.ledger()["received"]
        again = await run(client, "t_waterfall", {"csv_path": str(csv_path)}, task_queue=task_queue)
    assert provider.ledger()["received"] == received
    assert again.stats.calls_made == 0 and again.stats.credits == 0
    before, _ = await _provenance(home, first.datasets[0].run_ref)
    after, spend = await _provenance(home, again.datasets[0].run_ref)
    assert spend.credits == 0 and spend.by_provider == {}
    for old, new in zip(before, after, strict=True):
        assert _outcomes(new) == _outcomes(old)
        cell = new["verified_email"]
        if cell["tool"] is not None:
            assert cell["receipt"] == "reused"
            assert cell["fetched_at"] == pytest.approx(old["verified_email"]["fetched_at"])
        assert all(s["credits"] == 0 for s in cell["steps"])
        assert all(s["receipt"] == "reused" for s in cell["steps"])


async def test_with_faults_after_the_charge_playlines_credits_still_equal_the_ledger(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """Charged faults and idempotent replays: the provider de-duplicates its keys, so a
    re-sent call is answered from its store (not charged) and recorded once."""
    provider.configure(
        fault_rate_500_after_charge=0.08,
        fault_rate_drop_after_charge=0.05,
        fault_rate_5xx=0.05,
    )
    csv_path = first_rows(60, tmp_path / "leads.csv")
    options = RunOptions(chunk_size=10)
    async with worker():
        result = await run(
            client,
            "t_waterfall",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=options,
            timeout_s=120,
        )
    ledger = provider.ledger()
    assert ledger["faults"] > 0 and ledger["duplicates"] > 0, ledger
    assert ledger["double_charged"] == 0
    _, spend = await _provenance(home, result.datasets[0].run_ref)
    _assert_credits_match_the_ledger(spend, ledger)


async def test_a_sigkilled_worker_mid_waterfall_pays_no_step_twice(
    client, provider, temporal_address, task_queue, tmp_path
) -> None:
    provider.configure(latency_ms=[60, 100])
    csv_path = first_rows(60, tmp_path / "leads.csv")
    home = tmp_path / "home"
    log = tmp_path / "worker.log"
    options = RunOptions(chunk_size=5, heartbeat_timeout_s=3, max_chunks_in_flight=4)
    first = start_worker_process(temporal_address, task_queue, home, log)
    handle = await client.start_workflow(
        "t_waterfall",
        args=[{"csv_path": str(csv_path)}, options],
        id=new_id("wf-crash"),
        task_queue=task_queue,
        result_type=PlayRunResult,
    )
    try:
        await wait_for(
            lambda: provider.ledger()["charged_by_path"].get(PROSPECTR, 0) >= 5, 60, "waterfalls"
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert provider.ledger()["received"] < 200, "the play finished before the kill"
        second = start_worker_process(temporal_address, task_queue, home, log)
        try:
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            second.terminate()
            second.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    ledger = provider.ledger()
    assert result.stats.rows_ok == 60
    assert ledger["double_charged"] == 0
    _, spend = await _provenance(home, result.datasets[0].run_ref)
    # Answers paid for by the killed worker read as paid by their rows on the retry.
    _assert_credits_match_the_ledger(spend, ledger)


async def test_the_provenance_export_names_each_cells_source_cost_and_miss(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    csv_path = first_rows(20, tmp_path / "leads.csv")
    async with worker():
        result = await run(
            client, "t_waterfall", {"csv_path": str(csv_path)}, task_queue=task_queue
        )
    run_ref = result.datasets[0].run_ref
    plain, with_sources = tmp_path / "plain.csv", tmp_path / "sources.csv"
    services = await Services.open(Settings.from_env(home=home))
    try:
        await export_run(services.sheet, run_ref, str(plain))
        await export_run(services.sheet, run_ref, str(with_sources), provenance=True)
    finally:
        await services.close()
    assert "__source" not in plain.read_text()
    rows = read_csv_rows(with_sources)
    for row in rows:
        if row["verified_email"]:
            assert row["verified_email__source"].endswith(", paid")
            assert (
                row["verified_email__source"].split(" via ")[1].startswith(("mailfox", "prospectr"))
            )
            assert row["verified_email__fetched_at"].endswith("Z")
            assert row["verified_email__miss"] == ""
        else:
            assert row["verified_email__source"] == ""
            assert (
                "no_match" in row["verified_email__miss"]
                or "invalid" in (row["verified_email__miss"])
            )
        assert float(row["verified_email__credits"]) >= 0
    total = sum(
        float(row[f"{column}__credits"])
        for row in rows
        for column in ("company", "verified_email", "mobile")
    )
    assert total == pytest.approx(provider.ledger()["credits"])


async def test_ctx_waterfall_runs_a_named_waterfall_once_for_the_play(
    client, provider, worker, task_queue
) -> None:
    provider.configure(hit_rates={"mailfox": 0.0, "prospectr": 1.0})
    async with worker():
        result = await run(
            client,
            "t_scalar_waterfall",
            {"first_name": "Ada", "last_name": "Byron", "domain": "analytical.io"},
            task_queue=task_queue,
        )
    found = result.output["found"]
    assert found["step"] == "prospectr_email" and found["value"]
    assert [s["outcome"] for s in found["steps"]] == ["no_match", "hit"]
    ledger = provider.ledger()
    assert found["credits"] == pytest.approx(ledger["credits"])


def _mailfox_quota(tmp_path: Path, per_day: int) -> Path:
    """The demo catalog with mailfox allowed ``per_day`` calls a day."""
    text = demo.CATALOG.read_text()
    head = "[providers.mailfox]\n"
    start = text.index(head)
    pacing = text.index("pacing = ", start)
    end = text.index("\n", pacing)
    text = text[:pacing] + f"pacing = {{ rps = 100, burst = 10, per_day = {per_day} }}" + text[end:]
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return path


async def test_a_provider_whose_quota_is_spent_is_skipped_as_unavailable(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """mailfox may take 5 calls a day: the rows after those skip it (``unavailable``,
    nothing sent) and prospectr answers them; nothing waits for tomorrow."""
    csv_path = first_rows(20, tmp_path / "leads.csv")
    options = RunOptions(chunk_size=20, row_concurrency=1)
    async with worker(catalog_path=str(_mailfox_quota(tmp_path, 5))):
        result = await run(
            client,
            "t_waterfall",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=options,
        )
    assert result.stats.rows_ok == 20
    assert _received(provider, MAILFOX) == 5
    rows, spend = await _provenance(home, result.datasets[0].run_ref)
    skipped = [row for row in rows if _outcomes(row)[0] == ("mailfox_email", "unavailable")]
    assert len(skipped) == 15
    for row in skipped:
        first = row["verified_email"]["steps"][0]
        assert first["credits"] == 0 and "mailfox unavailable until" in first["reason"]
        assert _outcomes(row)[1][0] == "prospectr_email"
    _assert_credits_match_the_ledger(spend, provider.ledger())


async def test_the_cli_shows_the_spend_and_exports_the_provenance(
    client, provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    """``playline run --out --provenance`` and ``runs get``, as a user runs them: the
    credits by provider equal the ledger's, and each waterfall step's hit rate."""
    csv_path = first_rows(30, tmp_path / "leads.csv")
    out = tmp_path / "out.jsonl"
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        ran = await playline(
            "run",
            "t_waterfall",
            "--csv",
            str(csv_path),
            "--out",
            str(out),
            "--provenance",
            "--id",
            "cli-waterfall-1",
            *common,
            home=home,
        )
        assert ran.returncode == 0, ran.stderr
        got = await playline("runs", "get", "cli-waterfall-1", *common, home=home)
        as_json = await playline("runs", "get", "cli-waterfall-1", "--json", *common, home=home)
    assert got.returncode == 0, got.stderr
    billed = provider.ledger()["credits_by_provider"]
    expected = "credits by provider: " + ", ".join(
        f"{p} {billed[p]:g}" for p in sorted(billed) if billed[p]
    )
    for output in (ran.stdout, got.stdout):
        assert expected in output
        assert "verified_email: " in output and "credits/row" in output
        assert "verified_email by step: mailfox_email hit " in output
    spend = json.loads(as_json.stdout)["spend"]
    assert spend["by_provider"] == pytest.approx({p: c for p, c in billed.items() if c})
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 30
    cells = [row["_provenance"]["verified_email"] for row in rows]
    assert all(len(cell["steps"]) >= 1 for cell in cells)
    assert sum(row["_provenance"]["company"]["credits"] for row in rows) == billed["firmo"]
