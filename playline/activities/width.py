"""The dispatch-width local activity: how wide a dataset run dispatches right now.

A local activity, so the governor's answer is recorded in the workflow's history
and a replay sees the same width.
"""

from __future__ import annotations

import os

from temporalio import activity

from playline.contract import MAX_CHUNK_ROWS, ProviderPace, RunOptions, Width, WidthInput
from playline.pacing.pacer import Pacer
from playline.services import ServicesHolder

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
    """
    if options.integration_mode == "fixture" and not options.enforce_fixture_pacing:
        return fixture_width(options)
    rows = sum(pacer.suggested_parallelism(p) for p in providers) or DEFAULT_ROW_WIDTH
    per_chunk = max(1, min(options.row_concurrency or rows, options.chunk_size or MAX_CHUNK_ROWS))
    chunks = options.max_chunks_in_flight or min(MAX_CHUNKS_IN_FLIGHT, -(-rows // per_chunk) + 2)
    return Width(chunks_in_flight=max(1, chunks), row_concurrency=per_chunk)


class WidthActivities:
    """The governor's current dispatch width, for ``playline.DatasetRun``."""

    def __init__(self, holder: ServicesHolder) -> None:
        self._holder = holder

    @activity.defn(name="playline.suggest_width")
    async def suggest_width(self, input: WidthInput) -> Width:
        """The governor's current dispatch width (a local activity: its answer is recorded),
        with each provider's pace for the run's status."""
        governor = self._holder.services.governor
        width = dispatch_width(governor, input.providers, input.options)
        width.paces = provider_paces(governor, input.providers)
        return width


def provider_paces(pacer: Pacer, providers: list[str]) -> list[ProviderPace]:
    """The rate in force and any ``Retry-After`` pause of each provider, from the pacer."""
    snapshot = pacer.snapshot()
    paces = []
    for provider in providers:
        known = snapshot.get(provider, {})
        paused = known.get("paused_until")
        paces.append(
            ProviderPace(
                provider=provider,
                rate_rps=pacer.rate_in_force(provider),
                paused_s=round(float(paused), 1) if paused else None,
            )
        )
    return paces
