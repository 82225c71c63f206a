"""The Temporal UI tells a play's story, checked in a real (headless) Chromium.

A dev server with its UI (as ``playline dev`` starts it) runs the demo play and one
failing play; the test opens their pages and their dataset run's, waits for the
single-page app to render them, and reads the rendered DOM: the static summary
and details, the current details, the chunk summaries and the failure's root
cause. Screenshots are saved under ``test-artifacts/ui/`` (git-ignored) and named
in the test output.

Chromium is Debian's (``.ci/run`` installs it), driven by Playwright from PyPI with
``executable_path``: nothing downloads a browser. The network is closed here, so
Chromium runs with the flags that keep it from calling home.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from playline.cli.devserver import DevServer
from playline.client import start_play
from playline.config import Settings
from playline.contract import RunOptions
from playline.demo import LEADS_CSV
from playline.demo.enrich_leads import EnrichLeadsInput, enrich_leads
from playline.provider_server.process import free_port
from playline.worker import build_worker, connect
from tests.conftest import REPO, new_id
from tests.plays import BOOM, ToolColumnInput, lead, t_tool_column, write_csv

CHROMIUM = os.environ.get("PLAYLINE_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts" / "ui"
#: Without these Chromium tries to reach Google's services (the network is closed).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: How long the single-page app may take to show what a check waits for.
RENDER_TIMEOUT_S = 60.0

if not Path(CHROMIUM).exists():
    reason = f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does)"
    if os.environ.get("CI"):
        raise RuntimeError(reason)  # CI installs it: a missing browser is a broken CI
    pytest.skip(reason, allow_module_level=True)

playwright = pytest.importorskip("playwright.async_api")


@pytest.fixture
async def ui_server(tmp_path: Path) -> AsyncIterator[DevServer]:
    """A dev server with its UI, search attributes registered, as ``playline dev`` has."""
    server = DevServer(home=tmp_path / "temporal", port=free_port(), ui_port=free_port())
    await server.start()
    try:
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def chromium(profile: Path, *, height: int) -> AsyncIterator[Any]:
    """Debian's Chromium, headless and offline, with a new, empty profile at ``profile``."""
    async with playwright.async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": height},
        )
        try:
            yield context
        finally:
            await context.close()


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Any]:
    """A headless Chromium page with a new, empty profile."""
    async with chromium(tmp_path / "chromium-profile", height=1100) as context:
        yield context


async def page_text(page: Any) -> str:
    """The rendered text of the page and of its frames (the UI renders Markdown in frames)."""
    parts = []
    for frame in page.frames:
        try:
            parts.append(await frame.inner_text("body"))
        except playwright.Error:  # a frame that went away while we read
            continue
    return "\n".join(parts)


async def wait_for_texts(page: Any, *texts: str) -> str:
    """Poll the rendered DOM until every text is on the page (the UI loads and refreshes
    asynchronously); fail naming what never appeared."""
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    while True:
        text = await page_text(page)
        missing = [t for t in texts if t not in text]
        if not missing:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"never rendered {missing}; the page showed:\n{text[:4000]}")
        await page.wait_for_timeout(250)


async def shoot(
    page: Any, name: str, capsys: pytest.CaptureFixture[str], *, full_page: bool = True
) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=full_page)
    with capsys.disabled():
        print(f"\n  screenshot: {path.relative_to(REPO)}")
    return path


#: For each list item of each frame: its text, and where its last line of text ends
#: (``right``) against the width its document shows (``visible``) and the width it
#: would need (``needed``: more than ``visible`` when something is cut off).
ITEMS_JS = """() => Array.from(document.querySelectorAll('li')).map(li => {
  const range = document.createRange();
  range.selectNodeContents(li);
  const rects = Array.from(range.getClientRects()).filter(r => r.width > 0);
  const last = rects[rects.length - 1];
  const doc = document.documentElement;
  return {
    text: li.innerText,
    right: last ? last.right : -1,
    visible: doc.clientWidth,
    needed: doc.scrollWidth,
    strong: Array.from(li.querySelectorAll('strong')).map(s => s.innerText),
  };
})"""


async def list_items(page: Any) -> list[dict[str, Any]]:
    """The list items of the page and of its frames, with where their text ends."""
    items: list[dict[str, Any]] = []
    for frame in page.frames:
        try:
            items += await frame.evaluate(ITEMS_JS)
        except playwright.Error:  # a frame that went away while we read
            continue
    return items


def figure(value: Any) -> str:
    number = float(value or 0)
    return str(int(number)) if number.is_integer() else f"{number:g}"


async def assert_accounts_readable(page: Any, accounts: dict[str, dict[str, Any]]) -> None:
    """Each provider's account is its own list item whose every term is a figure and
    a word of its own, and the item's last term is on screen, not cut off."""
    text = await wait_for_texts(page, "accounts with the providers")
    # What a table without cell padding showed: headings run together.
    assert "requestscharged" not in text and "providerrequests" not in text
    items = {item["text"].split(":", 1)[0].strip(): item for item in await list_items(page)}
    for provider, counts in sorted(accounts.items()):
        item = items.get(provider)
        assert item is not None, (provider, list(items))
        assert item["strong"] == [provider]
        terms = item["text"].split(":", 1)[1].split(" · ")
        expected = [
            f"{figure(counts.get('requests'))} requests",
            f"{figure(counts.get('charged'))} charged",
        ]
        assert [t.strip() for t in terms[:2]] == expected, item["text"]
        assert f"{figure(counts.get('credits'))} credits" in [t.strip() for t in terms]
        for term in terms:  # a figure, then its words: "14 receipt hits"
            number, _, words = term.strip().partition(" ")
            assert float(number) >= 0 and words and not words[0].isdigit(), term
        # The last term ends inside what the panel shows; nothing needs more width.
        assert 0 < item["right"] <= item["visible"] + 1, item
        assert item["needed"] <= item["visible"] + 1, item


async def open_tab(page: Any, base: str, workflow_id: str, tab: str) -> None:
    """A workflow's page in the UI, on one of its tabs (clicked, as a user would)."""
    await page.goto(f"{base}/namespaces/default/workflows/{workflow_id.replace('/', '%2F')}")
    await page.get_by_text(tab, exact=True).first.click()


async def test_the_ui_shows_summary_current_details_and_the_failure_reason(
    ui_server: DevServer, browser: Any, provider, tmp_path: Path, capsys
) -> None:
    address = ui_server.address
    base = ui_server.ui_url
    settings = Settings.from_env(home=tmp_path / "home")
    worker_client = await connect(address, settings=settings)
    client = await connect(address)
    failing_csv = write_csv(tmp_path / "leads.csv", [lead(0), lead(1, first_name=BOOM), lead(2)])
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    async with build_worker(worker_client, task_queue="ui"):
        demo = await start_play(
            client,
            enrich_leads,
            EnrichLeadsInput(csv_path=str(LEADS_CSV)),
            id=new_id("ui-demo"),
            task_queue="ui",
        )
        failing = await start_play(
            client,
            t_tool_column,
            ToolColumnInput(
                csv_path=str(failing_csv), column_tool="fail_on_boom", on_row_error="fail"
            ),
            options=RunOptions(chunk_size=1),
            id=new_id("ui-fail"),
            task_queue="ui",
        )
        result = await demo.result()
        with pytest.raises(Exception):  # noqa: B017 - the failure is read from the UI below
            await failing.result()
        rows = result.stats.rows_ok + result.stats.rows_failed
        page = await browser.new_page()

        # The play: static summary and details, and current details (a query the
        # worker answers), on the "User Metadata" tab.
        await open_tab(page, base, demo.id, "User Metadata")
        text = await wait_for_texts(
            page,
            "enrich_leads · leads.csv · live",  # static summary
            f"input file: {LEADS_CSV}",  # static details
            f"completed enriched_leads · {rows} of {rows} rows done",  # current details
            "credits:",
        )
        assert "No summary available" not in text
        await shoot(page, "play-metadata", capsys)
        # The accounts with the providers, one readable item each, in a window as
        # wide as this one and in a narrower one (where a table's last columns were
        # cut off).
        assert len(result.stats.accounts) >= 3
        await assert_accounts_readable(page, result.stats.accounts)
        await page.set_viewport_size({"width": 1024, "height": 1100})
        await open_tab(page, base, demo.id, "User Metadata")
        await assert_accounts_readable(page, result.stats.accounts)
        for frame in page.frames:
            heading = frame.get_by_text("accounts with the providers")
            if await heading.count():
                await heading.first.scroll_into_view_if_needed()
        await shoot(page, "play-accounts-narrow", capsys, full_page=False)
        await page.set_viewport_size({"width": 1400, "height": 1100})

        # The play's timeline: its own activities have summaries.
        await open_tab(page, base, demo.id, "Timeline")
        await wait_for_texts(page, "load leads.csv as leads", "prepare enriched_leads")
        await shoot(page, "play-timeline", capsys)

        # Its dataset run: static summary with the rows, chunk summaries on the timeline.
        child = f"{demo.id}/dataset/enriched_leads"
        await open_tab(page, base, child, "User Metadata")
        await wait_for_texts(
            page,
            f"enriched_leads: {rows} rows of leads.csv (upsert, live)",
            f"completed enriched_leads · {rows} of {rows} rows done",
        )
        await shoot(page, "dataset-run-metadata", capsys)
        await open_tab(page, base, child, "Timeline")
        await wait_for_texts(page, "rows 0-")
        await shoot(page, "dataset-run-timeline", capsys)

        # The failing play: its page names the root cause; its current details too.
        await page.goto(f"{base}/namespaces/default/workflows/{failing.id}")
        await wait_for_texts(page, "FAILED", "boom: refusing lead T0001")
        await shoot(page, "failed-play", capsys)
        await open_tab(page, base, failing.id, "User Metadata")
        await wait_for_texts(page, "failed t_rows", "phase: failed", "boom: refusing lead T0001")
        await shoot(page, "failed-play-metadata", capsys)

        # The workflow list answers a query on playline's own search attributes.
        query = 'PlaylinePlay="enrich_leads" AND PlaylineStatus="completed"'
        await page.goto(f"{base}/namespaces/default/workflows?query={query}")
        await wait_for_texts(page, demo.id)
        await shoot(page, "workflow-list-by-search-attributes", capsys)
