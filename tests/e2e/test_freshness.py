"""Freshness rules end to end: a re-run pays only for the cells past their freshness.

Real Temporal dev server, an in-process worker, real SQLite stores and the real
provider server, whose ledger is the judge: mailfox bills per hit and misses some
leads, verifly gives every address a verdict. A column rule keeps fresh cells without
a call; a catalog rule on the tool refuses receipts older than the answer allows; a
miss (``no_match``) or a poor verdict is retried while the hits stay.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from playline import estimate_play
from playline.demo import CATALOG
from tests import plays_freshness  # noqa: F401  (registers the t_fresh play)
from tests.plays import export_rows, lead, read_csv_rows, run, write_csv

PLAY = "t_fresh"
#: A rule's short duration: long enough for a run to finish inside it on a slow machine
#: is not needed (the test sleeps past it), short enough to keep the test quick.
SHORT_S = 2.0


def _sent(provider: Any, name: str) -> int:
    return int(provider.ledger()["received_by_provider"].get(name, 0))


def _credits(provider: Any, name: str) -> float:
    return float(provider.ledger()["credits_by_provider"].get(name, 0.0))


async def _past(seconds: float, since: float) -> None:
    """Sleep until ``seconds`` have passed since ``since`` (monotonic)."""
    await asyncio.sleep(max(0.0, since + seconds + 0.3 - time.monotonic()))


async def _rows(home: Path, run_ref: str, tmp_path: Path) -> dict[str, dict[str, str]]:
    path = tmp_path / f"{run_ref.replace(':', '_')}.csv"
    await export_rows(home, run_ref, path)
    return {row["lead_id"]: row for row in read_csv_rows(path)}


async def test_a_column_rule_keeps_fresh_cells_and_retries_misses_before_hits(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    leads = [lead(i) for i in range(30)]
    csv_path = write_csv(tmp_path / "leads.csv", leads)
    given = {"csv_path": str(csv_path), "email_found_s": 3600, "email_no_match_s": SHORT_S}
    # The rule is read when a run plans a cell: runs that must find nothing due use a
    # long one, so a slow machine cannot age a cell between them.
    patient = {**given, "email_no_match_s": 3600}
    async with worker():
        first = await run(client, PLAY, patient, task_queue=task_queue)
        done_at = time.monotonic()
        assert _sent(provider, "mailfox") == 30
        hits = round(_credits(provider, "mailfox"))  # per hit: one credit a found email
        misses = 30 - hits
        assert 0 < misses < 30  # the provider's hit rate leaves both kinds
        assert (first.stats.cells_due, first.stats.cells_fresh) == (60, 0)

        again = await run(client, PLAY, patient, task_queue=task_queue)
        assert _sent(provider, "mailfox") == 30  # nothing was due: not one call
        assert (again.stats.cells_fresh, again.stats.cells_due) == (30, 30)  # seen: always
        assert again.stats.credits == 0

        await _past(SHORT_S, done_at)
        estimate = await estimate_play(client, PLAY, given, task_queue=task_queue)
        mailfox = [x for x in estimate.lines if x.tool == "mailfox_email"]
        assert sum(x.to_pay for x in mailfox) == misses  # the misses are due, the hits not
        assert _sent(provider, "mailfox") == 30  # an estimate sends nothing

        before = _credits(provider, "mailfox")
        third = await run(client, PLAY, given, task_queue=task_queue)
        assert _sent(provider, "mailfox") == 30 + misses  # exactly the misses, again
        assert (third.stats.cells_fresh, third.stats.cells_due) == (hits, misses + 30)
        assert third.stats.credits == pytest.approx(_credits(provider, "mailfox") - before)

        # A changed input is computed again however fresh its cell is.
        leads[0] = lead(0, domain="moved.example")
        write_csv(csv_path, leads)
        moved = await run(client, PLAY, patient, task_queue=task_queue)
        assert _sent(provider, "mailfox") == 30 + misses + 1
        rows = await _rows(home, moved.output["run_ref"], tmp_path)
    assert {row["seen"] for row in rows.values()} == {"4"}  # rc.previous, run after run
    assert rows["T0000"]["email"].endswith("@moved.example") or rows["T0000"]["email"] == ""


def _catalog_with_mailfox_rule(tmp_path: Path) -> Path:
    billing = 'billing = { rule = "per_hit", credits = 1, hit = "email" }\n'
    text = CATALOG.read_text()
    assert text.count(billing) == 1
    rule = f'fresh_for = {{ found = "1h", no_match = "{SHORT_S}s" }}\n'
    path = tmp_path / "catalog.toml"
    path.write_text(text.replace(billing, billing + rule))
    return path


async def test_a_catalog_rule_pays_again_only_for_receipts_past_their_freshness(
    client, provider, worker, task_queue, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(40)])
    given = {"csv_path": str(csv_path)}  # no column rule: the tool's receipts decide
    async with worker(catalog_path=str(_catalog_with_mailfox_rule(tmp_path))):
        await run(client, PLAY, given, task_queue=task_queue)
        done_at = time.monotonic()
        misses = 40 - round(_credits(provider, "mailfox"))
        assert 0 < misses < 40
        assert _sent(provider, "mailfox") == 40

        await _past(SHORT_S, done_at)
        before = _credits(provider, "mailfox")
        later = await run(client, PLAY, given, task_queue=task_queue)
    assert _sent(provider, "mailfox") == 40 + misses  # only the misses' receipts aged out
    assert later.stats.calls_made == misses
    assert later.stats.credits == pytest.approx(_credits(provider, "mailfox") - before)


async def test_a_rule_by_value_retries_poor_verdicts_and_keeps_valid_ones(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(60)])
    given = {"csv_path": str(csv_path), "retry_verdicts_s": SHORT_S}
    async with worker():
        first = await run(client, PLAY, given, task_queue=task_queue)
        done_at = time.monotonic()
        verdicts = await _rows(home, first.output["run_ref"], tmp_path)
        poor = sum(1 for row in verdicts.values() if row["verdict"] in ("invalid", "risky"))
        assert 0 < poor < 60
        assert _sent(provider, "verifly") == 60

        await _past(SHORT_S, done_at)
        before = _credits(provider, "verifly")
        second = await run(client, PLAY, given, task_queue=task_queue)
    assert _sent(provider, "verifly") == 60 + poor
    assert _credits(provider, "verifly") - before == pytest.approx(0.5 * poor)
    assert second.stats.credits == pytest.approx(0.5 * poor)


async def test_a_scheduled_firing_records_and_pays_exactly_the_cells_past_their_freshness(
    client, provider, worker, task_queue, tmp_path
) -> None:
    """A schedule (weekly: the test triggers its firings) over the play with a column
    rule: the second firing's estimate says the misses are due, and it pays for them
    alone (the provider's ledger), before any hit."""
    from playline.schedules import create_schedule, trigger_schedule
    from tests.e2e.test_schedules import cleaned_up, finished_firings, new_name, state_of

    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(30)])
    given = {"csv_path": str(csv_path), "email_found_s": 3600, "email_no_match_s": SHORT_S}
    name = new_name()
    async with worker(), cleaned_up(client, name):
        await create_schedule(client, name, PLAY, given, every="7d", task_queue=task_queue)
        await trigger_schedule(client, name)
        await finished_firings(client, name, 1)
        done_at = time.monotonic()
        misses = 30 - round(_credits(provider, "mailfox"))
        assert _sent(provider, "mailfox") == 30 and 0 < misses < 30

        await _past(SHORT_S, done_at)
        await trigger_schedule(client, name)
        second = (await finished_firings(client, name, 2))[1]
        due = (await state_of(client, second)).due
    assert _sent(provider, "mailfox") == 30 + misses  # the misses, once each; no hit
    assert due is not None
    assert (due["cells_due"], due["cells_fresh"]) == (misses + 30, 30 - misses)
    assert due["calls"] == misses
