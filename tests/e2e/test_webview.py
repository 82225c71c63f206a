"""``playline ui`` in a real headless Chromium, over a real Temporal, store and provider.

One waterfall play with a credit cap runs against the provider server; the sheet view
(the app ``playline ui`` serves, on a real port) is read in Debian's Chromium as a
user would: the runs list shows the play running and held at its budget, its sheet
says why, raising the budget from the page lets it finish (every row once, the
provider's ledger equal to the credits the page shows), the sheet filled in
meanwhile, a waterfall cell's provenance lists each step, filtering by "no match"
shows exactly those rows, and a request from another address without the token is
refused. A run estimated first, against a provider answering 429s, shows per provider
its calls, 429s and rate in force (the ledger's figures) and the estimate beside its
spend; a run finished by a second worker shows both workers' samples summed.
Chromium is driven as in ``test_ui.py`` (``executable_path``, offline flags).
Screenshots go to ``test-artifacts/webview/`` (git-ignored).
"""

from __future__ import annotations

import asyncio
import csv
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from playline.calls.provenance import tally
from playline.cli.ui import serving, sheet_view_running, ui_app
from playline.client import start_estimate
from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.sockets import free_port
from playline.spend import NO_STEP
from playline.stores.backends import open_stores
from playline.webview.outcomes import cell_outcome
from playline.worker import connect
from tests.conftest import REPO, new_id
from tests.e2e.test_budgets import waiting_state
from tests.e2e.test_crash_recovery import first_rows
from tests.e2e.test_ui import chromium, wait_for_texts
from tests.pg import pg_schema

playwright = pytest.importorskip("playwright.async_api")

ARTIFACTS = REPO / "test-artifacts" / "webview"
ROWS = 30
TOKEN = "e2e-token"
#: credits the run may spend before it is held: some rows, not all
CAP = 40
#: rows of the run whose pace is drawn: enough for a few seconds of calls
PACED_ROWS = 80


def outside_address() -> str | None:
    """This machine's address on a non-loopback interface (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Any]:
    async with chromium(tmp_path / "chromium-profile", height=900) as context:
        yield context


async def shoot(page: Any, name: str, height: int = 560) -> None:
    """The top of the page (the README's pictures are these, copied into docs/webview/)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    clip = {"x": 0, "y": 0, "width": 1400, "height": height}
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), clip=clip)


async def fresh_page(page: Any, url: str) -> Any:
    """Leave ``page`` for a new tab at ``url``. A page rendered while its run was going
    reloads itself (``<meta http-equiv="refresh">``); that reload can land while a
    ``goto`` on the same tab is loading and abort it, so the next page gets a tab of its
    own instead."""
    fresh = await page.context.new_page()
    await page.close()
    await fresh.goto(url)
    return fresh


async def shown_seqs(page: Any) -> list[int]:
    return [
        int(s)
        for s in await page.locator("#sheet tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.seq)"
        )
    ]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store_url(request: Any) -> AsyncIterator[str | None]:
    """The workers' store: SQLite in the test's home, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield None
        return
    async with pg_schema() as url:
        yield url


async def test_the_sheet_view_follows_a_held_run_to_its_end(
    client, provider, worker, task_queue, home, tmp_path, browser, store_url
) -> None:
    provider.configure(latency_ms=[20, 40])
    csv_path = first_rows(ROWS, tmp_path / "leads.csv")
    play_id = new_id("sheet")
    async with worker(store_url=store_url):
        handle = await client.start_workflow(
            "t_waterfall",
            args=[{"csv_path": str(csv_path)}, RunOptions(max_credits=CAP, chunk_size=5)],
            id=play_id,
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        await waiting_state(handle)
        settings = Settings.from_env(
            home=home,
            temporal_address=client.service_client.config.target_host,
            store_url=store_url,
        )
        view_client = await connect(settings=settings)
        port = free_port("0.0.0.0")
        outside = outside_address()
        app = ui_app(
            view_client, settings, token=TOKEN, host="0.0.0.0", extra_hosts=[outside or ""]
        )
        async with serving(app, "0.0.0.0", port):
            base = f"http://127.0.0.1:{port}"
            page = await browser.new_page()

            # The runs list: the play, running and held at its budget.
            await page.goto(base + "/")
            runs = await wait_for_texts(page, play_id, "t_waterfall", "budget:")
            assert "waiting" in runs
            await shoot(page, "runs")

            # Its sheet: why it waits, the rows done so far, the others held.
            await page.get_by_role("link", name=play_id).click()
            await wait_for_texts(page, "budget:", "--add N", "held at budget")
            held_done = await page.locator("#sheet td.status-done").count()
            assert 0 < held_done < ROWS
            await shoot(page, "sheet-held")

            # Its charts: the spend so far against the cap it is held at.
            await page.locator("#charts-link").click()
            await wait_for_texts(page, "Spend over time", f"cap {CAP}", "mailfox_email")
            await shoot(page, "charts-held")
            await page.go_back()

            # Raise the budget from the page: the CLI's own line answers.
            await page.fill("input[name=add]", "100000")
            await page.get_by_role("button", name="raise budget").click()
            said = await page.locator("#said").inner_text()
            assert re.search(rf"{play_id}: budget {100000 + CAP} credits, [\d.]+ spent", said), said
            result = await asyncio.wait_for(handle.result(), 120)
            assert result.stats.rows_ok == ROWS

            # The sheet filled in: every row done, once; the credits are the ledger's.
            page = await fresh_page(page, f"{base}/sheet?id={play_id}")
            await wait_for_texts(page, "completed")
            assert await page.locator("#sheet td.status-done").count() == ROWS
            assert sorted(await shown_seqs(page)) == list(range(ROWS))
            ledger = provider.ledger()
            shown = float(await page.locator("#credits").inner_text())
            assert shown == pytest.approx(ledger["credits"], abs=1e-9)
            assert shown == pytest.approx(result.stats.credits, abs=1e-9)

            # Its export, as `runs export --provenance` writes it.
            async with page.expect_download() as download:
                await page.get_by_role("link", name="CSV with provenance").click()
            saved = tmp_path / "export.csv"
            await (await download.value).save_as(saved)
            with saved.open(newline="") as handle:
                exported = list(csv.DictReader(handle))
            assert len(exported) == ROWS
            assert "verified_email__source" in exported[0]

            # The charts of the finished run: each provider's account.
            await page.goto(f"{base}/charts?id={play_id}")
            await wait_for_texts(page, "Providers", "prospectr", "receipt hits")
            # No estimate was made of it: the page says how to make one.
            await wait_for_texts(page, "No estimate of this play on this input")
            await shoot(page, "charts", height=900)
            await page.goto(f"{base}/sheet?id={play_id}")

            # What the store holds, to check the page against.
            run_ref = result.datasets[0].run_ref
            async with await open_stores(settings, create=False) as stores:
                rows = await stores.sheet.read_run_rows(run_ref, 0, ROWS)
            no_match = [
                r.seq
                for r in rows
                if cell_outcome(r.status, (r.provenance or {}).get("verified_email"), None)
                == "no_match"
            ]
            with_steps = next(
                r
                for r in rows
                if len((r.provenance or {}).get("verified_email", {}).get("steps") or []) > 1
            )

            # A waterfall cell's provenance: each step with its outcome and cost.
            cell = page.locator(
                f'#sheet tr[data-seq="{with_steps.seq}"] td[data-column="verified_email"] a'
            )
            await cell.click()
            await page.locator("#provenance").wait_for()
            table = page.locator("#steps tbody tr")
            steps = with_steps.provenance["verified_email"]["steps"]  # type: ignore[index]
            assert await table.count() == len(steps)
            for i, step in enumerate(steps):
                cells = await table.nth(i).locator("td").all_inner_texts()
                assert cells[1] == step["tool"], cells
                assert cells[3].split("\n")[0] == step["outcome"], cells
                assert float(cells[4]) == pytest.approx(step["credits"]), cells
            await shoot(page, "sheet-provenance", height=760)

            # Filtering by "no match": exactly those rows.
            await page.goto(f"{base}/sheet?id={play_id}")
            await page.select_option("#outcome-filter select[name=outcome]", "no_match")
            await page.select_option("#outcome-filter select[name=ocol]", "verified_email")
            await page.locator("#outcome-filter button").click()
            await page.locator("#matching").wait_for()
            assert await shown_seqs(page) == no_match
            assert int(await page.locator("#matching").inner_text()) == len(no_match)

            # Sorted by a column within the filter (the store orders them), then backwards.
            by_name = sorted(
                (r for r in rows if r.seq in no_match),
                key=lambda r: (str(r.data["last_name"]).lower(), r.seq),
            )
            await page.locator("#sheet thead th a", has_text="last_name").click()
            await page.locator("#sheet thead th", has_text="last_name ▲").wait_for()
            assert await shown_seqs(page) == [r.seq for r in by_name]
            await page.locator("#sheet thead th a", has_text="last_name").click()
            await page.locator("#sheet thead th", has_text="last_name ▼").wait_for()
            backwards = sorted(
                by_name, key=lambda r: str(r.data["last_name"]).lower(), reverse=True
            )
            assert await shown_seqs(page) == [r.seq for r in backwards]

            # The funnel's rows per step are the tally of every row's provenance.
            spent = tally(r.provenance for r in rows if r.provenance)
            await page.goto(f"{base}/charts?id={play_id}")
            funnel = page.locator("#funnels table.funnel tbody tr")
            answered = {
                cells[0]: int(cells[1])
                for cells in [
                    await row.locator("td").all_inner_texts() for row in await funnel.all()
                ]
            }
            steps = spent.steps["verified_email"]
            assert answered.pop("no step answered") == steps.get(NO_STEP, 0)
            assert answered == {t: steps.get(t, 0) for t in spent.tried["verified_email"]}

            # From another address, no token: refused; with it, the page.
            if outside is not None:
                far = await page.goto(f"http://{outside}:{port}/")
                assert far is not None and far.status == 401
                far = await page.goto(f"http://{outside}:{port}/?token={TOKEN}")
                assert far is not None and far.status == 200
                assert TOKEN not in page.url

    # As `playline dev` would run it beside its stack: loopback, the same pages.
    async with sheet_view_running(settings, free_port(), client=view_client) as url:
        assert url.startswith("http://127.0.0.1:")
        await page.goto(url + "/")
        await wait_for_texts(page, play_id, "completed")


async def test_the_charts_show_each_providers_pace_and_the_estimate_beside_the_spend(
    client, provider, worker, task_queue, home, tmp_path, browser, store_url
) -> None:
    """A run whose provider answers some 429s, estimated first: its charts show, per
    provider, the calls sent and the 429s (as the provider's ledger counts them), the
    rate in force and how it was learnt, and the estimate beside the credits spent (the
    ledger's, per provider)."""
    # prospectr allows 8 requests a second (a token bucket the governor is not told
    # of: it learns it from the 429s).
    provider.configure(
        latency_ms=[20, 40],
        retry_after_header=True,
        rate_limit_rps={"prospectr": 8},
        rate_limit_burst={"prospectr": 2},
    )
    csv_path = first_rows(PACED_ROWS, tmp_path / "leads.csv")
    play_input = {"csv_path": str(csv_path)}
    options = RunOptions(chunk_size=5)
    play_id = new_id("paced")
    async with worker(store_url=store_url):
        estimated = await start_estimate(
            client, "t_waterfall", play_input, options=options, task_queue=task_queue
        )
        await asyncio.wait_for(estimated.result(), 120)
        assert provider.ledger()["received"] == 0  # an estimate sends nothing
        # The next few requests are refused with 429 (and Retry-After): the run waits
        # them out and retries.
        await asyncio.to_thread(provider.configure, fail_next={"429": 4})
        handle = await client.start_workflow(
            "t_waterfall",
            args=[play_input, options],
            id=play_id,
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        result = await asyncio.wait_for(handle.result(), 180)
        assert result.stats.rows_ok == PACED_ROWS
    ledger = provider.ledger()
    assert ledger["rate_limited"] >= 4
    sent: dict[str, int] = {}
    for call in provider.calls():
        sent[call["provider"]] = sent.get(call["provider"], 0) + 1

    settings = Settings.from_env(
        home=home, temporal_address=client.service_client.config.target_host, store_url=store_url
    )
    view_client = await connect(settings=settings)
    port = free_port()
    async with serving(ui_app(view_client, settings), "127.0.0.1", port):
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{port}/charts?id={play_id}")
        await wait_for_texts(page, "Calls per second", "The estimate beside what was spent")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for part in ("spend", "pace", "estimate"):
            await page.locator(f"#{part}").screenshot(path=str(ARTIFACTS / f"charts-{part}.png"))

        # Per provider: the calls it received and the 429s it sent, as its ledger says.
        shown: dict[str, tuple[int, int]] = {}
        for chart in await page.locator("#pace div.pace").all():
            name = await chart.get_attribute("data-provider")
            calls = int(await chart.locator(".calls-total").inner_text())
            limited = int(await chart.locator(".n429").inner_text())
            shown[str(name)] = (calls, limited)
            # the rate in force is drawn, and said how it was learnt
            assert await chart.locator("svg path.rate").count() == 1
            assert re.search(r"/s from the \w", await chart.locator(".learnt").inner_text())
            # one red mark per time bucket with 429s, their counts adding up
            marks = [int(t) for t in await chart.locator(".mark-429 text").all_text_contents()]
            assert sum(marks) == limited
        limited_by = ledger["rate_limited_by_provider"]
        assert shown == {p: (n, limited_by.get(p, 0)) for p, n in sent.items()}
        assert sum(limited for _, limited in shown.values()) == ledger["rate_limited"]

        # The estimate made before the run, beside what each provider charged.
        assert await page.locator("#estimate-id").inner_text() == estimated.id
        spent = {
            str(await row.get_attribute("data-provider")): float(
                await row.locator("td.spent").inner_text()
            )
            for row in await page.locator("#estimate table.estimate tbody tr").all()
        }
        charged = {p: c for p, c in ledger["credits_by_provider"].items() if c}
        assert {p: c for p, c in spent.items() if c} == pytest.approx(charged, abs=1e-9)
        worst = {
            str(await row.get_attribute("data-provider")): float(
                await row.locator("td.worst").inner_text()
            )
            for row in await page.locator("#estimate table.estimate tbody tr").all()
        }
        # Nothing was in the receipts: the run paid at most the estimate's worst case.
        assert all(spent[p] <= worst[p] + 1e-9 for p in spent)


@pytest.mark.postgres
async def test_each_worker_of_a_fleet_samples_the_pace_and_the_chart_sums_them(
    client, provider, worker, task_queue, home, tmp_path, browser
) -> None:
    """One run on two workers sharing PostgreSQL, one after the other: the first runs
    it until its cap holds it and stops, the second finishes it once the budget is
    raised from the page (and gets the provider's 429s). Each wrote its own samples;
    the chart's calls and 429s per provider are both workers' together, the ledger's."""
    provider.configure(latency_ms=[20, 40], retry_after_header=True)
    csv_path = first_rows(ROWS, tmp_path / "leads.csv")
    play_id = new_id("fleet")
    async with pg_schema() as store_url:
        settings = Settings.from_env(
            home=home,
            temporal_address=client.service_client.config.target_host,
            store_url=store_url,
        )
        async with worker(store_url=store_url):
            handle = await client.start_workflow(
                "t_waterfall",
                args=[{"csv_path": str(csv_path)}, RunOptions(max_credits=CAP, chunk_size=5)],
                id=play_id,
                task_queue=task_queue,
                result_type=PlayRunResult,
            )
            await waiting_state(handle)
        await asyncio.to_thread(provider.configure, fail_next={"429": 3})
        view_client = await connect(settings=settings)
        port = free_port()
        async with (
            worker(store_url=store_url),
            serving(ui_app(view_client, settings), "127.0.0.1", port),
        ):
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{port}/sheet?id={play_id}")
            await page.fill("input[name=add]", "100000")
            await page.get_by_role("button", name="raise budget").click()
            await page.locator("#said").wait_for()
            result = await asyncio.wait_for(handle.result(), 120)
            assert result.stats.rows_ok == ROWS

            import psycopg

            with psycopg.connect(store_url, autocommit=True) as pg:
                found = pg.execute(
                    "SELECT count(DISTINCT worker), sum(limited) FROM playline_run_pace"
                    " WHERE run_ref = %s",
                    [result.datasets[0].run_ref],
                ).fetchone()
            assert found is not None and (found[0], found[1]) == (2, 3)

            ledger = provider.ledger()
            sent: dict[str, int] = {}
            for call in provider.calls():
                sent[call["provider"]] = sent.get(call["provider"], 0) + 1
            page = await fresh_page(page, f"http://127.0.0.1:{port}/charts?id={play_id}")
            await wait_for_texts(page, "Calls per second")
            shown = {
                str(await chart.get_attribute("data-provider")): (
                    int(await chart.locator(".calls-total").inner_text()),
                    int(await chart.locator(".n429").inner_text()),
                )
                for chart in await page.locator("#pace div.pace").all()
            }
            limited_by = ledger["rate_limited_by_provider"]
            assert shown == {p: (n, limited_by.get(p, 0)) for p, n in sent.items()}
            assert ledger["rate_limited"] == 3


async def test_a_run_from_the_command_line_is_shown_beside_its_estimate(
    client, provider, worker, temporal_address, task_queue, home, tmp_path, browser
) -> None:
    """``playline estimate`` then ``playline run`` on the same file (each uploads it):
    the run is shown beside that estimate. ``playline run --confirm-over`` estimates
    first: that run is shown beside its own pre-flight estimate, the newer one."""
    from tests.e2e.test_cli import playline

    provider.configure(latency_ms=[5, 10])
    csv_path = first_rows(ROWS, tmp_path / "leads.csv")
    common = ("--csv", str(csv_path), "--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        made = await playline("estimate", "t_waterfall", "--id", "est-1", *common, home=home)
        assert made.returncode == 0, made.stderr
        ran = await playline("run", "t_waterfall", "--id", "cli-run-1", *common, home=home)
        assert ran.returncode == 0, ran.stderr
        checked = await playline(
            "run", "t_waterfall", "--id", "cli-run-2", "--confirm-over", "100000", *common,
            home=home,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stderr
        said = checked.stdout + checked.stderr
        assert "is within --confirm-over" in said, said

    settings = Settings.from_env(home=home, temporal_address=temporal_address)
    port = free_port()
    async with serving(ui_app(await connect(settings=settings), settings), "127.0.0.1", port):
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{port}/charts?id=cli-run-1")
        await wait_for_texts(page, "The estimate beside what was spent")
        assert await page.locator("#estimate-id").inner_text() == "est-1"
        await page.goto(f"http://127.0.0.1:{port}/charts?id=cli-run-2")
        await wait_for_texts(page, "The estimate beside what was spent")
        preflight = await page.locator("#estimate-id").inner_text()
        assert preflight.startswith("estimate-t_waterfall-"), preflight
