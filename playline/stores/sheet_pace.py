"""A run's pace over time, per provider: what its workers sent, the 429s, the rate in force.

The governor knows a provider's rate in force and how it was learnt only in memory,
and only now; a run's chart wants them over the run. So each worker, while chunks of
a run are active on it, appends a :class:`PaceSample` per provider every few seconds
(:mod:`playline.pace_recorder`): the calls this run sent to the provider and the 429s
it got back since the worker's previous sample, and the governor's rate in force for
the provider then, with how it was learnt (catalog, headers, 429 measurement, fleet
store...). Samples are keyed by worker: every worker of a fleet writes its own.

They live in the sheet store beside the run's rows (``playline_run_pace``, schema
version 7), one narrow row per sample, and are summed in SQL (:func:`read_series`):
per provider and time bucket the calls and 429s of every worker, and the rate in
force the latest sample of the bucket reported. A reader's memory holds buckets,
never samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from playline.db.conn import Conn

__all__ = [
    "CREATE_PACE",
    "INDEX_PACE",
    "SAMPLE_S",
    "PacePoint",
    "PaceSample",
    "PaceSeries",
    "plan_buckets",
    "read_series",
    "write_samples",
]

#: Seconds between a worker's samples (and the narrowest bucket a chart draws).
SAMPLE_S = 2.0

CREATE_PACE = (
    "CREATE TABLE IF NOT EXISTS playline_run_pace (run_ref {text} NOT NULL,"
    " worker {text} NOT NULL, at {real} NOT NULL, span {real} NOT NULL,"
    " provider {text} NOT NULL, calls {int} NOT NULL, limited {int} NOT NULL,"
    " rate {real}, source {text})"
)
INDEX_PACE = "CREATE INDEX IF NOT EXISTS playline_run_pace_run ON playline_run_pace (run_ref, at)"


@dataclass(frozen=True, slots=True)
class PaceSample:
    """One worker's calls to one provider for one run over ``(at - span_s, at]``."""

    run_ref: str
    worker: str
    at: float  # Unix seconds, the end of the span
    span_s: float
    provider: str
    calls: int  # requests sent (429s included)
    limited: int  # of them answered 429
    #: the governor's rate in force for the provider at ``at`` (calls/s), and how it
    #: was learnt (``None``: the worker's governor does not pace this provider)
    rate_rps: float | None
    source: str | None


@dataclass(frozen=True, slots=True)
class PacePoint:
    """One provider in one time bucket: every worker's calls and 429s summed, and the
    rate in force (and how learnt) its latest sample reported."""

    provider: str
    bucket: int
    calls: int
    limited: int
    rate_rps: float | None
    source: str | None


@dataclass(frozen=True, slots=True)
class PaceSeries:
    """A run's pace: ``count`` buckets of ``width_s`` seconds from ``start``."""

    start: float
    width_s: float
    count: int
    points: list[PacePoint]


def plan_buckets(start: float, end: float, most: int, least_s: float) -> tuple[int, float]:
    """How to cut ``start..end`` into buckets: ``(count, width_s)``.

    At most ``most`` buckets, none narrower than ``least_s`` (a worker samples every
    ``least_s`` seconds: a narrower bucket would hold a sample or nothing, a saw of
    spikes and zeros). A span of zero is one bucket.
    """
    span = max(0.0, end - start)
    width = max(span / max(1, most), least_s, 1e-9)
    count = max(1, min(most, math.ceil(span / width - 1e-9)))
    return count, width


def write_samples(conn: Conn, samples: Sequence[PaceSample]) -> None:
    """Append ``samples`` (one statement; inside a write)."""
    conn.many(
        "INSERT INTO playline_run_pace (run_ref, worker, at, span, provider, calls, limited,"
        " rate, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                s.run_ref,
                s.worker,
                s.at,
                s.span_s,
                s.provider,
                s.calls,
                s.limited,
                s.rate_rps,
                s.source,
            )
            for s in samples
        ],
    )


def read_series(conn: Conn, run_ref: str, most: int, least_s: float) -> PaceSeries | None:
    """The run's samples summed per provider and bucket (inside a read); ``None``
    when no worker sampled the run."""
    span = conn.one(
        "SELECT min(at - span), max(at) FROM playline_run_pace WHERE run_ref = ?", [run_ref]
    )
    if span is None or span[0] is None:
        return None
    start, end = float(span[0]), float(span[1])
    count, width = plan_buckets(start, end, most, least_s)
    # A sample belongs to the bucket its span ends in (its last instant: ``at`` itself
    # on a bucket's edge belongs to the bucket before).
    slot = conn.dialect.floor.format("(at - ? - 1e-9) / ?")
    sums: dict[tuple[str, int], list[int]] = {}
    for provider, bucket, calls, limited in conn.all(
        f"SELECT provider, {slot} AS b, sum(calls), sum(limited) FROM playline_run_pace"
        " WHERE run_ref = ? GROUP BY provider, b",
        [start, width, run_ref],
    ):
        key = (str(provider), _clamp(bucket, count))
        got = sums.setdefault(key, [0, 0])
        got[0] += int(calls or 0)
        got[1] += int(limited or 0)
    # The rate in force per bucket: the latest sample's (per source, the highest rate
    # and latest time; the latest wins), so a bucket shows the limit it ended under.
    rates: dict[tuple[str, int], tuple[float, float | None, str | None]] = {}
    for provider, bucket, source, rate, last in conn.all(
        f"SELECT provider, {slot} AS b, source, max(rate), max(at) FROM playline_run_pace"
        " WHERE run_ref = ? AND rate IS NOT NULL GROUP BY provider, b, source",
        [start, width, run_ref],
    ):
        key = (str(provider), _clamp(bucket, count))
        seen = rates.get(key)
        if seen is None or float(last) > seen[0]:
            rates[key] = (float(last), float(rate), None if source is None else str(source))
    points = []
    for key in sorted(sums.keys() | rates.keys()):
        calls, limited = sums.get(key, [0, 0])
        _, rate, source = rates.get(key, (0.0, None, None))
        points.append(PacePoint(key[0], key[1], calls, limited, rate, source))
    return PaceSeries(start, width, count, points)


def _clamp(bucket: Any, count: int) -> int:
    return min(count - 1, max(0, int(float(bucket))))
