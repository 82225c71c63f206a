"""Per provider, over the run: calls per second, the 429s and the rate in force, as SVG.

Drawn from the run's pace samples summed by the store
(:class:`~playline.stores.sheet_pace.PaceSeries`: per provider and time bucket, every
worker's calls and 429s and the rate in force the bucket ended under). One small
chart per provider, each on its own scale (a provider paced at 2/s beside one at
200/s would be a flat line otherwise):

* the run's calls per second: a bucket's calls over its width, at its middle;
* the rate in force as a dashed step line (held over each bucket, a riser where it
  changed), with how it was learnt beside the chart, each change once;
* a red mark above each bucket in which the provider answered 429, its count in the
  mark's tooltip and summed under the chart.

Pure: a series in, figures and SVG coordinates out (the template writes the SVG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from playline.stores.sheet_pace import PaceSeries

__all__ = ["PACE_BOTTOM", "PACE_HEIGHT", "PACE_PAD", "PACE_TOP", "PaceChart", "draw_pace"]

#: A provider's chart, SVG units: its size, the side padding (the spend chart's: the
#: axes line up) and the room above (the 429 marks) and below (the time axis).
PACE_WIDTH, PACE_HEIGHT, PACE_PAD, PACE_TOP, PACE_BOTTOM = 640, 150, 56, 30, 20


@dataclass
class Mark:
    """429s in one bucket: where to draw the mark, how many, when (seconds in)."""

    x: float
    count: int
    at_s: float


@dataclass
class Learnt:
    """How the rate in force was learnt, from ``at_s`` seconds into the run."""

    at_s: float
    source: str
    rate_rps: float


@dataclass
class PaceChart:
    provider: str
    colour: str
    #: calls per second, a polyline's points
    calls: str
    #: the rate in force, a path (``M``/``H``/``V``); empty when never known
    rate: str
    marks: list[Mark] = field(default_factory=list)
    learnt: list[Learnt] = field(default_factory=list)
    #: the y axis' top, calls/s
    top: float = 0.0
    total_calls: int = 0
    total_429s: int = 0
    peak_rps: float = 0.0
    #: seconds per bucket, and the run's span drawn
    width_s: float = 0.0
    span_s: float = 0.0
    size: tuple[int, int, int, int, int] = (
        PACE_WIDTH,
        PACE_HEIGHT,
        PACE_PAD,
        PACE_TOP,
        PACE_BOTTOM,
    )


def draw_pace(series: PaceSeries, colours: tuple[str, ...]) -> list[PaceChart]:
    """One chart per provider of ``series``, in provider order."""
    by_provider: dict[str, dict[int, tuple[int, int, float | None, str | None]]] = {}
    for p in series.points:
        by_provider.setdefault(p.provider, {})[p.bucket] = (
            p.calls,
            p.limited,
            p.rate_rps,
            p.source,
        )
    charts = []
    for i, (provider, buckets) in enumerate(sorted(by_provider.items())):
        charts.append(_draw_one(provider, colours[i % len(colours)], buckets, series))
    return charts


def _draw_one(
    provider: str,
    colour: str,
    buckets: dict[int, tuple[int, int, float | None, str | None]],
    series: PaceSeries,
) -> PaceChart:
    count, width_s = series.count, series.width_s
    per_s = [buckets.get(b, (0, 0, None, None))[0] / width_s for b in range(count)]
    rates = _held_rates(buckets, count)
    top = max([*per_s, *(r for r in rates if r is not None), 1e-9])
    inner_w = PACE_WIDTH - 2 * PACE_PAD
    inner_h = PACE_HEIGHT - PACE_TOP - PACE_BOTTOM

    def x_at(slot: float) -> float:
        return PACE_PAD + inner_w * slot / count

    def y_at(value: float) -> float:
        return PACE_HEIGHT - PACE_BOTTOM - inner_h * value / top

    calls = " ".join(f"{x_at(b + 0.5):.1f},{y_at(v):.1f}" for b, v in enumerate(per_s))
    chart = PaceChart(
        provider,
        colour,
        calls,
        _step_path(rates, x_at, y_at),
        top=top,
        total_calls=sum(v[0] for v in buckets.values()),
        total_429s=sum(v[1] for v in buckets.values()),
        peak_rps=max(per_s, default=0.0),
        width_s=width_s,
        span_s=count * width_s,
    )
    for b in range(count):
        _, limited, rate, source = buckets.get(b, (0, 0, None, None))
        if limited:
            chart.marks.append(Mark(x_at(b + 0.5), limited, b * width_s))
        changed = not chart.learnt or chart.learnt[-1].source != source
        if source is not None and rate is not None and changed:
            chart.learnt.append(Learnt(b * width_s, source, rate))
    return chart


def _held_rates(
    buckets: dict[int, tuple[int, int, float | None, str | None]], count: int
) -> list[float | None]:
    """The rate in force per bucket, a bucket without a sample holding the one before
    (a limit stays in force until a sample says otherwise)."""
    out: list[float | None] = []
    held: float | None = None
    for b in range(count):
        rate = buckets.get(b, (0, 0, None, None))[2]
        if rate is not None:
            held = rate
        out.append(held)
    return out


def _step_path(
    rates: list[float | None], x_at: Callable[[float], float], y_at: Callable[[float], float]
) -> str:
    """``M x y H x V y H x ...``: each bucket's rate held across it, risers between."""
    parts: list[str] = []
    last: float | None = None
    for b, rate in enumerate(rates):
        if rate is None:
            last = None
            continue
        y = y_at(rate)
        if last is None:
            parts.append(f"M{x_at(b):.1f},{y:.1f}")
        elif rate != last:
            parts.append(f"V{y:.1f}")
        parts.append(f"H{x_at(b + 1):.1f}")
        last = rate
    return " ".join(parts)
