"""The dispatch-width local activity: how wide a dataset run dispatches right now.

A local activity, so the governor's answer is recorded in the workflow's history
and a replay sees the same width.
"""

from __future__ import annotations

from temporalio import activity

from playline.contract import MAX_CHUNK_ROWS, ProviderPace, RunOptions, Width, WidthInput
from playline.pacing.pacer import Pacer
from playline.services import ServicesHolder

#: Chunks a dataset run keeps in flight at most when the options leave it to the governor.
MAX_CHUNKS_IN_FLIGHT = 16
#: Rows in flight when no declared tool tells which providers a run calls.
DEFAULT_ROW_WIDTH = 8


def dispatch_width(pacer: Pacer, providers: list[str], options: RunOptions) -> Width:
    """Little's-law width from the governor, split into chunks and rows per chunk.

    Rows call their columns' tools one after another, so keeping ``sum of the
    providers' suggested widths`` rows in flight keeps every provider busy
    without queueing a burst at the governor. One extra chunk overlaps the next
    chunk's start with the previous chunk's tail.
    """
    rows = sum(pacer.suggested_parallelism(p) for p in providers) or DEFAULT_ROW_WIDTH
    per_chunk = max(1, min(options.row_concurrency or rows, options.chunk_size or MAX_CHUNK_ROWS))
    chunks = options.max_chunks_in_flight or min(MAX_CHUNKS_IN_FLIGHT, -(-rows // per_chunk) + 1)
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
