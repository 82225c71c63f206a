"""The result journal: paid answers the receipt store would not take, kept until it does.

A provider's answer is paid for the moment it arrives. If the receipt store keeps
failing to record it (PostgreSQL down for minutes, a full disk), the attempt does not
drop it: after retrying for its patience it appends the answer here, on the worker's
own disk (one JSON line each, flushed and fsynced), and gives up the chunk. When the
worker's services open again, and before each chunk attempt, :meth:`ResultJournal.replay`
completes those receipts (fenced by the lease that paid, as any completion is; a
receipt another attempt finished meanwhile is left as it is), so the retry finds them
as receipt hits and pays nothing again. An answer to a call left ``ambiguous`` turns it
``completed``: the charge is no longer a question.

Entries are idempotent (a completion that finds the receipt settled writes nothing),
so a replay that crashes halfway is simply replayed again.

Lines written by an older playline still replay: a bulk entry without
``member_credits`` meant ``credits`` per member, and an entry without
``credits_source`` was computed from the billing rule.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from playline.stores.receipts import CREDITS_FROM_RULE, ReceiptStore

__all__ = ["JournalEntry", "ResultJournal", "record_entry"]

logger = logging.getLogger("playline.journal")

_NAME = "unsettled.jsonl"
_REPLAYING = "replaying-"


@dataclass(frozen=True)
class JournalEntry:
    """One paid result: a single call's (``results`` is None) or a bulk request's."""

    key: str
    lease_id: str
    result: Any = None
    #: a single call: what it cost. A bulk entry of the old format (no
    #: ``member_credits``): what each member cost.
    credits: float = 0.0
    #: a bulk request: each member's result
    results: dict[str, Any] | None = field(default=None)
    #: where the credits came from (``"provider"`` or ``"rule"``)
    credits_source: str = CREDITS_FROM_RULE
    #: a bulk request: what each member cost (keyed like ``results``)
    member_credits: dict[str, float] | None = field(default=None)
    #: who paid: a single call's payer, or each bulk member's
    paid_by: str | None = None
    member_paid_by: dict[str, str] | None = field(default=None)

    def bulk_member_credits(self) -> dict[str, float]:
        """Each member's credits: recorded per member, or (an entry of the old format)
        ``credits`` for every member, as it meant then."""
        if self.member_credits is not None:
            return dict(self.member_credits)
        return dict.fromkeys(self.results or {}, self.credits)


class ResultJournal:
    """Paid results kept in ``directory`` until the receipt store takes them.

    Args:
        directory: the worker's journal directory (``Settings.journal_dir``).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._lock = asyncio.Lock()

    def pending(self) -> bool:
        """Whether anything waits to be replayed (a cheap check: no file, nothing)."""
        try:
            return any(p.stat().st_size for p in self._files())
        except OSError:
            return False

    async def keep(self, entry: JournalEntry) -> None:
        """Append ``entry`` durably (written and fsynced before this returns)."""
        line = json.dumps(asdict(entry), sort_keys=True, separators=(",", ":")) + "\n"
        await asyncio.to_thread(self._append, line)
        logger.error(
            "receipt %s: the store would not record a paid result; kept in %s until it does",
            entry.key,
            self.directory / _NAME,
        )

    def _append(self, line: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / _NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.name.endswith(".jsonl"))

    async def replay(self, receipts: ReceiptStore) -> int:
        """Record every journalled result in ``receipts``; how many were recorded.

        Each file is taken by renaming it, so concurrent replays in several processes
        share the work; an entry the store still refuses goes back into the journal.
        """
        if not self.pending():
            return 0
        async with self._lock:
            recorded = 0
            for path in self._files():
                taken = path.with_name(f"{_REPLAYING}{uuid.uuid4().hex}.jsonl")
                try:
                    path.rename(taken)
                except FileNotFoundError:
                    continue  # another process took it
                try:
                    lines = _lines(taken)
                except FileNotFoundError:
                    # A replay another process left unfinished (a crash) is taken up, so
                    # one still running may take this one from under us: it records it.
                    continue
                entries = [_entry(line) for line in lines]
                for index, entry in enumerate(entries):
                    try:
                        recorded += await record_entry(receipts, entry)
                    except Exception:
                        for rest in entries[index:]:
                            await self.keep(rest)
                        taken.unlink(missing_ok=True)
                        raise
                taken.unlink(missing_ok=True)
            if recorded:
                logger.info("recorded %d journalled result(s) in the receipt store", recorded)
            return recorded


def _entry(line: str) -> JournalEntry:
    """An entry from its line; fields a newer playline wrote that this one does not
    know are dropped rather than lose the paid answer."""
    data = json.loads(line)
    known = {f.name for f in fields(JournalEntry)}
    return JournalEntry(**{k: v for k, v in data.items() if k in known})


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


async def record_entry(receipts: ReceiptStore, entry: JournalEntry) -> int:
    """Record one paid result in the receipt store, as the call path does when the
    store answers and the journal replays when it did not; 1 if it took it, else 0."""
    if entry.results is not None:
        done = await receipts.complete_batch(
            entry.key,
            lease_id=entry.lease_id,
            results=entry.results,
            member_credits=entry.bulk_member_credits(),
            credits_source=entry.credits_source,
            member_paid_by=entry.member_paid_by,
        )
    else:
        done = await receipts.complete(
            entry.key,
            lease_id=entry.lease_id,
            result=entry.result,
            credits=entry.credits,
            credits_source=entry.credits_source,
            paid_by=entry.paid_by,
        )
    return int(done)
