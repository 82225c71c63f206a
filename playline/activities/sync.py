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
from playline.sinks.engine import sync_run
from playline.sinks.open import open_destination, sync_mapping
from playline.sinks.spec import HubSpotSinkSpec, SalesforceSinkSpec
from playline.stores.sync_ledger import open_sync_ledger

#: How often the activity heartbeats while a sync runs (429s may be waited out), at
#: most: a third of the batch lease when that is shorter.
BEAT_S = 5.0


class SyncActivities(HolderActivities):
    @activity.defn(name="playline.sync_dataset")
    async def sync_dataset(self, input: SyncInput) -> SyncSummary:
        """Write the run's changed records to the sink; counts, or ``parked``."""
        services = self._holder.services
        spec = services.catalog.sinks.get(input.sink)
        if spec is None:
            declared = ", ".join(sorted(services.catalog.sinks)) or "none"
            raise ApplicationError(
                f"unknown sink {input.sink!r}; the catalog declares: {declared}",
                non_retryable=True,
            )
        try:
            mapping = sync_mapping(
                input.sink,
                spec,
                extra_map=input.map,
                id_column=input.id_column,
                policies=input.policies,
            )
        except PlaylineError as err:
            raise ApplicationError(str(err), non_retryable=True) from None
        provider = (
            services.catalog.providers.get(spec.provider)
            if isinstance(spec, HubSpotSinkSpec | SalesforceSinkSpec)
            else None
        )
        beat = asyncio.create_task(_beat(min(BEAT_S, input.lease_ttl_s / 3)))
        try:
            destination, close = await open_destination(
                input.sink,
                spec,
                provider=provider,
                environ=services.settings.environ,
                http=services.http,
                pacer=services.governor,
                fields=mapping.destination_fields(),
                patience_s=input.patience_s,
            )
            ledger, close_ledger = await open_sync_ledger(services.settings)
            try:
                report = await sync_run(
                    sink=input.sink,
                    run_ref=input.run_ref,
                    mapping=mapping,
                    sheet=services.sheet,
                    ledger=ledger,
                    receipts=services.receipts,
                    destination=destination,
                    lease_ttl_s=input.lease_ttl_s,
                )
            finally:
                await close_ledger()
                await close()
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        return SyncSummary(
            sink=input.sink,
            created=report.created,
            updated=report.updated,
            unchanged=report.unchanged,
            skipped_by_policy=report.skipped_by_policy,
            rejected=report.rejected,
            not_written=report.not_written,
            fields_written=report.fields_written,
            requests=report.requests,
            parked=report.parked,
            left=report.left,
            retry_at=report.parked_until,
        )


async def _beat(every_s: float) -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(every_s)
