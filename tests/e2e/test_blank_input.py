"""Bad input costs nothing, end to end: a required tool input left blank never reaches
the provider.

Real Temporal dev server, an in-process worker, real SQLite stores and the real local
provider server, whose ledger is the judge: the rows without a ``company_domain`` sent
nothing for the calls that need one (the server answers 422 to a blank field, and
counts it), their cells say ``skipped_input`` and cost 0, the rows are ok, not failed,
the other rows are computed as ever, and in a waterfall the next step (whose input is
there) runs for them. The estimate counts those calls free, and its worst case still
covers the bill.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from playline import Estimate, estimate_play
from playline.config import Settings
from playline.datasets import export_run
from playline.provider_server.fake_data import find_email, lookup_company
from playline.services import Services
from tests.conftest import new_id
from tests.e2e.test_cli import playline
from tests.e2e.test_waterfalls import _provenance
from tests.plays import LEAD_COLUMNS, lead, read_csv_rows, run, write_csv

EMAIL_PATH = "/acme/v1/email/find"
COMPANY_PATH = "/firmo/v1/company/lookup"
MAILFOX = "/mailfox/v1/email/find"
PROSPECTR = "/prospectr/v1/email/find"

#: Leads (by position) whose company_domain is blank: empty or only whitespace.
BLANK = {3: "", 7: "", 10: "   "}
ROWS = 12


def _leads() -> list[list[str]]:
    rows = [lead(n) for n in range(ROWS)]
    for n, domain in BLANK.items():
        rows[n][3] = domain
    return rows


def _line(estimate: Estimate, column: str, tool: str) -> Any:
    (found,) = [x for x in estimate.lines if x.column == column and x.tool == tool]
    return found


def _received(provider: Any, path: str) -> int:
    return sum(1 for call in provider.calls() if call["path"] == path)


async def test_rows_without_a_domain_send_nothing_and_the_other_rows_are_unchanged(
    client, provider, worker, task_queue, home, tmp_path
) -> None:
    """The demo play: company_name, industry and work_email call with the domain
    directly, verified_email's waterfall steps all need it, title needs a work email."""
    leads = _leads()
    csv_path = write_csv(tmp_path / "leads.csv", leads)
    play_input = {"csv_path": str(csv_path)}
    async with worker():
        estimate = await estimate_play(client, "enrich_leads", play_input, task_queue=task_queue)
        assert provider.ledger()["received"] == 0
        result = await run(client, "enrich_leads", play_input, task_queue=task_queue)
    ledger = provider.ledger()
    present = [row for n, row in enumerate(leads) if n not in BLANK]

    # Nothing blank reached the provider: it counts every blank field it is sent.
    assert ledger["invalid"] == 0 and ledger["double_charged"] == 0
    assert _received(provider, EMAIL_PATH) == len(present)
    assert _received(provider, MAILFOX) == len(present)
    assert _received(provider, COMPANY_PATH) == len({row[3] for row in present})

    # The rows are ok, not failed; each blank row has four skipped cells.
    (dataset,) = result.datasets
    assert dataset.stats.rows_ok == ROWS and dataset.stats.rows_failed == 0
    assert dataset.stats.first_error is None
    assert result.stats.cells_skipped_input == 4 * len(BLANK)
    assert result.stats.credits == pytest.approx(ledger["credits"])

    rows, spend = await _provenance(home, dataset.run_ref)
    assert spend.credits == pytest.approx(ledger["credits"])
    assert spend.skipped_input == 4 * len(BLANK)
    for n, cells in enumerate(rows):
        if n in BLANK:
            for column, tool in (
                ("company_name", "company_lookup"),
                ("industry", "company_lookup"),
                ("work_email", "email_finder"),
            ):
                assert cells[column] == {
                    "tool": None,
                    "credits": 0.0,
                    "miss": "skipped_input",
                    "blank": f"{tool}: domain",
                }, (n, column)
            assert cells["title"]["miss"] == "skipped (run_if)"
            waterfall = cells["verified_email"]
            assert waterfall["miss"] == "skipped_input" and waterfall["credits"] == 0.0
            assert [(s["tool"], s["outcome"], s["reason"]) for s in waterfall["steps"]] == [
                ("mailfox_email", "skipped_input", "blank: domain"),
                ("prospectr_email", "skipped_input", "blank: domain"),
            ]
        else:
            assert cells["company_name"]["tool"] == "company_lookup", n
            assert cells["company_name"]["miss"] is None
            assert cells["work_email"]["tool"] == "email_finder"
            assert all(s["outcome"] != "skipped_input" for s in cells["verified_email"]["steps"])

    # The export: blank rows' cells are empty and say why; the others as ever.
    out = tmp_path / "out.csv"
    services = await Services.open(Settings.from_env(home=home))
    try:
        await export_run(services.sheet, dataset.run_ref, str(out), provenance=True)
    finally:
        await services.close()
    exported = read_csv_rows(out)
    assert [row["lead_id"] for row in exported] == [row[0] for row in leads]
    for n, row in enumerate(exported):
        assert "_error" not in row or row["_error"] == ""
        if n in BLANK:
            for column in ("company_name", "industry", "work_email", "verified_email"):
                assert row[column] == "" and row[f"{column}__miss"] == "skipped_input"
                assert float(row[f"{column}__credits"]) == 0.0
        else:
            _, first, last, domain = leads[n]
            assert row["company_name"] == lookup_company(domain)["name"]
            assert row["work_email"] == (find_email(first, last, domain).get("email") or "")
            assert row["company_name__miss"] == ""

    # The estimate counted no call for a blank input, went on with those rows (none
    # failed) and its worst case covers what the run was charged.
    assert estimate.rows == ROWS and estimate.rows_failed == 0
    assert _line(estimate, "company_name", "company_lookup").to_pay == 3
    assert _line(estimate, "work_email", "email_finder").to_pay == len(present)
    assert _line(estimate, "verified_email", "mailfox_email").to_pay == len(present)
    assert _line(estimate, "verified_email", "prospectr_email").to_pay == len(present)
    assert _line(estimate, "title", "person_enrich").unknown_input == len(present)
    assert estimate.total.worst_credits >= ledger["credits"]


async def test_in_a_waterfall_the_next_step_runs_for_a_blank_step_and_the_cli_counts_the_cells(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    """t_blank_input: a company by domain (direct call), an email by mailfox (domain)
    then prospectr (website). A row without a domain asks prospectr only; a row with
    neither asks nothing; the summary counts the skipped cells."""
    columns = [*LEAD_COLUMNS, "website"]
    leads = [[*lead(n), f"site{n}.example"] for n in range(8)]
    leads[2][3] = ""  # no domain: prospectr by website
    leads[5][3] = " "  # no domain: prospectr by website
    leads[6][3], leads[6][4] = "", ""  # neither: nothing is sent for this row
    blank_domain, neither = {2, 5}, {6}
    csv_path = write_csv(tmp_path / "leads.csv", leads, columns)
    out = tmp_path / "out.jsonl"
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        ran = await playline(
            "run",
            "t_blank_input",
            "--csv",
            str(csv_path),
            "--out",
            str(out),
            "--provenance",
            "--id",
            new_id("blank"),
            *common,
            home=home,
        )
    assert ran.returncode == 0, ran.stderr
    ledger = provider.ledger()
    assert ledger["invalid"] == 0 and ledger["double_charged"] == 0

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["lead_id"] for row in rows] == [row[0] for row in leads]
    skipped = 0
    asked_prospectr = 0
    for n, row in enumerate(rows):
        cells = row["_provenance"]
        steps = [(s["tool"], s["outcome"]) for s in cells["email"]["steps"]]
        if n in blank_domain | neither:
            assert cells["company"]["miss"] == "skipped_input" and row["company"] is None
            assert cells["company"]["credits"] == 0.0
            skipped += 1
            assert steps[0] == ("mailfox_email", "skipped_input")
            if n in neither:
                assert steps[1] == ("prospectr_email", "skipped_input")
                assert cells["email"]["miss"] == "skipped_input" and row["email"] is None
                assert cells["email"]["credits"] == 0.0
                skipped += 1
            else:  # the next step, whose input is there, ran
                assert steps[1][0] == "prospectr_email"
                assert steps[1][1] in ("hit", "no_match")
                asked_prospectr += 1
                if steps[1][1] == "hit":
                    assert row["email"] and row["email"].endswith(f"@site{n}.example")
        else:
            assert cells["company"]["tool"] == "company_lookup"
            assert row["company"] == lookup_company(leads[n][3])["name"]
            assert steps[0][0] == "mailfox_email" and steps[0][1] != "skipped_input"
            asked_prospectr += len(steps) > 1
    assert _received(provider, MAILFOX) == 8 - len(blank_domain | neither)
    assert _received(provider, PROSPECTR) == asked_prospectr
    assert sum(
        cells["credits"] for row in rows for cells in row["_provenance"].values()
    ) == pytest.approx(ledger["credits"])
    assert "rows: 8 ok, 0 failed" in ran.stdout
    assert f"blank input: {skipped} cells skipped, nothing sent for them" in ran.stdout
