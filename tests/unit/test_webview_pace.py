"""The run's pace (calls/s, 429s, rate in force) and its estimate beside its spend:
bucketing, the store's sums over workers, the recorder, the drawings and the page.

The store is the real ``SheetLedger`` on SQLite; the governor is a stand-in that
answers ``snapshot()`` (the recorder reads nothing else of it).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from playline.pace_recorder import PaceRecorder
from playline.stores.sheet import SheetStore
from playline.stores.sheet_ledger import SheetLedger
from playline.stores.sheet_pace import PacePoint, PaceSample, PaceSeries, plan_buckets
from playline.webview import webview_app
from playline.webview.charts import COLOURS
from playline.webview.desk import ProviderEstimate, RunEstimate
from playline.webview.estimate_chart import BAR_WIDTH, beside
from playline.webview.pace_chart import (
    PACE_BOTTOM,
    PACE_HEIGHT,
    PACE_PAD,
    PACE_TOP,
    PACE_WIDTH,
    draw_pace,
)
from tests.unit.test_webview import LOCAL, RUN, Desk, fill, sheet_reader


def sample(worker: str, at: float, provider: str, calls: int, limited: int = 0, **kw: Any) -> Any:
    return PaceSample(
        RUN,
        worker,
        at,
        kw.get("span", 2.0),
        provider,
        calls,
        limited,
        kw.get("rate", 10.0),
        kw.get("source", "catalog"),
    )


# ------------------------------------------------------------------ bucketing


@pytest.mark.parametrize(
    ("start", "end", "most", "least", "expected"),
    [
        (0.0, 600.0, 60, 2.0, (60, 10.0)),  # long run: the most buckets
        (0.0, 20.0, 60, 2.0, (10, 2.0)),  # short run: none narrower than a sample
        (5.0, 5.0, 60, 2.0, (1, 2.0)),  # one instant: one bucket
        (0.0, 3.0, 60, 2.0, (2, 2.0)),  # a partial last bucket counts
    ],
)
def test_buckets_are_never_narrower_than_a_sample(
    start: float, end: float, most: int, least: float, expected: tuple[int, float]
) -> None:
    assert plan_buckets(start, end, most, least) == expected


# ------------------------------------------------------------------ the store


@pytest.fixture
async def sheet(tmp_path: Path) -> AsyncIterator[SheetStore]:
    store = SheetLedger.in_file(tmp_path / "sheet.db")
    await fill(store)
    yield store
    await store.close()


async def test_the_store_sums_calls_and_429s_over_workers_per_bucket(sheet: SheetStore) -> None:
    """Two workers' samples in one bucket are summed; the rate in force of a bucket is
    its latest sample's, with how it was learnt."""
    assert await sheet.pace_series(RUN, 60, 2.0) is None
    await sheet.write_pace(
        [
            sample("w1", 102.0, "mailfox", 10, 1, rate=10.0, source="catalog"),
            sample("w2", 102.0, "mailfox", 6, 0, rate=10.0, source="catalog"),
            sample("w1", 104.0, "mailfox", 8, 2, rate=5.0, source="429 measurement"),
            sample("w2", 103.5, "mailfox", 4, 0, rate=10.0, source="catalog"),
            sample("w1", 104.0, "findly", 3),
            PaceSample("run-2", "w1", 104.0, 2.0, "mailfox", 99, 9, 1.0, "catalog"),
        ]
    )
    series = await sheet.pace_series(RUN, 60, 2.0)
    assert series is not None
    assert (series.start, series.width_s, series.count) == (100.0, 2.0, 2)
    points = {(p.provider, p.bucket): p for p in series.points}
    assert [(p.calls, p.limited) for p in (points["mailfox", 0], points["mailfox", 1])] == [
        (16, 1),
        (12, 2),
    ]
    assert (points["mailfox", 1].rate_rps, points["mailfox", 1].source) == (5.0, "429 measurement")
    assert points["findly", 1].calls == 3
    assert sum(p.calls for p in series.points) == 31  # the other run's samples stay out


# ------------------------------------------------------------------ the recorder


class Governor:
    """Answers ``snapshot()`` as the governor does (the keys the recorder reads)."""

    def __init__(self) -> None:
        self.state = {"mailfox": {"rate_rps": 4.0, "limit_source": "429 measurement"}}

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return self.state


async def test_the_recorder_counts_a_runs_calls_and_writes_when_its_chunks_end(
    sheet: SheetStore,
) -> None:
    clock = iter([100.0, 103.0, 106.0, 109.0])
    recorder = PaceRecorder(
        sheet, Governor(), every_s=3600.0, worker="w1", clock=lambda: next(clock)
    )  # type: ignore[arg-type]
    async with recorder.recording(RUN) as one, recorder.recording(RUN) as two:
        for outcome in ("ok", "ok", "rate_limited", "parked", "transient"):
            one.call("mailfox", "mailfox_email", outcome)
        two.call("mailfox", "mailfox_email", "ok")
        two.call("findly", "findly_email", "fixture")  # nothing sent
    series = await sheet.pace_series(RUN, 60, 2.0)
    assert series is not None
    assert [(p.provider, p.calls, p.limited, p.rate_rps, p.source) for p in series.points] == [
        ("mailfox", 5, 1, 4.0, "429 measurement")
    ]
    # Once written, its counts are gone: a later chunk of the run starts from zero.
    async with recorder.recording(RUN) as three:
        three.call("mailfox", "mailfox_email", "ok")
    series = await sheet.pace_series(RUN, 60, 2.0)
    assert series is not None and sum(p.calls for p in series.points) == 6


async def test_the_recorder_samples_a_running_chunk_every_few_seconds(sheet: SheetStore) -> None:
    """While a chunk runs, the recorder's own task writes what it counted (the chunk
    never waits for it), once per period for every run active on the worker."""
    recorder = PaceRecorder(sheet, Governor(), every_s=0.01, worker="w1")  # type: ignore[arg-type]
    async with recorder.recording(RUN) as metrics:
        for _ in range(3):
            metrics.call("mailfox", "mailfox_email", "ok")
        series = None
        for _ in range(1000):  # until the task has written (no time is asserted)
            series = await sheet.pace_series(RUN, 60, 2.0)
            if series is not None and sum(p.calls for p in series.points) == 3:
                break
            await asyncio.sleep(0.01)
        assert series is not None and sum(p.calls for p in series.points) == 3
        metrics.call("mailfox", "mailfox_email", "rate_limited")
    series = await sheet.pace_series(RUN, 60, 2.0)
    assert series is not None
    assert (sum(p.calls for p in series.points), sum(p.limited for p in series.points)) == (4, 1)
    assert recorder._task is None  # no run active: the task is gone


# ------------------------------------------------------------------ the drawings


def test_the_pace_chart_draws_calls_per_second_the_rate_as_steps_and_marks_429s() -> None:
    series = PaceSeries(
        start=0.0,
        width_s=2.0,
        count=4,
        points=[
            PacePoint("mailfox", 0, 20, 0, 10.0, "catalog"),
            PacePoint("mailfox", 1, 16, 3, 5.0, "429 measurement"),
            # bucket 2: no sample (the rate in force is held)
            PacePoint("mailfox", 3, 8, 0, 5.0, "429 measurement"),
        ],
    )
    [chart] = draw_pace(series, COLOURS)
    inner_w, inner_h = PACE_WIDTH - 2 * PACE_PAD, PACE_HEIGHT - PACE_TOP - PACE_BOTTOM
    assert chart.top == 10.0  # 20 calls in 2 s; the catalog's 10/s
    assert (chart.total_calls, chart.total_429s, chart.peak_rps) == (44, 3, 10.0)
    xs = [PACE_PAD + inner_w * (b + 0.5) / 4 for b in range(4)]
    ys = [PACE_HEIGHT - PACE_BOTTOM - inner_h * v / 10.0 for v in (10.0, 8.0, 0.0, 4.0)]
    assert chart.calls == " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))
    y10, y5 = PACE_TOP, PACE_HEIGHT - PACE_BOTTOM - inner_h / 2
    edges = [PACE_PAD + inner_w * b / 4 for b in range(5)]
    assert chart.rate == (
        f"M{edges[0]:.1f},{y10:.1f} H{edges[1]:.1f} V{y5:.1f} H{edges[2]:.1f}"
        f" H{edges[3]:.1f} H{edges[4]:.1f}"
    )
    assert [(m.x, m.count, m.at_s) for m in chart.marks] == [(xs[1], 3, 2.0)]
    assert [(x.source, x.rate_rps, x.at_s) for x in chart.learnt] == [
        ("catalog", 10.0, 0.0),
        ("429 measurement", 5.0, 2.0),
    ]


def test_the_estimate_sits_beside_the_spend_per_provider_on_one_scale() -> None:
    estimate = RunEstimate(
        "estimate-x",
        "2026-12-06 10:00:00 UTC",
        30,
        {"mailfox": ProviderEstimate(40.0, 20.0), "findly": ProviderEstimate(10.0, 5.0)},
        {"mailfox": {"credit_price": 0.01, "currency": "USD"}},
    )
    rows = beside(estimate, {"mailfox": {"credits": 25.0}, "newco": {"credits": 2.0}}, {})
    assert [(r.provider, r.worst, r.expected, r.spent) for r in rows] == [
        ("findly", 10.0, 5.0, 0.0),
        ("mailfox", 40.0, 20.0, 25.0),
        ("newco", 0.0, 0.0, 2.0),
    ]
    mailfox = rows[1]
    assert (mailfox.worst_w, mailfox.expected_w, mailfox.spent_w) == (
        BAR_WIDTH,
        BAR_WIDTH / 2,
        BAR_WIDTH * 25 / 40,
    )
    assert (mailfox.worst_money, mailfox.spent_money) == ("≈ 0.40 USD", "≈ 0.25 USD")
    assert rows[2].over and not mailfox.over
    assert rows[0].spent_money is None  # findly has no price


# ------------------------------------------------------------------ the page


async def test_the_charts_page_shows_the_pace_and_the_estimate(
    tmp_path: Path, sheet: SheetStore
) -> None:
    desk = Desk()
    app = webview_app(desk, sheet_reader(tmp_path / "sheet.db"), hosts=["testserver"])
    with TestClient(app, client=LOCAL) as http:
        page = http.get("/charts?id=wf-1").text
        assert "No provider call sampled" in page and "No estimate of this play" in page

        await sheet.write_pace(
            [
                sample("w1", 102.0, "mailfox", 10, 2, rate=10.0, source="catalog"),
                sample("w1", 104.0, "mailfox", 8, 0, rate=5.0, source="429 measurement"),
            ]
        )
        desk.estimated = RunEstimate(
            "estimate-t_play-1",
            "2026-12-06 10:00:00 UTC",
            130,
            {"mailfox": ProviderEstimate(30, 20)},
        )
        page = http.get("/charts?id=wf-1").text
    pace = page[page.index('id="pace"') : page.index('id="estimate"')]
    assert pace.count('class="mark-429"') == 1
    assert re.search(r'<b class="calls-total">18</b> calls sent, <b class="n429">2</b>', pace)
    assert "10/s from the catalog" in pace and "5/s from the 429 measurement" in pace
    table = page[page.index('<table class="estimate">') :]
    row = re.search(r'<tr data-provider="mailfox">(.*?)</tr>', table)
    assert row is not None
    assert re.findall(r'class="num (?:worst|expected|spent)">([^<]*)<', row.group(1)) == [
        "30",
        "20",
        "26.5",
    ]
