"""One sync: a run's rows written to a sink, changes only, each batch a receipted call.

The run's rows are read from the sheet store page by page and planned against the
sync ledger (:mod:`~playline.sinks.plan`); the records with something to send are
cut into batches, in run order, of the destination's size. Each batch is a call
with a receipt (tool ``sink:<name>``, keyed by the batch's content and the
destination's scope), claimed before it is sent and completed with the
destination's per-record answer before the ledger is written:

* a sync killed after the destination acknowledged a batch finds, next time, the
  same records pending, hence the same batch, hence a completed receipt: its stored
  answer is applied and nothing is sent again;
* a sync killed while a batch was in flight (its receipt is marked *sent* just
  before it goes) finds, once the lease expired, a batch that may have been written:
  the destination is told so (``resent``) and HubSpot reads the records back first,
  sending only those that do not hold the batch's values yet; an upsert by key makes
  a re-send harmless anyway (the idempotency contract ``natural``: the same record,
  never a duplicate).

The report counts records per outcome: created, updated, unchanged, skipped by
policy, rejected (with the destination's reason), and the rows that make no record.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import Field

from playline.contract import SyncSummary
from playline.errors import PlaylineError
from playline.sinks.destination import (
    CREATED,
    KEPT,
    REJECTED,
    UPDATED,
    Destination,
    RecordOutcome,
    SinkBusy,
    SinkParked,
)
from playline.sinks.plan import RecordPlan, SkippedRow, SyncMapping, cell_text, plan_row
from playline.stores.receipts import ClaimRequest, ClaimStatus, ReceiptStore, receipt_key
from playline.stores.sheet import SheetStore
from playline.stores.sync_ledger import SyncLedger, WrittenRecord

__all__ = ["SyncReport", "plan_run", "sync_run"]

#: Rows read from the sheet store per page.
PAGE_ROWS = 1000
#: Rejections a report lists (the counts hold all of them).
SHOWN_REJECTIONS = 20
#: How long a batch's receipt lease lasts; renewed while the batch is being written, so
#: a sync killed mid-batch leaves a lease another sync may take over this soon.
LEASE_TTL_S = 60.0
#: The version of a batch's content address (bump when the payload's shape changes).
BATCH_VERSION = "1"


class SyncReport(SyncSummary):
    """What one sync did (or, dry, would do): the counts a play step gets
    (:class:`~playline.contract.SyncSummary`), and what stays out of workflow history
    (record ids, the destination's reasons, the dry run's verdicts)."""

    run_ref: str
    dry_run: bool = False
    #: batches whose answer a receipt already held (acknowledged before a crash)
    batches_reused: int = 0
    #: batches a killed sync had sent without recording the answer, sent again
    batches_resent: int = 0
    rejections: list[dict[str, str]] = Field(default_factory=list)
    not_written_reasons: dict[str, int] = Field(default_factory=dict)
    #: dry run: per record, per field, the verdict
    plans: list[dict[str, Any]] = Field(default_factory=list)

    def summary(self) -> SyncSummary:
        """The counts alone, for workflow history."""
        return SyncSummary.model_validate(self.model_dump(include=set(SyncSummary.model_fields)))

    def as_json(self) -> dict[str, Any]:
        """The report ``playline sync --json`` prints (the verdicts on a dry run only)."""
        data = self.model_dump(exclude=set() if self.dry_run else {"plans"})
        # The command's JSON named it so before the summary's field existed.
        data["parked_until"] = data.pop("retry_at")
        return data


async def plan_run(
    sheet: SheetStore,
    ledger: SyncLedger,
    *,
    sink: str,
    run_ref: str,
    mapping: SyncMapping,
    report: SyncReport,
) -> list[RecordPlan]:
    """Every record of the run with something to send, in run order; the others are
    counted in ``report`` (unchanged, skipped by policy, not written)."""
    info = await sheet.run_info(run_ref)
    if info is None:
        raise PlaylineError(f"no rows recorded for dataset run {run_ref!r}")
    missing = [c for c in [mapping.id_column, *mapping.fields] if c not in info.columns]
    if missing:
        raise PlaylineError(
            f"sink {sink!r}: column(s) {missing} are not columns of the run "
            f"({', '.join(info.columns)})"
        )
    pending: list[RecordPlan] = []
    seen: set[str] = set()
    for start in range(0, info.admitted, PAGE_ROWS):
        rows = await sheet.read_run_rows(run_ref, start, min(start + PAGE_ROWS, info.admitted))
        ids = {cell_text(r.data.get(mapping.id_column)) for r in rows}
        previous = await ledger.last_written(sink, sorted(i for i in ids if i is not None))
        for row in rows:
            record = cell_text(row.data.get(mapping.id_column))
            plan = plan_row(row, mapping, previous.get(record, {}) if record else {})
            if isinstance(plan, RecordPlan) and plan.record in seen:
                plan = SkippedRow(row.row_key, "repeats an earlier row's id")
            if isinstance(plan, SkippedRow):
                report.not_written += 1
                reason = plan.reason.split(":")[0]
                report.not_written_reasons[reason] = report.not_written_reasons.get(reason, 0) + 1
                continue
            seen.add(plan.record)
            if report.dry_run:
                report.plans.append(_shown(plan))
            if plan.sends:
                pending.append(plan)
            elif plan.held_by_policy:
                report.skipped_by_policy += 1
            else:
                report.unchanged += 1
    return pending


async def sync_run(
    *,
    sink: str,
    run_ref: str,
    mapping: SyncMapping,
    sheet: SheetStore,
    ledger: SyncLedger,
    receipts: ReceiptStore,
    destination: Destination,
    dry_run: bool = False,
    lease_ttl_s: float = LEASE_TTL_S,
) -> SyncReport:
    """Write the run's changed records to ``destination`` (see the module docstring);
    ``dry_run`` sends nothing and returns the verdicts."""
    report = SyncReport(sink=sink, run_ref=run_ref, dry_run=dry_run)
    pending = await plan_run(
        sheet, ledger, sink=sink, run_ref=run_ref, mapping=mapping, report=report
    )
    if dry_run:
        report.left = len(pending)
        return report
    owner = f"sync:{socket.gethostname()}:{os.getpid()}"
    size = destination.max_batch
    for start in range(0, len(pending), size):
        batch = pending[start : start + size]
        try:
            outcomes = await _settle_batch(
                sink,
                batch,
                receipts=receipts,
                destination=destination,
                owner=owner,
                report=report,
                lease_ttl_s=lease_ttl_s,
            )
        except SinkParked as parked:
            report.parked = str(parked)
            report.retry_at = parked.until_wall
            report.left = len(pending) - start
            break
        await ledger.record(sink, [_written(o) for o in outcomes if o.status != REJECTED])
        _tally(report, batch, outcomes)
    report.requests = destination.requests
    return report


async def _settle_batch(
    sink: str,
    batch: Sequence[RecordPlan],
    *,
    receipts: ReceiptStore,
    destination: Destination,
    owner: str,
    report: SyncReport,
    lease_ttl_s: float,
) -> list[RecordOutcome]:
    """The destination's answer to ``batch``: a completed receipt's, or a fresh one
    (claimed, sent, completed)."""
    tool = f"sink:{sink}"
    key = receipt_key(tool, BATCH_VERSION, [p.payload() for p in batch], destination.scope)
    lease = uuid.uuid4().hex
    (claim,) = await receipts.claim(
        [ClaimRequest(key=key, tool_id=tool)], owner=owner, lease_id=lease, ttl_s=lease_ttl_s
    )
    if claim.status == ClaimStatus.HIT:
        report.batches_reused += 1
        return [RecordOutcome.from_json(o) for o in claim.result["outcomes"]]
    if claim.status != ClaimStatus.CLAIMED:
        raise SinkBusy(
            f"sink {sink!r}: a batch is being written by {claim.owner or 'another sync'}; "
            "sync again when it is done (a killed sync's batch is taken over once its lease "
            "runs out: --lease-ttl)"
        )
    if claim.resent:
        report.batches_resent += 1
    # Marked sent before it goes: a sync killed from here on leaves a batch the next
    # one knows may have been written.
    if not (await receipts.mark_sent([key], lease_id=lease, ttl_s=lease_ttl_s))[0]:
        raise SinkBusy(f"sink {sink!r}: lost the lease of a batch before sending it")
    try:
        async with _renewing(receipts, key, lease, lease_ttl_s):
            outcomes = await destination.write(batch, resent=claim.resent)
    except SinkParked:
        # Refused before anything was written (a 429 writes nothing): not sent after all.
        await receipts.fail(key, lease_id=lease, error="parked")
        raise
    if outcomes and all(o.status == REJECTED for o in outcomes):
        # Nothing was written: no answer worth keeping (the same batch, sent again after
        # the cause is fixed, must reach the destination, not this refusal).
        await receipts.fail(key, lease_id=lease, error="every record rejected")
        return outcomes
    answer = {"outcomes": [o.as_json() for o in outcomes]}
    if not await receipts.complete(key, lease_id=lease, result=answer, credits=0.0):
        raise SinkBusy(f"sink {sink!r}: lost the lease of a batch it wrote; sync again")
    return outcomes


@contextlib.asynccontextmanager
async def _renewing(
    receipts: ReceiptStore, key: str, lease: str, ttl_s: float
) -> AsyncIterator[None]:
    """Keep the batch's lease while the destination writes it (429s may be waited out)."""

    async def renew() -> None:
        while True:
            await asyncio.sleep(ttl_s / 3)
            await receipts.renew([key], lease_id=lease, ttl_s=ttl_s)

    task = asyncio.create_task(renew())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _written(outcome: RecordOutcome) -> WrittenRecord:
    return WrittenRecord(
        outcome.record,
        outcome.object_id,
        outcome.status,
        written=dict(outcome.written),
        kept=dict(outcome.kept),
    )


def _tally(
    report: SyncReport, batch: Sequence[RecordPlan], outcomes: Sequence[RecordOutcome]
) -> None:
    for plan, outcome in zip(batch, outcomes, strict=True):
        report.fields_written += len(outcome.written)
        if outcome.status == CREATED:
            report.created += 1
        elif outcome.status == UPDATED:
            report.updated += 1
        elif outcome.status == KEPT:
            report.skipped_by_policy += 1
        else:
            report.rejected += 1
            if len(report.rejections) < SHOWN_REJECTIONS:
                report.rejections.append(
                    {"record": plan.record, "reason": outcome.reason or "rejected"}
                )


def _shown(plan: RecordPlan) -> dict[str, Any]:
    """A record's verdicts for ``--dry-run``."""
    return {
        "record": plan.record,
        "row_key": plan.row_key,
        "fields": [
            {
                "field": v.field,
                "column": v.column,
                "value": v.value,
                "previous": v.previous,
                "policy": v.policy,
                "verdict": v.verdict,
            }
            for v in plan.verdicts
        ],
    }
