"""The sheet view's page time on a large run: the first page and later ones (issue 33).

    python bench/sheet_view.py [--rows 100000] [--repeats 5] [--store-url URL]

Writes a run of ``--rows`` rows straight into a sheet store (SQLite in a temporary
home by default, or ``--store-url``'s PostgreSQL) through the store's own methods
(``put_source``, ``prepare_run``, ``write_results`` in pages): an input column or
three, one computed waterfall column whose cells are hits, no matches, failures,
budget skips and, for the last tenth, rows not run yet. Then serves ``playline ui``'s
app in process (``webview_app`` over the store opened read-only, a desk that knows the
one run) and times whole HTTP requests, template rendering included: the first page,
a middle one, the last one, a cell's provenance panel on the last page, a filter by
outcome, a sort by a column, both at once (page 50, backwards) and the charts (which
the store answers in SQL: ``query_run_rows``, ``run_figures``). Prints a table and the
server process's peak RSS before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from starlette.testclient import TestClient  # noqa: E402

from playline.config import Settings  # noqa: E402
from playline.stores.backends import open_stores  # noqa: E402
from playline.stores.sheet import PAGE_ROWS, RowResult, SheetStore  # noqa: E402
from playline.webview import ExportChoice, RunSummary, webview_app  # noqa: E402

RUN = "bench-run"
STEPS = [
    {
        "tool": "mailfox_email",
        "provider": "mailfox",
        "outcome": "no_match",
        "reason": None,
        "credits": 0.0,
        "receipt": "paid",
    },
    {
        "tool": "prospectr_email",
        "provider": "prospectr",
        "outcome": "hit",
        "reason": None,
        "credits": 2.5,
        "receipt": "paid",
    },
]


def cell(i: int) -> tuple[str, dict[str, Any], str | None, Any]:
    """Row ``i``'s status, its email cell's provenance, the row's error, the value."""
    kind = i % 4
    if kind == 0:
        return (
            "ok",
            {
                "tool": "prospectr_email",
                "provider": "prospectr",
                "receipt": "paid",
                "credits": 2.5,
                "by_provider": {"prospectr": 2.5},
                "fetched_at": 1.8e9,
                "miss": None,
                "waterfall": "work_email",
                "steps": STEPS,
            },
            None,
            f"person{i}@example.com",
        )
    if kind == 1:
        return (
            "ok",
            {
                "tool": "mailfox_email",
                "provider": "mailfox",
                "credits": 0.0,
                "miss": "work_email: no step answered",
                "steps": STEPS[:1],
            },
            None,
            None,
        )
    if kind == 2:
        return (
            "error",
            {"tool": None, "credits": 0.0, "miss": "error: ProviderError"},
            "ProviderError: 502",
            None,
        )
    return (
        "error",
        {"tool": None, "credits": 0.0, "miss": "skipped_budget"},
        "skipped_budget: cap reached",
        None,
    )


async def fill(sheet: SheetStore, rows: int) -> None:
    columns = ["lead_id", "first_name", "last_name", "company_domain"]
    await sheet.put_source(
        "bench-src",
        columns,
        (
            (f"L{i:07d}", f"First{i % 97}", f"Last{i % 89}", f"co{i % 500}.example")
            for i in range(rows)
        ),
    )
    await sheet.prepare_run(
        RUN,
        source_id="bench-src",
        dataset="bench",
        key_fields=["lead_id"],
        mode="upsert",
        computed_columns=["email"],
    )
    done = rows - rows // 10  # the last tenth: not run yet
    for start in range(0, done, PAGE_ROWS):
        batch = []
        for i in range(start, min(done, start + PAGE_ROWS)):
            status, provenance, error, value = cell(i)
            batch.append(
                RowResult(i, f"L{i:07d}", {"email": value}, status, error, {"email": provenance})
            )
        await sheet.write_results(RUN, batch)


class Desk:
    def __init__(self, rows: int) -> None:
        self.summary = RunSummary(
            "bench", None, "bench", "running", rows_total=rows, run_refs=[RUN]
        )

    async def list_runs(self, limit: int) -> list[RunSummary]:
        return [self.summary]

    async def run(self, workflow_id: str) -> RunSummary:
        return self.summary

    async def act(self, workflow_id: str, action: str, amount: float | None) -> str:
        return "not in a bench"

    async def budget(self, run: RunSummary) -> float | None:
        return None

    async def export(self, workflow_id: str, path: Path, choice: ExportChoice) -> int:
        return 0


def timed(client: TestClient, params: dict[str, str], repeats: int) -> tuple[float, float]:
    times = []
    path = params.pop("path", "/sheet")
    for _ in range(repeats):
        began = time.perf_counter()
        response = client.get(path, params=params)
        times.append(time.perf_counter() - began)
        assert response.status_code == 200, response.text[:500]
    return statistics.median(times), max(times)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--store-url", help="a PostgreSQL URL (default: SQLite in a temp home)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-sheet-view-"))
    env = {"store": args.store_url} if args.store_url else {}
    settings = (
        Settings.from_env(home=home, store_url=args.store_url)
        if env
        else (Settings.from_env(home=home))
    )

    async def write() -> float:
        began = time.perf_counter()
        async with await open_stores(settings, create=True) as stores:
            await fill(stores.sheet, args.rows)
        return time.perf_counter() - began

    try:
        run_views(args, settings, home, asyncio.run(write()), env)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_views(
    args: argparse.Namespace, settings: Settings, home: Path, wrote: float, env: dict[str, Any]
) -> None:
    print(f"wrote {args.rows} rows in {wrote:.1f} s ({settings.store if env else home})")

    @contextlib.asynccontextmanager
    async def open_sheet() -> AsyncIterator[SheetStore]:
        async with await open_stores(settings, create=False) as stores:
            yield stores.sheet

    app = webview_app(Desk(args.rows), open_sheet)
    size = 50
    last = (args.rows - 1) // size
    views = {
        "first page": {"id": "bench"},
        "middle page": {"id": "bench", "page": str(last // 2)},
        "last page": {"id": "bench", "page": str(last)},
        "last page + provenance panel": {
            "id": "bench",
            "page": str(last - 3),
            "cell": f"{(last - 3) * size}.4",
        },
        "filter: no match": {"id": "bench", "outcome": "no_match", "ocol": "email"},
        "sort by last_name": {"id": "bench", "sort": "last_name"},
        "no match + sort desc, page 50": {
            "id": "bench",
            "outcome": "no_match",
            "ocol": "email",
            "sort": "last_name",
            "desc": "1",
            "page": "50",
        },
        "charts": {"path": "/charts", "id": "bench"},
    }
    before = peak_rss_mib()
    print(f"{'view':32} {'median s':>9} {'max s':>7}")
    with TestClient(app, client=("127.0.0.1", 1)) as client:
        for name, params in views.items():
            median, worst = timed(client, params, args.repeats)
            print(f"{name:32} {median:9.3f} {worst:7.3f}")
            if name == "last page + provenance panel":
                after_pages = peak_rss_mib()
    print(
        f"peak RSS: {before:.0f} MiB after writing, {after_pages:.0f} MiB after the "
        f"paged views, {peak_rss_mib():.0f} MiB after the filtered, sorted and chart views"
    )


if __name__ == "__main__":
    main()
