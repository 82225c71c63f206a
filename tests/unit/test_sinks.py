"""What a sync writes, decided per record and field, and the receipted batch contract.

Pure planning rules (changes only, the overwrite policies, never a blank) are checked
on rows built by hand; the engine runs over real SQLite receipts and a real sync
ledger with a destination that records what it was sent, and a sheet store fake that
serves the run's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from playline.contract import SyncSummary
from playline.sinks.destination import CREATED, REJECTED, RecordOutcome, SinkParked
from playline.sinks.engine import sync_run
from playline.sinks.plan import RecordPlan, SkippedRow, SyncMapping, plan_row
from playline.sinks.spec import VerifiedRule
from playline.stores.receipts_ledger import ReceiptLedger
from playline.stores.sheet import RunInfo, RunRow
from playline.stores.sync_ledger import SyncLedger

MAPPING = SyncMapping(
    "email",
    {"company": "company", "title": "jobtitle", "phone": "phone"},
    policies={"jobtitle": "if_blank", "phone": "if_verified"},
    verified={"phone": VerifiedRule(tools=("verifly_phone",))},
)


def row(seq: int, status: str = "ok", **data: Any) -> RunRow:
    provenance = {"phone": {"tool": data.pop("phone_tool", "cheap_phone")}}
    return RunRow(seq, f"k{seq}", data, status, None, provenance=provenance)  # type: ignore[arg-type]


def verdicts(plan: RecordPlan | SkippedRow) -> dict[str, str]:
    assert isinstance(plan, RecordPlan)
    return {v.field: v.verdict for v in plan.verdicts}


def test_a_field_is_written_when_it_differs_from_what_the_sink_last_wrote() -> None:
    fresh = row(0, email="a@x.io", company="Acme", title="CTO", phone="1")
    assert verdicts(plan_row(fresh, MAPPING, {})) == {
        "company": "write",
        "jobtitle": "if_blank",
        "phone": "not verified",
    }
    before = {"company": ("Acme", "written"), "jobtitle": ("CTO", "kept")}
    assert verdicts(plan_row(fresh, MAPPING, before))["company"] == "unchanged"
    assert verdicts(plan_row(fresh, MAPPING, before))["jobtitle"] == "unchanged"
    moved = row(0, email="a@x.io", company="Acme Inc", title="CTO", phone="1")
    assert verdicts(plan_row(moved, MAPPING, before))["company"] == "write"


def test_blanks_failed_rows_and_rows_without_an_id_are_never_written() -> None:
    blank = plan_row(row(0, email="a@x.io", company="", title=None, phone="  "), MAPPING, {})
    assert isinstance(blank, RecordPlan) and not blank.sends
    assert set(verdicts(blank).values()) == {"blank"}
    assert plan_row(row(1, "error", email="a@x.io"), MAPPING, {}) == SkippedRow(
        "k1", "row failed: error"
    )
    assert isinstance(plan_row(row(2, "pending", email="a@x.io"), MAPPING, {}), SkippedRow)
    assert isinstance(plan_row(row(3, email=" "), MAPPING, {}), SkippedRow)


def test_provenance_fields_go_with_the_fields_written() -> None:
    mapping = SyncMapping("email", {"company": "company", "title": "title"}, provenance_fields=True)
    found = RunRow(
        0,
        "k0",
        {"email": "a@x.io", "company": "Acme", "title": "CTO"},
        "ok",
        None,
        provenance={"company": {"tool": "company_lookup", "provider": "firmo", "fetched_at": 0.0}},
    )
    plan = plan_row(found, mapping, {"title": ("CTO", "written")})
    assert isinstance(plan, RecordPlan)
    assert plan.writes == {
        "company": "Acme",
        "company_source": "company_lookup (firmo)",
        "company_fetched_at": "1970-01-01T00:00:00Z",
    }  # the title is unchanged: no provenance sent for it either


def test_if_verified_follows_the_provenance_rule() -> None:
    verified = row(0, email="a@x.io", phone="+1 555", phone_tool="verifly_phone")
    assert verdicts(plan_row(verified, MAPPING, {}))["phone"] == "write"
    by_column = SyncMapping(
        "email",
        {"email_out": "email2"},
        policies={"email2": "if_verified"},
        verified={"email2": VerifiedRule(column="check", values=("valid",))},
    )
    good = row(0, email="a@x.io", email_out="b@x.io", check="valid")
    bad = row(1, email="a@x.io", email_out="b@x.io", check="risky")
    assert verdicts(plan_row(good, by_column, {}))["email2"] == "write"
    assert verdicts(plan_row(bad, by_column, {}))["email2"] == "not verified"


class Sheet:
    """The two reads a sync makes of the sheet store."""

    def __init__(self, rows: list[RunRow]) -> None:
        self.rows = rows

    async def run_info(self, run_ref: str) -> RunInfo:
        columns = ["email", "company", "title", "phone"]
        return RunInfo(run_ref, "ds", len(self.rows), len(self.rows), 0, 0, columns)

    async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]:
        return self.rows[start:end]


class Crm:
    """A destination that keeps what it was sent; ``fail_after`` breaks the sync
    *after* the destination acknowledged that many batches."""

    scope = "test-crm"
    max_batch = 2

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.requests = 0
        self.reject: set[str] = set()

    async def write(
        self, batch: Sequence[RecordPlan], *, resent: bool = False
    ) -> list[RecordOutcome]:
        self.requests += 1
        self.batches.append([p.record for p in batch])
        return [
            RecordOutcome(p.record, REJECTED, reason="invalid")
            if p.record in self.reject
            else RecordOutcome(p.record, CREATED, object_id=p.record, written=p.writes)
            for p in batch
        ]

    async def close(self) -> None:
        return None


class BrokenLedger(SyncLedger):
    """Fails to record the second acknowledged batch: a crash between the answer and
    the ledger write."""

    calls = 0

    async def record(self, sink: str, written: Any) -> None:
        BrokenLedger.calls += 1
        if BrokenLedger.calls == 2:
            raise RuntimeError("killed")
        await super().record(sink, written)


@pytest.fixture
async def stores(tmp_path: Path) -> Any:
    receipts = await ReceiptLedger.in_file(tmp_path / "receipts.db", create=True).ensure_open()
    yield receipts, tmp_path
    await receipts.close()


async def test_a_crash_after_an_acknowledged_batch_never_sends_it_again(stores: Any) -> None:
    receipts, tmp_path = stores
    mapping = SyncMapping("email", {"company": "company"})
    sheet = Sheet([row(i, email=f"p{i}@x.io", company=f"Co{i}") for i in range(5)])
    crm = Crm()
    BrokenLedger.calls = 0
    broken = BrokenLedger.in_file(tmp_path / "sync.db")
    common: dict[str, Any] = {"sink": "crm", "run_ref": "r1", "mapping": mapping}
    with pytest.raises(RuntimeError, match="killed"):
        await sync_run(**common, sheet=sheet, ledger=broken, receipts=receipts, destination=crm)
    assert crm.batches == [["p0@x.io", "p1@x.io"], ["p2@x.io", "p3@x.io"]]
    await broken.close()
    ledger = SyncLedger.in_file(tmp_path / "sync.db")
    report = await sync_run(
        **common, sheet=sheet, ledger=ledger, receipts=receipts, destination=crm
    )
    # The second batch's answer came from its receipt; only the last batch was sent.
    assert crm.batches[2:] == [["p4@x.io"]]
    assert (report.batches_reused, report.created, report.requests) == (1, 3, 3)
    again = await sync_run(**common, sheet=sheet, ledger=ledger, receipts=receipts, destination=crm)
    assert (again.unchanged, len(crm.batches)) == (5, 3)
    await ledger.close()


async def test_rejected_records_are_reported_and_not_remembered(stores: Any) -> None:
    receipts, tmp_path = stores
    mapping = SyncMapping("email", {"company": "company"})
    sheet = Sheet([row(i, email=f"p{i}@x.io", company=f"Co{i}") for i in range(3)])
    crm = Crm()
    crm.reject = {"p1@x.io"}
    ledger = SyncLedger.in_file(tmp_path / "sync.db")
    common: dict[str, Any] = {"sink": "crm", "run_ref": "r1", "mapping": mapping}
    report = await sync_run(
        **common, sheet=sheet, ledger=ledger, receipts=receipts, destination=crm
    )
    assert report.rejections == [{"record": "p1@x.io", "reason": "invalid"}]
    assert await ledger.last_written("crm", ["p0@x.io", "p1@x.io"]) == {
        "p0@x.io": {"company": ("Co0", "written")}
    }
    dry = await sync_run(
        **common, sheet=sheet, ledger=ledger, receipts=receipts, destination=crm, dry_run=True
    )
    assert (dry.left, dry.unchanged, crm.requests) == (1, 2, 2)  # the dry run sent nothing
    await ledger.close()


async def test_a_parked_destination_stops_the_sync_with_what_is_left(stores: Any) -> None:
    receipts, tmp_path = stores

    class Parked(Crm):
        async def write(
            self, batch: Sequence[RecordPlan], *, resent: bool = False
        ) -> list[RecordOutcome]:
            if self.batches:
                raise SinkParked("daily limit")
            return await super().write(batch)

    crm = Parked()
    ledger = SyncLedger.in_file(tmp_path / "sync.db")
    sheet = Sheet([row(i, email=f"p{i}@x.io", company=f"Co{i}") for i in range(5)])
    report = await sync_run(
        sink="crm",
        run_ref="r1",
        mapping=SyncMapping("email", {"company": "company"}),
        sheet=sheet,
        ledger=ledger,
        receipts=receipts,
        destination=crm,
    )
    assert (report.parked, report.created, report.left) == ("daily limit", 2, 3)
    # What goes into workflow history is the counts, never a record id.
    summary = report.summary()
    assert type(summary) is SyncSummary
    assert summary.model_dump() == {
        "sink": "crm",
        "created": 2,
        "updated": 0,
        "unchanged": 0,
        "skipped_by_policy": 0,
        "rejected": 0,
        "not_written": 0,
        "fields_written": 2,
        "requests": 1,
        "parked": "daily limit",
        "left": 3,
        "retry_at": None,
    }
    shown = report.as_json()
    assert (shown["run_ref"], shown["parked_until"], "plans" in shown) == ("r1", None, False)
    await ledger.close()


async def test_a_batch_rejected_whole_is_sent_again_next_time(stores: Any) -> None:
    receipts, tmp_path = stores
    crm = Crm()
    crm.reject = {"p0@x.io", "p1@x.io"}
    ledger = SyncLedger.in_file(tmp_path / "sync.db")
    sheet = Sheet([row(i, email=f"p{i}@x.io", company=f"Co{i}") for i in range(2)])
    common: dict[str, Any] = {
        "sink": "crm",
        "run_ref": "r1",
        "mapping": SyncMapping("email", {"company": "company"}),
        "sheet": sheet,
        "ledger": ledger,
        "receipts": receipts,
        "destination": crm,
    }
    assert (await sync_run(**common)).rejected == 2
    crm.reject = set()  # the cause was fixed at the destination
    assert (await sync_run(**common)).created == 2
    assert crm.batches == [["p0@x.io", "p1@x.io"]] * 2
    await ledger.close()
