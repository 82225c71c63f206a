"""The sheet view's pages over a real SQLite sheet store and a stand-in Temporal desk.

The store is the real ``SheetLedger`` (rows written with its own ``write_results``);
only Temporal is replaced, by a desk that returns one run and records the actions
it is asked for (the real desk is the CLI's, driven end to end in
``tests/e2e/test_webview.py``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from playline.errors import PlaylineError
from playline.stores.sheet import RowResult, RunRow, SheetStore
from playline.stores.sheet_ledger import SheetLedger
from playline.webview import ExportChoice, RunSummary, check_exposure, sheet_link, webview_app
from playline.webview.charts import read_charts
from playline.webview.desk import RunEstimate
from playline.webview.outcomes import cell_outcome, row_status
from playline.webview.sheet_pages import SheetQuery, read_page

RUN = "run-1"
ROWS = 130
LOCAL = ("127.0.0.1", 40000)


def provenance_of(i: int) -> dict[str, Any] | None:
    """Row ``i``'s cell: a waterfall hit, a no match, a failure, a budget skip, or not run."""
    kind = i % 5
    if kind == 0:
        return {
            "tool": "mailfox_email",
            "provider": "mailfox",
            "receipt": "paid",
            "credits": 2.0,
            "by_provider": {"findly": 1.0, "mailfox": 1.0},
            "fetched_at": 1_800_000_000.0,
            "miss": None,
            "waterfall": "email",
            "steps": [
                {
                    "tool": "findly_email",
                    "provider": "findly",
                    "outcome": "no_match",
                    "reason": None,
                    "credits": 1.0,
                    "receipt": "paid",
                },
                {
                    "tool": "mailfox_email",
                    "provider": "mailfox",
                    "outcome": "hit",
                    "reason": None,
                    "credits": 1.0,
                    "receipt": "paid",
                },
            ],
        }
    if kind == 1:
        return {
            "tool": "findly_email",
            "provider": "findly",
            "receipt": "paid",
            "credits": 1.0,
            "miss": "findly_email: no_match",
        }
    if kind == 2:
        return {"tool": None, "credits": 0.0, "miss": "error: ProviderError"}
    if kind == 3:
        return {"tool": None, "credits": 0.0, "miss": "skipped_budget"}
    return None  # row still pending


async def fill(sheet: SheetStore, rows: int = ROWS) -> None:
    await sheet.put_source(
        "src", ["id", "name"], ((f"L{i:04d}", f"name {i % 7}") for i in range(rows))
    )
    await sheet.prepare_run(
        RUN,
        source_id="src",
        dataset="leads",
        key_fields=["id"],
        mode="upsert",
        computed_columns=["email"],
    )
    results = []
    for i in range(rows):
        prov = provenance_of(i)
        if prov is None:
            continue
        status = "error" if i % 5 in (2, 3) else "ok"
        error = (
            "ProviderError: down" if i % 5 == 2 else ("skipped_budget: cap" if i % 5 == 3 else None)
        )
        value = f"p{i}@example.com" if i % 5 == 0 else None
        results.append(RowResult(i, f"L{i:04d}", {"email": value}, status, error, {"email": prov}))
    await sheet.write_results(RUN, results)


class Desk:
    def __init__(self) -> None:
        self.acted: list[tuple[str, str, float | None]] = []
        self.estimated: RunEstimate | None = None
        self.summary = RunSummary(
            "wf-1",
            "r1",
            "t_play",
            "running",
            rows_done=104,
            rows_total=ROWS,
            credits=3.0,
            run_refs=[RUN],
            running=False,
            providers={"mailfox": {"requests": 29, "charged": 26, "credits": 26.5}},
        )

    async def list_runs(self, limit: int) -> list[RunSummary]:
        return [self.summary]

    async def run(self, workflow_id: str) -> RunSummary:
        if workflow_id != "wf-1":
            raise PlaylineError(f"no run with id {workflow_id!r}")
        return self.summary

    async def act(self, workflow_id: str, action: str, amount: float | None) -> str:
        self.acted.append((workflow_id, action, amount))
        if action == "resume":
            raise PlaylineError("resume refused: the run is not paused")
        return f"paused {workflow_id}"

    async def budget(self, run: RunSummary) -> float | None:
        return None

    async def export(self, workflow_id: str, path: Path, choice: ExportChoice) -> int:
        path.write_text("id\nL0000\n")
        return 1

    async def estimate(self, run: RunSummary) -> RunEstimate | None:
        return self.estimated


@pytest.fixture
async def sheet(tmp_path: Path) -> AsyncIterator[SheetStore]:
    store = SheetLedger.in_file(tmp_path / "sheet.db")
    await fill(store)
    yield store
    await store.close()


def sheet_reader(path: Path) -> Callable[[], contextlib.AbstractAsyncContextManager[SheetStore]]:
    """How the view opens the store: read-only, a reader per request, as ``playline ui`` does."""

    @contextlib.asynccontextmanager
    async def open_sheet() -> AsyncIterator[SheetStore]:
        reader = SheetLedger.in_file(path, create=False)
        try:
            yield reader
        finally:
            await reader.close()

    return open_sheet


@pytest.fixture
def client(tmp_path: Path, sheet: SheetStore) -> Iterator[tuple[TestClient, Desk]]:
    desk = Desk()
    app = webview_app(
        desk, sheet_reader(tmp_path / "sheet.db"), token="s3cret", hosts=["testserver"]
    )
    with TestClient(app, client=LOCAL) as test_client:
        yield test_client, desk


def seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'data-seq="(\d+)"', html)]


def test_cell_outcomes_follow_the_provenance() -> None:
    assert cell_outcome("ok", provenance_of(0), "x") == "hit"
    assert cell_outcome("ok", provenance_of(1), None) == "no_match"
    assert cell_outcome("error", provenance_of(2), None) == "failed"
    assert cell_outcome("error", provenance_of(3), None) == "skipped_budget"
    assert cell_outcome("pending", None, None) == "not_run"
    assert cell_outcome("ok", {"miss": "skipped_input"}, None) == "skipped"


def test_a_rows_status_says_done_failed_skipped_not_started_or_held() -> None:
    def row(status: str, error: str | None = None) -> RunRow:
        return RunRow(0, "k", {}, status, error)  # type: ignore[arg-type]

    assert row_status(row("ok")) == ("done", "done")
    assert row_status(row("error", "ProviderError: 502")) == (
        "failed",
        "failed: ProviderError: 502",
    )
    assert row_status(row("error", "skipped_budget: cap")) == ("skipped", "skipped budget")
    assert row_status(row("pending")) == ("pending", "not started")
    assert row_status(row("pending"), held_for_budget=True) == ("held", "held at budget")


async def test_pages_filters_and_sorting_read_only_what_they_show(sheet: SheetStore) -> None:
    first = await read_page(sheet, RUN, SheetQuery(size=50))
    assert first is not None
    assert [r.seq for r in first.rows] == list(range(50))
    assert first.computed == ["email"] and first.matching == ROWS
    last = await read_page(sheet, RUN, SheetQuery(page=2, size=50))
    assert last is not None and [r.seq for r in last.rows] == list(range(100, ROWS))
    misses = await read_page(sheet, RUN, SheetQuery(outcome="no_match", size=10))
    assert misses is not None
    assert misses.matching == len(range(1, ROWS, 5))
    assert [r.seq for r in misses.rows] == list(range(1, 50, 5))
    named = await read_page(sheet, RUN, SheetQuery(text_column="name", text="NAME 3", size=500))
    assert named is not None and {r.seq for r in named.rows} == set(range(3, ROWS, 7))
    by_email = await read_page(sheet, RUN, SheetQuery(sort="email", descending=True, size=3))
    assert by_email is not None
    assert [r.seq for r in by_email.rows] == [95, 90, 85]  # text order, empty cells last
    assert await read_page(sheet, "nope", SheetQuery()) is None


async def test_charts_sum_spend_per_provider_and_each_waterfall_step(sheet: SheetStore) -> None:
    charts = await read_charts(sheet, RUN, budget=40.0)
    assert charts is not None
    totals = {line.provider: line.total for line in charts.lines}
    hits = len(range(0, ROWS, 5))
    assert totals == {"findly": hits * 1.0, "mailfox": hits * 1.0}
    assert charts.budget == 40.0 and charts.budget_y is not None
    far = await read_charts(sheet, RUN, budget=1000.0)
    assert far is not None and far.budget_y is None and far.top == hits * 1.0
    [funnel] = charts.funnels.values()
    assert [(s.tool, s.answered, s.calls, s.hits) for s in funnel] == [
        ("findly_email", 0, hits, 0),
        ("mailfox_email", hits, hits, hits),
    ]
    assert funnel[1].per_hit == 1.0


def test_the_sheet_page_filters_by_outcome_and_shows_a_waterfall(client: Any) -> None:
    http, _ = client
    page = http.get("/sheet", params={"id": "wf-1", "outcome": "no_match"})
    assert page.status_code == 200
    assert seqs(page.text) == list(range(1, ROWS, 5))
    assert f'<b id="matching">{len(range(1, ROWS, 5))}</b>' in page.text
    panel = http.get("/sheet", params={"id": "wf-1", "cell": "5.2"}).text
    steps = panel[panel.index('id="steps"') :]
    assert "findly_email" in steps and "no_match" in steps and "mailfox_email" in steps
    assert "≈" not in panel  # no prices reported: no money shown
    charts = http.get("/charts", params={"id": "wf-1"}).text
    assert "<polyline" in charts and "mailfox_email" in charts
    providers = charts[charts.index('id="providers"') : charts.index('id="funnels"')]
    assert re.search(r"<td>mailfox</td><td[^>]*>29</td><td[^>]*>26</td>", providers)
    assert ">26.5<" in providers and ">-<" in providers  # no saved figure: a dash
    runs = http.get("/").text
    assert "wf-1" in runs and "104/130" in runs


def test_a_typed_filter_stays_out_of_the_url(client: Any) -> None:
    http, _ = client
    headers = {"origin": "http://testserver"}
    found = http.post(
        "/filter", data={"id": "wf-1", "tcol": "id", "text": "L0042"}, headers=headers
    )
    assert found.status_code == 200
    assert "L0042" not in str(found.url)
    assert seqs(found.text) == [42]


def test_actions_answer_with_the_desks_line_and_need_the_same_origin(client: Any) -> None:
    http, desk = client
    page = http.post(
        "/act", data={"id": "wf-1", "action": "pause"}, headers={"origin": "http://testserver"}
    )
    assert "paused wf-1" in page.text
    refused = http.post(
        "/act", data={"id": "wf-1", "action": "resume"}, headers={"origin": "http://testserver"}
    )
    assert "resume refused: the run is not paused" in refused.text
    cross = http.post(
        "/act", data={"id": "wf-1", "action": "pause"}, headers={"origin": "http://evil.example"}
    )
    assert cross.status_code == 403
    assert desk.acted == [("wf-1", "pause", None), ("wf-1", "resume", None)]


def test_a_request_from_another_address_needs_the_token(client: Any) -> None:
    http, _ = client
    app = http.app
    with TestClient(app, client=("10.1.2.3", 5000)) as remote:
        assert remote.get("/").status_code == 401
        assert remote.get("/sheet", params={"id": "wf-1"}).status_code == 401
        entered = remote.get("/", params={"token": "s3cret"})
        assert entered.status_code == 200 and "token" not in str(entered.url)
        assert remote.get("/sheet", params={"id": "wf-1"}).status_code == 200
    with TestClient(app, client=("10.1.2.3", 5000)) as other:
        assert other.get("/", params={"token": "wrong"}).status_code == 401
        bearer = other.get("/", headers={"authorization": "Bearer s3cret"})
        assert bearer.status_code == 200
    assert http.get("/", headers={"host": "rebound.example"}).status_code == 400


def test_playline_ui_refuses_another_address_without_a_token(capsys: Any) -> None:
    from playline.cli import main

    assert main(["ui", "--host", "0.0.0.0"]) == 1
    assert "refusing to serve the sheets on 0.0.0.0 without a token" in capsys.readouterr().err


def test_a_runs_sheet_link_names_its_id_only(client: Any) -> None:
    http, _ = client
    link = sheet_link("http://127.0.0.1:8234/", "wf-1")
    assert link == "http://127.0.0.1:8234/sheet?id=wf-1"
    assert http.get(link.removeprefix("http://127.0.0.1:8234")).status_code == 200


def test_binding_beyond_loopback_needs_a_token() -> None:
    check_exposure("127.0.0.1", None)
    check_exposure("0.0.0.0", "t")
    with pytest.raises(PlaylineError, match="without a token"):
        check_exposure("0.0.0.0", None)


async def test_a_play_started_with_the_views_address_links_its_sheet_in_its_details() -> None:
    import playline
    from playline.demo.enrich_leads import EnrichLeadsInput, enrich_leads

    started: dict[str, Any] = {}

    class Client:
        async def start_workflow(self, *args: Any, **kwargs: Any) -> None:
            started.update(kwargs)

    await playline.start_play(
        Client(),  # type: ignore[arg-type]
        enrich_leads,
        EnrichLeadsInput(csv_path="/x.csv"),
        id="leads-1",
        sheets_url="http://127.0.0.1:8234",
    )
    assert (
        "- sheet: [its rows, cell by cell](http://127.0.0.1:8234/sheet?id=leads-1)"
        in (started["static_details"])
    )
    await playline.start_play(Client(), enrich_leads, EnrichLeadsInput(csv_path="/x.csv"))  # type: ignore[arg-type]
    assert "sheet" not in started["static_details"]
