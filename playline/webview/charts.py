"""The run's pictures, drawn on the server as inline SVG: no chart script ships.

* **Spend over time per provider**: each paid cell's credits at its ``fetched_at``,
  summed per provider into :data:`BUCKETS` time buckets and drawn cumulative, with
  the run's cap as a dashed line when the desk knows it (named beside the chart when it
  is more than twice the spend, which it would flatten).
* **Each waterfall's funnel**: per step, the rows it answered, the calls it made,
  its hits and credits, and credits per hit (the figures to order a waterfall by,
  as :class:`~playline.calls.provenance.SpendTally` counts them).

* **Per provider, calls per second, the 429s and the rate in force** over the run
  (:mod:`.pace_chart`), from the pace samples the workers wrote.

The first two are summed by the store (``run_figures``: SQL over the facts it records with
each row). A run whose rows were written before the store recorded them is read in
store pages instead (``read_provenance``): memory holds a page and the buckets, never
the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playline.calls.provenance import SpendTally
from playline.spend import NO_STEP
from playline.stores.sheet import RunFigures, SheetStore
from playline.stores.sheet_pace import SAMPLE_S
from playline.webview.pace_chart import PaceChart, draw_pace

__all__ = ["BUCKETS", "Charts", "read_charts"]

#: Time buckets of the spend chart.
BUCKETS = 60
#: Rows of provenance read per store page.
PAGE = 5000
#: The drawing's size in SVG units (it scales with the page).
WIDTH, HEIGHT, PAD = 640, 220, 56
#: One colour per provider, in order (colour-blind safe).
COLOURS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442")


@dataclass
class Line:
    provider: str
    colour: str
    points: str  # SVG polyline points
    total: float


@dataclass
class FunnelStep:
    tool: str
    answered: int
    calls: int
    hits: int
    credits: float
    width: float  # of the bar, SVG units

    @property
    def per_hit(self) -> float | None:
        return self.credits / self.hits if self.hits else None


@dataclass
class Charts:
    lines: list[Line] = field(default_factory=list)
    #: y of the budget's dashed line, and the budget, when known and in range
    budget_y: float | None = None
    budget: float | None = None
    top: float = 0.0
    start: float | None = None
    end: float | None = None
    funnels: dict[str, list[FunnelStep]] = field(default_factory=dict)
    #: rows no step answered, per waterfall column
    unanswered: dict[str, int] = field(default_factory=dict)
    #: per provider, calls per second, 429s and the rate in force over the run
    pace: list[PaceChart] = field(default_factory=list)
    size: tuple[int, int, int] = (WIDTH, HEIGHT, PAD)


async def read_charts(
    sheet: SheetStore, run_ref: str, budget: float | None = None
) -> Charts | None:
    """The charts of one dataset run (``None``: the store has no such run)."""
    info = await sheet.run_info(run_ref)
    if info is None:
        return None
    charts = await _spend_and_funnels(sheet, run_ref, info.admitted, budget)
    series = await sheet.pace_series(run_ref, BUCKETS, SAMPLE_S)
    if series is not None:
        charts.pace = draw_pace(series, COLOURS)
    return charts


async def _spend_and_funnels(
    sheet: SheetStore, run_ref: str, admitted: int, budget: float | None
) -> Charts:
    figures = await sheet.run_figures(run_ref, BUCKETS)
    if figures is not None:
        return _from_figures(figures, budget)
    tally = SpendTally()
    # First pass: the time span (and the tally); second: the buckets. Two reads of the
    # provenance keep memory flat where one would hold every paid cell.
    first: float | None = None
    last: float | None = None
    for start in range(0, admitted, PAGE):
        for _, provenance in await sheet.read_provenance(run_ref, start, start + PAGE):
            tally.add_row(provenance)
            for cell in provenance.values():
                at = cell.get("fetched_at")
                if cell.get("by_provider") and at is not None:
                    first = at if first is None else min(first, at)
                    last = at if last is None else max(last, at)
    charts = Charts(start=first, end=last)
    if first is not None and last is not None:
        span = max(last - first, 1e-9)
        buckets: dict[str, list[float]] = {}
        for start in range(0, admitted, PAGE):
            for _, provenance in await sheet.read_provenance(run_ref, start, start + PAGE):
                for cell in provenance.values():
                    at = cell.get("fetched_at")
                    if at is None:
                        continue
                    slot = min(BUCKETS - 1, int((at - first) / span * BUCKETS))
                    for provider, credits in (cell.get("by_provider") or {}).items():
                        buckets.setdefault(provider, [0.0] * BUCKETS)[slot] += float(credits)
        _draw_lines(charts, buckets, budget)
    _funnels(charts, tally)
    return charts


def _from_figures(figures: RunFigures, budget: float | None) -> Charts:
    charts = Charts(start=figures.start, end=figures.end)
    if figures.start is not None:
        buckets: dict[str, list[float]] = {}
        for point in figures.spend:
            buckets.setdefault(point.provider, [0.0] * BUCKETS)[point.bucket] += point.credits
        _draw_lines(charts, buckets, budget)
    inner = WIDTH - 2 * PAD - 200
    for column, steps in figures.steps.items():
        rows = max(1, sum(s.answered for s in steps) + figures.unanswered.get(column, 0))
        charts.funnels[column] = [
            FunnelStep(s.tool, s.answered, s.calls, s.hits, s.credits, inner * s.answered / rows)
            for s in steps
        ]
        charts.unanswered[column] = figures.unanswered.get(column, 0)
    return charts


def _draw_lines(charts: Charts, buckets: dict[str, list[float]], budget: float | None) -> None:
    totals = {p: _cumulative(v) for p, v in sorted(buckets.items())}
    spent = max([v[-1] for v in totals.values()] + [1e-9])
    # A cap far above the spend would flatten every line: drawn only when near.
    near = budget is not None and budget <= 2 * spent
    top = max(spent, budget if near and budget is not None else 0.0)
    charts.top = top
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    for i, (provider, values) in enumerate(totals.items()):
        points: list[tuple[float, float]] = [(float(PAD), float(HEIGHT - PAD))]
        for slot, value in enumerate(values):
            x = PAD + inner_w * (slot + 1) / BUCKETS
            points.append((x, HEIGHT - PAD - inner_h * value / top))
        charts.lines.append(
            Line(
                provider,
                COLOURS[i % len(COLOURS)],
                " ".join(f"{x:.1f},{y:.1f}" for x, y in points),
                values[-1],
            )
        )
    charts.budget = budget
    if near and budget is not None:
        charts.budget_y = HEIGHT - PAD - inner_h * budget / top


def _cumulative(values: list[float]) -> list[float]:
    out, total = [], 0.0
    for value in values:
        total += value
        out.append(total)
    return out


def _funnels(charts: Charts, tally: SpendTally) -> None:
    inner = WIDTH - 2 * PAD - 200
    for column, tried in sorted(tally.tried.items()):
        answered = tally.steps.get(column, {})
        rows = max(1, sum(answered.values()))
        steps = []
        for tool, (calls, hits, credits) in tried.items():
            count = int(answered.get(tool, 0))
            steps.append(
                FunnelStep(tool, count, int(calls), int(hits), float(credits), inner * count / rows)
            )
        charts.funnels[column] = steps
        charts.unanswered[column] = int(answered.get(NO_STEP, 0))
