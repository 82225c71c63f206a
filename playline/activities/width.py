"""The dispatch-width local activity: how wide a dataset run dispatches right now.

A local activity, so the governor's answer is recorded in the workflow's history
and a replay sees the same width.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from playline import resolvers
from playline.calls.catalog import Catalog
from playline.contract import (
    MAX_CHUNK_ROWS,
    ChunkInput,
    ColumnSpec,
    ProviderPace,
    RunOptions,
    Width,
    WidthInput,
)
from playline.errors import PlaylineError
from playline.pacing.fair import SHARE, Share
from playline.pacing.gate import WORK_STARTED, ResizableGate
from playline.pacing.pacer import Pacer
from playline.services import HolderActivities

#: Chunks a dataset run keeps in flight at most when the options leave it to the governor.
MAX_CHUNKS_IN_FLIGHT = 16
#: Rows in flight when no declared tool tells which providers a run calls.
DEFAULT_ROW_WIDTH = 8


def fixture_width(options: RunOptions, cpus: int | None = None) -> Width:
    """Fixture mode's width: the CPU's, not the providers' (no provider is called).

    A fixture answer costs CPU and a receipt write, never a provider's budget, so
    every row of a chunk runs at once and one chunk per core (plus one, to
    overlap the stores' thread hops) is in flight. Explicit options still win.
    """
    cores = cpus or os.cpu_count() or 1
    size = options.chunk_size or MAX_CHUNK_ROWS
    per_chunk = max(1, min(options.row_concurrency or size, size))
    chunks = options.max_chunks_in_flight or min(MAX_CHUNKS_IN_FLIGHT, cores + 1)
    return Width(chunks_in_flight=max(1, chunks), row_concurrency=per_chunk)


def dispatch_width(pacer: Pacer, providers: list[str], options: RunOptions) -> Width:
    """How wide a run dispatches: from the fixture path in fixture mode, else the governor.

    Fixture mode takes :func:`fixture_width` unless the run enforces pacing
    (``enforce_fixture_pacing``: production parity, the live width). Live mode
    takes Little's law from the governor: rows call their columns' tools one
    after another, so keeping ``sum of the providers' suggested widths`` rows in
    flight keeps every provider busy without queueing a burst at the governor.
    Two extra chunks overlap the next chunks' start with the tails of chunks
    held open by a straggler (a row waiting out a timeout or a retry).

    ``rows_in_flight`` carries that sum: chunks sized by time can be smaller than
    ``row_concurrency`` (a slow provider's are), and the dataset run then keeps more
    of them in flight (:func:`~playline.workflows.chunk_sizing.chunks_to_fill`) so
    the rows in flight are never fewer than the providers can take.
    """
    if options.integration_mode == "fixture" and not options.enforce_fixture_pacing:
        return fixture_width(options)
    rows = sum(pacer.suggested_parallelism(p) for p in providers) or DEFAULT_ROW_WIDTH
    per_chunk = max(1, min(options.row_concurrency or rows, options.chunk_size or MAX_CHUNK_ROWS))
    chunks = options.max_chunks_in_flight or min(MAX_CHUNKS_IN_FLIGHT, -(-rows // per_chunk) + 2)
    return Width(
        chunks_in_flight=max(1, chunks),
        row_concurrency=per_chunk,
        rows_in_flight=None if options.max_chunks_in_flight else rows,
    )


def column_providers(catalog: Catalog, columns: Sequence[ColumnSpec]) -> list[str]:
    """The providers the columns' resolvers declare tools of (as ``prepare_run`` finds them)."""
    found: set[str] = set()
    for column in columns:
        with contextlib.suppress(PlaylineError, KeyError):
            for tool_id in resolvers.declared_tools(column.resolver):
                found.add(catalog.tool(tool_id).provider)
    return sorted(found)


def share_of(options: RunOptions, fallback: str) -> Share:
    """Who a run's provider calls count for: its fairness key (the play run unless it
    names a team or customer; ``fallback`` for runs started before plays named one),
    weight and priority class."""
    return Share(
        key=options.fairness_key or fallback,
        weight=options.fairness_weight,
        priority=options.priority,
    )


class LiveRowGate:
    """How many of a chunk's rows run at once: ``async with gate:`` around each row.

    ``ChunkInput.row_concurrency`` is the governor's width when the workflow last asked
    (a local activity, every few chunks), and a run's first width is from a guess of
    the providers' latency. A chunk of a slow provider outlives both: while it runs,
    the gate follows the governor's current width, never below what the workflow said,
    so a provider answering in seconds gets the rows it can take from its first chunk
    on (rows waiting at the governor hold only a lease). Options that pin the width
    (``row_concurrency``), fixture mode and estimates keep the workflow's number.
    """

    def __init__(self, pacer: Pacer, catalog: Catalog, input: ChunkInput) -> None:
        options = input.options
        self._started = time.monotonic()
        self._share = share_of(options, input.run_ref)
        self._given = max(1, input.row_concurrency)
        self._gate = ResizableGate(self._given)
        self._options = options
        follows = options.row_concurrency == 0 and not options.estimate
        if options.integration_mode == "fixture" and not options.enforce_fixture_pacing:
            follows = False
        self._pacer = pacer if follows else None
        self._providers = column_providers(catalog, input.columns) if follows else []

    @property
    def limit(self) -> int:
        return self._gate.limit

    async def __aenter__(self) -> None:
        # The row's calls belong to this chunk: at a provider's full gate the rows of
        # older chunks go first, so chunks finish in turn (see WORK_STARTED).
        WORK_STARTED.set(self._started)
        # ...and they count for the run's fairness key, weight and class.
        SHARE.set(self._share)
        self.follow()
        await self._gate.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._gate.release()
        self.follow()

    def follow(self) -> None:
        """Resize to the governor's width now (never below the workflow's)."""
        if self._pacer is None or not self._providers:
            return
        live = dispatch_width(self._pacer, self._providers, self._options).row_concurrency
        wanted = max(self._given, live)
        if wanted != self._gate.limit:
            self._gate.resize(wanted)


class WidthActivities(HolderActivities):
    """The governor's current dispatch width, for ``playline.DatasetRun``."""

    @activity.defn(name="playline.suggest_width")
    async def suggest_width(self, input: WidthInput) -> Width:
        """The governor's current dispatch width (a local activity: its answer is recorded),
        with each provider's pace for the run's status."""
        governor = self._holder.services.governor
        width = dispatch_width(governor, input.providers, input.options)
        width.paces = provider_paces(governor, input.providers, input.options.fairness_key)
        return width


def provider_paces(
    pacer: Pacer, providers: list[str], fairness_key: str | None = None
) -> list[ProviderPace]:
    """The rate in force and any ``Retry-After`` pause of each provider, from the pacer,
    and who shares it: the run's fairness key's recent rate and part against every
    key's (the governor's fair order, see ``playline.pacing.fair``)."""
    snapshot = pacer.snapshot()
    paces = []
    for provider in providers:
        known = snapshot.get(provider, {})
        paused = known.get("paused_until")
        shares: dict[str, Any] = known.get("shares") or {}
        mine = shares.get(fairness_key or "") if fairness_key else None
        paces.append(
            ProviderPace(
                provider=provider,
                rate_rps=pacer.rate_in_force(provider),
                paused_s=round(float(paused), 1) if paused else None,
                share_rps=round(float(mine["rate_rps"]), 2) if mine else None,
                share_part=round(float(mine["part"]), 3) if mine else None,
                total_rps=round(sum(float(s["rate_rps"]) for s in shares.values()), 2)
                if shares
                else None,
                sharing=len(shares) if shares else None,
                limit_source=known.get("limit_source"),
                limit_since=_iso(known.get("limit_since")),
            )
        )
    return paces


def _iso(unix_s: float | None) -> str | None:
    """Unix seconds as ISO 8601 UTC, to the second (``None`` stays ``None``)."""
    if unix_s is None:
        return None
    return datetime.fromtimestamp(float(unix_s), UTC).isoformat(timespec="seconds")
