"""Each worker's samples of a run's pace, for the sheet view's chart (see
:mod:`playline.stores.sheet_pace`).

One :class:`PaceRecorder` per worker process (``Services.pace``). A chunk activity
records through it while it runs (:meth:`PaceRecorder.recording`): its tool calls'
outcomes, which the call path reports to the attempt's metrics anyway, are also
counted per run and provider (:class:`PaceMetrics`), a counter bump on the row path
and nothing more. Every :data:`SAMPLE_S` seconds one task of the worker turns the
counts of every run active on it into samples (one per run and provider touched, the
governor's rate in force and how it was learnt from one ``snapshot()``) and appends
them to the sheet store in **one** write; the last chunk of a run on the worker
writes what is left as it ends. So a worker writes once per few seconds whatever its
rows, chunks and runs, and nothing on the row path waits for the store.

A chart is not worth a row: a failed sample write is logged and its counts dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from playline.pacing.pacer import Pacer
from playline.stores.sheet import SheetStore
from playline.stores.sheet_pace import SAMPLE_S, PaceSample
from playline.telemetry import ProviderMetrics

__all__ = ["SAMPLE_S", "PaceMetrics", "PaceRecorder", "worker_name"]

logger = logging.getLogger("playline.pace")

#: The longest a sample write is waited for (then its samples are dropped).
WRITE_TIMEOUT_S = 5.0
#: Call outcomes that sent nothing to the provider.
NOT_SENT = frozenset({"parked", "fixture"})


def worker_name() -> str:
    """This worker among a fleet's: host, process id and a few random letters (a
    process may run several workers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class _RunCounts:
    """One run's calls on this worker since its last sample."""

    since: float
    calls: Counter[str] = field(default_factory=Counter)
    limited: Counter[str] = field(default_factory=Counter)
    #: providers the run sent to on this worker: sampled while it runs here, so the
    #: rate in force is drawn through a pause with no calls
    providers: set[str] = field(default_factory=set)
    active: int = 0


class PaceMetrics(ProviderMetrics):
    """An attempt's metrics that also count its calls and 429s for the run's pace."""

    def __init__(self, counts: _RunCounts) -> None:
        super().__init__()
        self._counts = counts

    def call(self, provider: str, tool: str, outcome: str, latency_s: float | None = None) -> None:
        super().call(provider, tool, outcome, latency_s)
        if outcome in NOT_SENT:
            return
        counts = self._counts
        counts.providers.add(provider)
        counts.calls[provider] += 1
        if outcome == "rate_limited":
            counts.limited[provider] += 1


class PaceRecorder:
    """Samples the pace of the runs active on this worker into the sheet store.

    Args:
        sheet: where samples go.
        governor: the worker's, for the rate in force and how it was learnt.
        every_s: seconds between samples.
        worker: this worker's name in the samples (default :func:`worker_name`).
        clock: Unix seconds.
    """

    def __init__(
        self,
        sheet: SheetStore,
        governor: Pacer,
        *,
        every_s: float = SAMPLE_S,
        worker: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sheet = sheet
        self._governor = governor
        self.every_s = every_s
        self.worker = worker or worker_name()
        self._clock = clock
        self._runs: dict[str, _RunCounts] = {}
        self._task: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def recording(self, run_ref: str) -> AsyncIterator[PaceMetrics]:
        """The metrics of one chunk attempt of ``run_ref``, counted into the run's pace
        while the block runs; the run's last chunk here writes its remainder."""
        counts = self._runs.get(run_ref)
        if counts is None:
            counts = self._runs[run_ref] = _RunCounts(since=self._clock())
        counts.active += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="playline-pace-samples")
        try:
            yield PaceMetrics(counts)
        finally:
            counts.active -= 1
            if counts.active == 0:
                await asyncio.shield(self._write([run_ref], ending=True))
            if not self._runs and self._task is not None:
                self._task.cancel()
                self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self._write(list(self._runs))

    async def _write(self, run_refs: list[str], *, ending: bool = False) -> None:
        """One write of the samples of ``run_refs`` since their last (``ending``: the
        run has no chunk here any more, its counts go)."""
        async with self._writing:
            now = self._clock()
            limits = self._limits()
            samples: list[PaceSample] = []
            for run_ref in run_refs:
                counts = self._runs.get(run_ref)
                if counts is None:
                    continue
                if ending and counts.active == 0:
                    del self._runs[run_ref]
                for provider in sorted(counts.providers):
                    rate, source = limits.get(provider, (None, None))
                    samples.append(
                        PaceSample(
                            run_ref,
                            self.worker,
                            now,
                            max(0.0, now - counts.since),
                            provider,
                            counts.calls.pop(provider, 0),
                            counts.limited.pop(provider, 0),
                            rate,
                            source,
                        )
                    )
                counts.since = now
            if not samples:
                return
            try:
                # Never long: a chunk's end waits for its run's last samples.
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await self._sheet.write_pace(samples)
            except Exception as err:  # a timeout too: a chart is not worth a row
                logger.warning("pace samples not written (%d dropped): %s", len(samples), err)

    def _limits(self) -> dict[str, tuple[float | None, str | None]]:
        """Per pacing key, the rate in force and how it was learnt, now."""
        try:
            snapshot = self._governor.snapshot()
        except Exception as err:  # never fail a sample over a figure
            logger.info("governor snapshot unavailable: %s", err)
            return {}
        limits: dict[str, tuple[float | None, str | None]] = {}
        for key, state in snapshot.items():
            rate = state.get("rate_rps")
            source = state.get("limit_source")
            finite = isinstance(rate, int | float) and math.isfinite(rate)
            limits[key] = (
                float(rate) if finite and rate is not None else None,
                str(source) if source is not None else None,
            )
        return limits
