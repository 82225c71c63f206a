"""The receipt store: which provider calls were made, and what they returned.

Every tool call is identified by a content address (tool id, tool version, canonical
input, auth-scope digest). Before a call is dispatched the caller *claims* its receipt
with a lease; only the lease holder may complete it (completion is fenced by lease
id). A completed receipt is a cache hit for every later call with the same address,
which is what makes a rerun, a retried chunk or a crashed worker free: nothing is
paid twice.

States: ``running`` (claimed; ``lease_id`` and ``lease_expires_at`` set), ``completed``
(``result`` set), ``failed`` (``error`` set; a later claim retries it). A running
receipt whose lease has expired is reclaimable; that is how a new attempt takes over
from a crashed worker.

The interface is backend-neutral; ``SqliteReceiptStore`` is the embedded default.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from playline.activities.sqlite_db import SqliteDatabase, write_transaction


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def receipt_key(tool_id: str, tool_version: str, tool_input: Any, auth_scope: str) -> str:
    """The content address of one tool call."""
    material = canonical_json(
        {"tool": tool_id, "version": tool_version, "input": tool_input, "scope": auth_scope}
    )
    return f"{tool_id}:{hashlib.sha256(material.encode()).hexdigest()[:32]}"


def idempotency_key(key: str, *, force: bool, lease_id: str | None) -> str:
    """The ``Idempotency-Key`` sent to the provider.

    Derived from the receipt key, so a retried attempt after a crash presents the
    same key and the provider does not charge again. A forced call adds its lease
    id: forcing means "pay for a fresh answer", which must not be deduplicated away.
    """
    material = f"{key}|{lease_id}" if force and lease_id else key
    return hashlib.sha256(material.encode()).hexdigest()


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"  # the caller holds the lease and must call the provider
    HIT = "hit"  # a completed receipt answers the call
    HELD = "held"  # another live owner holds the lease; wait for it


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    key: str
    tool_id: str
    force: bool = False
    stale_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    key: str
    status: ClaimStatus
    result: Any = None
    lease_expires_at: float | None = None
    owner: str | None = None
    batch_key: str | None = None  # CLAIMED member of an unfinished batch: resume it


@dataclass(frozen=True, slots=True)
class Receipt:
    key: str
    tool_id: str
    status: str
    result: Any
    error: str | None
    owner: str | None
    lease_id: str | None
    lease_expires_at: float | None
    completed_at: float | None
    attempts: int
    credits: float


@dataclass(frozen=True, slots=True)
class BatchClaim:
    """What claiming an aggregate receipt found: the stored request and its members."""

    status: ClaimStatus
    member_keys: list[str]
    request: dict[str, Any]


class ReceiptStore(Protocol):
    """What the tool runner needs from a receipt backend. All methods are atomic."""

    async def claim(
        self, requests: Sequence[ClaimRequest], *, owner: str, lease_id: str, ttl_s: float
    ) -> list[ClaimOutcome]:
        """Claim many receipts in one transaction; one outcome per request, in order."""
        ...

    async def renew(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        """Extend the lease on each key; False where this lease no longer holds it."""
        ...

    async def complete(self, key: str, *, lease_id: str, result: Any, credits: float) -> bool:
        """Record a result; False (and nothing written) if the lease was lost."""
        ...

    async def fail(self, key: str, *, lease_id: str, error: str) -> bool:
        """Record a failure; False if the lease was lost."""
        ...

    async def release(self, keys: Sequence[str], *, lease_id: str) -> None:
        """Give back leases of calls that were never dispatched."""
        ...

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        """Current receipts for these keys (missing keys are absent)."""
        ...

    async def open_batch(
        self,
        agg_key: str,
        *,
        tool_id: str,
        member_keys: Sequence[str],
        request: dict[str, Any],
        owner: str,
        lease_id: str,
        ttl_s: float,
    ) -> bool:
        """Record a batch's exact request and point its members (held by this lease) at
        it, before it is sent; False if a member is no longer held."""
        ...

    async def claim_batch(
        self, agg_key: str, *, owner: str, lease_id: str, ttl_s: float
    ) -> BatchClaim:
        """Take over an unfinished batch: the aggregate and all its unfinished members."""
        ...

    async def complete_batch(
        self,
        agg_key: str,
        *,
        lease_id: str,
        results: dict[str, Any],
        credits_per_member: float,
    ) -> bool:
        """Complete the aggregate and every member in one transaction (fenced)."""
        ...

    async def fail_batch(
        self, agg_key: str, *, lease_id: str, error: str, release_members: bool
    ) -> None:
        """Record a batch failure; ``release_members`` frees them for a new batch."""
        ...

    async def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
    key TEXT PRIMARY KEY,
    tool_id TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    error TEXT,
    owner TEXT,
    lease_id TEXT,
    lease_expires_at REAL,
    created_at REAL NOT NULL,
    completed_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    credits REAL NOT NULL DEFAULT 0,
    batch_key TEXT,
    request TEXT
);
"""

#: Columns added after the first release, for files created before them.
_ADDED_COLUMNS = {"batch_key": "TEXT", "request": "TEXT"}


class SqliteReceiptStore:
    """Receipts in one SQLite file (WAL mode), safe across processes on one machine.

    Calls run on a worker thread so the event loop keeps heartbeating while SQLite
    waits on a lock; ``BEGIN IMMEDIATE`` makes each claim batch atomic across
    processes.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self._db = SqliteDatabase(path, _SCHEMA, added_columns={"receipts": _ADDED_COLUMNS})
        self.path = self._db.path
        self._clock = clock

    async def claim(
        self, requests: Sequence[ClaimRequest], *, owner: str, lease_id: str, ttl_s: float
    ) -> list[ClaimOutcome]:
        now = self._clock()
        expires = now + ttl_s

        def tx(conn: sqlite3.Connection) -> list[ClaimOutcome]:
            outcomes: list[ClaimOutcome] = []
            with write_transaction(conn):
                for req in requests:
                    row = conn.execute(
                        "SELECT status, result, owner, lease_id, lease_expires_at, completed_at, "
                        "batch_key FROM receipts WHERE key = ?",
                        (req.key,),
                    ).fetchone()
                    outcome = _decide_claim(req, row, now=now, lease_id=lease_id)
                    if outcome is None:
                        conn.execute(
                            "INSERT INTO receipts (key, tool_id, status, owner, lease_id, "
                            "lease_expires_at, created_at, attempts) "
                            "VALUES (?, ?, 'running', ?, ?, ?, ?, 1) "
                            "ON CONFLICT(key) DO UPDATE SET status='running', "
                            "owner=excluded.owner, lease_id=excluded.lease_id, "
                            "lease_expires_at=excluded.lease_expires_at, "
                            "error=NULL, attempts=receipts.attempts + 1",
                            (req.key, req.tool_id, owner, lease_id, expires, now),
                        )
                        outcome = ClaimOutcome(
                            req.key,
                            ClaimStatus.CLAIMED,
                            lease_expires_at=expires,
                            batch_key=row[6] if row is not None else None,
                        )
                    outcomes.append(outcome)
            return outcomes

        return await self._db.run(tx)

    async def renew(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        expires = self._clock() + ttl_s

        def tx(conn: sqlite3.Connection) -> list[bool]:
            owned: list[bool] = []
            with write_transaction(conn):
                for key in keys:
                    cur = conn.execute(
                        "UPDATE receipts SET lease_expires_at = ? "
                        "WHERE key = ? AND lease_id = ? AND status = 'running'",
                        (expires, key, lease_id),
                    )
                    owned.append(cur.rowcount == 1)
            return owned

        return await self._db.run(tx)

    async def complete(self, key: str, *, lease_id: str, result: Any, credits: float) -> bool:
        now = self._clock()
        payload = canonical_json(result)

        def tx(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE receipts SET status='completed', result=?, error=NULL, completed_at=?, "
                "lease_id=NULL, lease_expires_at=NULL, credits=credits + ? "
                "WHERE key=? AND lease_id=? AND status='running'",
                (payload, now, credits, key, lease_id),
            )
            return cur.rowcount == 1

        return await self._db.run(tx)

    async def fail(self, key: str, *, lease_id: str, error: str) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE receipts SET status='failed', error=?, lease_id=NULL, "
                "lease_expires_at=NULL "
                "WHERE key=? AND lease_id=? AND status='running'",
                (error[:2000], key, lease_id),
            )
            return cur.rowcount == 1

        return await self._db.run(tx)

    async def release(self, keys: Sequence[str], *, lease_id: str) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "UPDATE receipts SET lease_expires_at = 0 "
                "WHERE key=? AND lease_id=? AND status='running'",
                [(key, lease_id) for key in keys],
            )

        await self._db.run(tx)

    async def open_batch(
        self,
        agg_key: str,
        *,
        tool_id: str,
        member_keys: Sequence[str],
        request: dict[str, Any],
        owner: str,
        lease_id: str,
        ttl_s: float,
    ) -> bool:
        now = self._clock()
        document = canonical_json({"members": list(member_keys), "request": request})

        def tx(conn: sqlite3.Connection) -> bool:
            with write_transaction(conn):
                held = 0
                for key in member_keys:
                    held += conn.execute(
                        "UPDATE receipts SET batch_key = ? "
                        "WHERE key = ? AND lease_id = ? AND status = 'running'",
                        (agg_key, key, lease_id),
                    ).rowcount
                if held != len(member_keys):
                    raise _Rollback
                conn.execute(
                    "INSERT INTO receipts (key, tool_id, status, owner, lease_id, "
                    "lease_expires_at, created_at, attempts, request) "
                    "VALUES (?, ?, 'running', ?, ?, ?, ?, 1, ?) "
                    "ON CONFLICT(key) DO UPDATE SET status='running', owner=excluded.owner, "
                    "lease_id=excluded.lease_id, lease_expires_at=excluded.lease_expires_at, "
                    "request=excluded.request, attempts=receipts.attempts + 1",
                    (agg_key, f"{tool_id}#batch", owner, lease_id, now + ttl_s, now, document),
                )
            return True

        try:
            return await self._db.run(tx)
        except _Rollback:
            return False

    async def claim_batch(
        self, agg_key: str, *, owner: str, lease_id: str, ttl_s: float
    ) -> BatchClaim:
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> BatchClaim:
            with write_transaction(conn):
                row = conn.execute(
                    "SELECT status, lease_id, lease_expires_at, request FROM receipts "
                    "WHERE key = ?",
                    (agg_key,),
                ).fetchone()
                if row is None or row[3] is None:
                    raise LookupError(f"batch {agg_key} has no stored request")
                document = json.loads(row[3])
                members: list[str] = document["members"]
                if row[0] == "completed":
                    return BatchClaim(ClaimStatus.HIT, members, document["request"])
                if row[1] != lease_id and (row[2] or 0) > now:
                    return BatchClaim(ClaimStatus.HELD, members, document["request"])
                conn.execute(
                    "UPDATE receipts SET status='running', owner=?, lease_id=?, "
                    "lease_expires_at=?, attempts=attempts + 1 WHERE key = ?",
                    (owner, lease_id, now + ttl_s, agg_key),
                )
                for key in members:
                    conn.execute(
                        "UPDATE receipts SET status='running', owner=?, lease_id=?, "
                        "lease_expires_at=? WHERE key = ? AND batch_key = ? "
                        "AND status != 'completed'",
                        (owner, lease_id, now + ttl_s, key, agg_key),
                    )
                return BatchClaim(ClaimStatus.CLAIMED, members, document["request"])

        return await self._db.run(tx)

    async def complete_batch(
        self,
        agg_key: str,
        *,
        lease_id: str,
        results: dict[str, Any],
        credits_per_member: float,
    ) -> bool:
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> bool:
            with write_transaction(conn):
                fenced = conn.execute(
                    "UPDATE receipts SET status='completed', completed_at=?, lease_id=NULL, "
                    "lease_expires_at=NULL, error=NULL, result=?, credits=credits + ? "
                    "WHERE key=? AND lease_id=? AND status='running'",
                    (
                        now,
                        canonical_json({"members": len(results)}),
                        credits_per_member * len(results),
                        agg_key,
                        lease_id,
                    ),
                ).rowcount
                if fenced != 1:
                    raise _Rollback
                for key, result in results.items():
                    conn.execute(
                        "UPDATE receipts SET status='completed', result=?, error=NULL, "
                        "completed_at=?, lease_id=NULL, lease_expires_at=NULL, "
                        "credits=credits + ? WHERE key=? AND batch_key=?",
                        (canonical_json(result), now, credits_per_member, key, agg_key),
                    )
            return True

        try:
            return await self._db.run(tx)
        except _Rollback:
            return False

    async def fail_batch(
        self, agg_key: str, *, lease_id: str, error: str, release_members: bool
    ) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            with write_transaction(conn):
                owned = conn.execute(
                    "UPDATE receipts SET status='failed', error=?, lease_id=NULL, "
                    "lease_expires_at=NULL WHERE key=? AND lease_id=? AND status='running'",
                    (error[:2000], agg_key, lease_id),
                ).rowcount
                if owned != 1:
                    return
                conn.execute(
                    "UPDATE receipts SET status='failed', error=?, lease_id=NULL, "
                    "lease_expires_at=NULL"
                    + (", batch_key=NULL" if release_members else "")
                    + " WHERE batch_key=? AND status != 'completed'",
                    (error[:2000], agg_key),
                )

        await self._db.run(tx)

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        def tx(conn: sqlite3.Connection) -> dict[str, Receipt]:
            found: dict[str, Receipt] = {}
            for start in range(0, len(keys), 500):
                batch = list(keys[start : start + 500])
                marks = ",".join("?" * len(batch))
                for row in conn.execute(
                    "SELECT key, tool_id, status, result, error, owner, lease_id, "
                    "lease_expires_at, completed_at, attempts, credits "
                    f"FROM receipts WHERE key IN ({marks})",
                    batch,
                ):
                    found[row[0]] = Receipt(
                        key=row[0],
                        tool_id=row[1],
                        status=row[2],
                        result=json.loads(row[3]) if row[3] is not None else None,
                        error=row[4],
                        owner=row[5],
                        lease_id=row[6],
                        lease_expires_at=row[7],
                        completed_at=row[8],
                        attempts=row[9],
                        credits=row[10],
                    )
            return found

        return await self._db.run(tx)

    async def close(self) -> None:
        self._db.close()


class _Rollback(Exception):
    """Raised inside a transaction to undo it and report ``False``."""


def _decide_claim(
    req: ClaimRequest, row: tuple[Any, ...] | None, *, now: float, lease_id: str
) -> ClaimOutcome | None:
    """What a claim finds; ``None`` means "take the lease".

    Shared by every backend so the rules are stated once: a fresh completed receipt
    is a hit unless forced; a live lease held by someone else is waited on; anything
    else (missing, failed, stale, expired lease) is claimed.
    """
    if row is None:
        return None
    status, result, owner, held_lease, lease_expires_at, completed_at = row[:6]
    if status == "running" and held_lease != lease_id and (lease_expires_at or 0) > now:
        return ClaimOutcome(
            req.key, ClaimStatus.HELD, lease_expires_at=lease_expires_at, owner=owner
        )
    if status == "completed" and not req.force:
        fresh = req.stale_after_s is None or (completed_at or 0) >= now - req.stale_after_s
        if fresh:
            value = json.loads(result) if isinstance(result, str) else result
            return ClaimOutcome(req.key, ClaimStatus.HIT, result=value)
    return None
