"""``playline.sync_dataset``: ``ctx.sync(...)``, a dataset run written back to a sink.

The same sync as ``playline sync`` (:mod:`playline.sinks.engine`), over the worker's
services: its governor (so a CRM's limits are shared with every other call of the
fleet's workers), its HTTP client, its receipt and sheet stores. A retried attempt
is safe: each batch is a receipted call, and the sync ledger says what is written.
"""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import activity
from temporalio.exceptions import ApplicationError

from playline.contract import SyncInput, SyncSummary
from playline.errors import PlaylineError
from playline.services import HolderActivities
from playline.sinks.open import find_sink, sync_mapping, sync_sink

#: How often the activity heartbeats while a sync runs (429s may be waited out), at
#: most: a third of the batch lease when that is shorter.
BEAT_S = 5.0


class SyncActivities(HolderActivities):
    @activity.defn(name="playline.sync_dataset")
    async def sync_dataset(self, input: SyncInput) -> SyncSummary:
        """Write the run's changed records to the sink; counts, or ``parked``."""
        services = self._holder.services
        try:
            spec = find_sink(services.catalog.sinks, input.sink)
            mapping = sync_mapping(
                input.sink,
                spec,
                extra_map=input.map,
                id_column=input.id_column,
                policies=input.policies,
            )
        except PlaylineError as err:
            raise ApplicationError(str(err), non_retryable=True) from None
        beat = asyncio.create_task(_beat(min(BEAT_S, input.lease_ttl_s / 3)))
        try:
            report = await sync_sink(
                input,
                spec,
                mapping,
                settings=services.settings,
                providers=services.catalog.providers,
                http=services.http,
                pacer=services.governor,
                stores=services,
            )
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        return report.summary()


async def _beat(every_s: float) -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(every_s)
