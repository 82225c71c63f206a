"""``SqliteReceiptStore``: the receipt store in one SQLite file (the embedded default).

See :mod:`playline.stores.receipts` for the states, the claim rule and the contract.
Every write goes through :meth:`SqliteDatabase.write
<playline.stores.sqlite_db.SqliteDatabase.write>`, so the claims, renewals and
completions of all the chunks running in a worker are committed together, one
transaction per group, on the file's own thread.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from playline.stores.migrations import Migration
from playline.stores.receipts import (
    CREDITS_FROM_RULE,
    STATE_COLUMNS,
    BatchClaim,
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    Receipt,
    StoredState,
    ToolReceipts,
    batch_sent_reason,
    decide_claim,
    stored_json,
)
from playline.stores.sqlite_db import SqliteDatabase

__all__ = ["MIGRATIONS", "SqliteReceiptStore"]


def _add_batch_columns(conn: sqlite3.Connection) -> None:
    """Files created before bulk endpoints lack the batch columns."""
    present = {row[1] for row in conn.execute("PRAGMA table_info(receipts)")}
    for name in ("batch_key", "request"):
        if name not in present:
            conn.execute(f"ALTER TABLE receipts ADD COLUMN {name} TEXT")


MIGRATIONS = (
    Migration(
        1,
        "receipts (files from before versioned migrations keep theirs)",
        (
            """CREATE TABLE IF NOT EXISTS receipts (
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
            )""",
        ),
        apply=_add_batch_columns,
    ),
    Migration(
        2,
        "find a batch's members by their batch",
        ("CREATE INDEX IF NOT EXISTS receipts_batch ON receipts (batch_key)",),
    ),
    Migration(
        3,
        "sent marks, generations and forcing runs (idempotency contracts, ambiguous calls)",
        (
            "ALTER TABLE receipts ADD COLUMN sent_at REAL",
            "ALTER TABLE receipts ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE receipts ADD COLUMN forced_by TEXT",
        ),
    ),
    Migration(
        4,
        "where a receipt's credits came from (the provider's report or the billing rule)",
        ("ALTER TABLE receipts ADD COLUMN credits_source TEXT",),
    ),
    Migration(
        5,
        "who paid for a receipt's answer (a dataset row), so its retry reads it as its own",
        ("ALTER TABLE receipts ADD COLUMN paid_by TEXT",),
    ),
    Migration(
        6,
        "find a tool's latest completed receipts (an estimate's hit rates and prices)",
        (
            "CREATE INDEX IF NOT EXISTS receipts_tool_completed ON receipts "
            "(tool_id, completed_at) WHERE status = 'completed'",
        ),
    ),
    Migration(
        7,
        "what each answer cost on its own and how often a call was sent again (a run's audit)",
        (
            "ALTER TABLE receipts ADD COLUMN paid_credits REAL",
            "ALTER TABLE receipts ADD COLUMN resends INTEGER NOT NULL DEFAULT 0",
        ),
    ),
)


class SqliteReceiptStore:
    """Receipts in one SQLite file (WAL mode), safe across processes on one machine.

    Args:
        path: the database file.
        clock: seconds since the epoch (tests move it by hand).
        create: create and migrate the file (a worker) or only open an existing
            store (a client; see :class:`~playline.stores.sqlite_db.SqliteDatabase`).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> None:
        self._db = SqliteDatabase(path, MIGRATIONS, create=create)
        self.path = self._db.path
        self._clock = clock

    async def claim(
        self, requests: Sequence[ClaimRequest], *, owner: str, lease_id: str, ttl_s: float
    ) -> list[ClaimOutcome]:
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> list[ClaimOutcome]:
            outcomes: list[ClaimOutcome] = []
            for req in requests:
                found = conn.execute(
                    f"SELECT {STATE_COLUMNS} FROM receipts WHERE key = ?", (req.key,)
                ).fetchone()
                row = StoredState(*found) if found is not None else None
                outcome = decide_claim(req, row, now=now, lease_id=lease_id, ttl_s=ttl_s)
                if outcome.status is ClaimStatus.CLAIMED:
                    conn.execute(
                        "INSERT INTO receipts (key, tool_id, status, owner, lease_id, "
                        "lease_expires_at, created_at, attempts, generation, forced_by) "
                        "VALUES (?, ?, 'running', ?, ?, ?, ?, 1, 0, ?) "
                        "ON CONFLICT(key) DO UPDATE SET status='running', "
                        "owner=excluded.owner, lease_id=excluded.lease_id, "
                        "lease_expires_at=excluded.lease_expires_at, error=NULL, sent_at=NULL, "
                        "attempts=receipts.attempts + 1, generation=?, "
                        "forced_by=excluded.forced_by, batch_key=?, "
                        "resends=receipts.resends + ?",
                        (
                            req.key,
                            req.tool_id,
                            owner,
                            lease_id,
                            outcome.lease_expires_at,
                            now,
                            req.force_token if req.force else None,
                            outcome.generation,
                            outcome.batch_key,
                            int(outcome.resent),
                        ),
                    )
                elif outcome.became_ambiguous:
                    conn.execute(
                        "UPDATE receipts SET status='ambiguous', error=?, lease_expires_at=NULL "
                        "WHERE key = ?",
                        (outcome.reason, req.key),
                    )
                outcomes.append(outcome)
            return outcomes

        return await self._db.write(tx)

    async def renew(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        expires = self._clock() + ttl_s

        def tx(conn: sqlite3.Connection) -> list[bool]:
            return [
                conn.execute(
                    "UPDATE receipts SET lease_expires_at = ? "
                    "WHERE key = ? AND lease_id = ? AND status = 'running'",
                    (expires, key, lease_id),
                ).rowcount
                == 1
                for key in keys
            ]

        return await self._db.write(tx)

    async def mark_sent(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> list[bool]:
            return [
                conn.execute(
                    "UPDATE receipts SET sent_at = ?, lease_expires_at = ? "
                    "WHERE key = ? AND lease_id = ? AND status = 'running'",
                    (now, now + ttl_s, key, lease_id),
                ).rowcount
                == 1
                for key in keys
            ]

        return await self._db.write(tx)

    async def complete(
        self,
        key: str,
        *,
        lease_id: str,
        result: Any,
        credits: float,
        credits_source: str = CREDITS_FROM_RULE,
        paid_by: str | None = None,
    ) -> bool:
        now = self._clock()
        payload = stored_json(result)

        def tx(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE receipts SET status='completed', result=?, error=NULL, completed_at=?, "
                "lease_id=NULL, lease_expires_at=NULL, credits=credits + ?, credits_source=?, "
                "paid_by=?, paid_credits=? "
                "WHERE key=? AND lease_id=? AND status IN ('running', 'ambiguous')",
                (payload, now, credits, credits_source, paid_by, credits, key, lease_id),
            )
            return cur.rowcount == 1

        return await self._db.write(tx)

    async def fail(self, key: str, *, lease_id: str, error: str) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE receipts SET status='failed', error=?, lease_id=NULL, "
                "lease_expires_at=NULL, sent_at=NULL "
                "WHERE key=? AND lease_id=? AND status='running'",
                (error[:2000], key, lease_id),
            )
            return cur.rowcount == 1

        return await self._db.write(tx)

    async def mark_ambiguous(self, key: str, *, lease_id: str, reason: str) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            # The lease id stays: it names the sender, whose answer may still arrive.
            cur = conn.execute(
                "UPDATE receipts SET status='ambiguous', error=?, lease_expires_at=NULL "
                "WHERE key=? AND lease_id=? AND status='running'",
                (reason[:2000], key, lease_id),
            )
            return cur.rowcount == 1

        return await self._db.write(tx)

    async def release(self, keys: Sequence[str], *, lease_id: str) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "UPDATE receipts SET lease_expires_at = 0 "
                "WHERE key=? AND lease_id=? AND status='running'",
                [(key, lease_id) for key in keys],
            )

        await self._db.write(tx)

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
        document = stored_json({"members": list(member_keys), "request": request})

        def tx(conn: sqlite3.Connection) -> bool:
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
            return await self._db.write(tx)
        except _Rollback:
            return False

    async def claim_batch(
        self,
        agg_key: str,
        *,
        owner: str,
        lease_id: str,
        ttl_s: float,
        ambiguous_if_sent: bool = False,
        retry_ambiguous: bool = False,
    ) -> BatchClaim:
        now = self._clock()

        def tx(conn: sqlite3.Connection) -> BatchClaim:
            row = conn.execute(
                "SELECT status, lease_id, lease_expires_at, request, sent_at, owner, error "
                "FROM receipts WHERE key = ?",
                (agg_key,),
            ).fetchone()
            if row is None or row[3] is None:
                raise LookupError(f"batch {agg_key} has no stored request")
            status, held, expires, doc, sent_at, sender, error = row
            document = json.loads(doc)
            members: list[str] = document["members"]
            if status == "completed":
                return BatchClaim(ClaimStatus.HIT, members, document["request"])
            if status == "running" and held != lease_id and (expires or 0) > now:
                return BatchClaim(ClaimStatus.HELD, members, document["request"])
            if not retry_ambiguous and (
                status == "ambiguous"
                or (ambiguous_if_sent and sent_at is not None and held != lease_id)
            ):
                reason = error if status == "ambiguous" else batch_sent_reason(sender)
                conn.execute(
                    "UPDATE receipts SET status='ambiguous', error=?, lease_expires_at=NULL "
                    "WHERE (key = ? OR batch_key = ?) AND status IN ('running', 'failed')",
                    (reason, agg_key, agg_key),
                )
                return BatchClaim(
                    ClaimStatus.AMBIGUOUS,
                    members,
                    document["request"],
                    reason=reason,
                    became_ambiguous=status != "ambiguous",
                )
            conn.execute(
                "UPDATE receipts SET status='running', owner=?, lease_id=?, "
                "lease_expires_at=?, sent_at=NULL, attempts=attempts + 1 WHERE key = ?",
                (owner, lease_id, now + ttl_s, agg_key),
            )
            conn.execute(
                "UPDATE receipts SET status='running', owner=?, lease_id=?, "
                "lease_expires_at=? WHERE batch_key = ? AND status != 'completed'",
                (owner, lease_id, now + ttl_s, agg_key),
            )
            return BatchClaim(ClaimStatus.CLAIMED, members, document["request"])

        return await self._db.write(tx)

    async def complete_batch(
        self,
        agg_key: str,
        *,
        lease_id: str,
        results: dict[str, Any],
        member_credits: Mapping[str, float],
        credits_source: str = CREDITS_FROM_RULE,
        member_paid_by: Mapping[str, str] | None = None,
    ) -> bool:
        now = self._clock()
        payers = member_paid_by or {}

        def tx(conn: sqlite3.Connection) -> bool:
            fenced = conn.execute(
                "UPDATE receipts SET status='completed', completed_at=?, lease_id=NULL, "
                "lease_expires_at=NULL, error=NULL, result=?, credits_source=? "
                "WHERE key=? AND lease_id=? AND status IN ('running', 'ambiguous')",
                (now, stored_json({"members": len(results)}), credits_source, agg_key, lease_id),
            ).rowcount
            if fenced != 1:
                raise _Rollback
            # Members completed once: a resumed batch does not re-complete (or
            # re-credit) a member an earlier attempt recorded.
            pending = _unfinished_members(conn, agg_key, list(results))
            conn.executemany(
                "UPDATE receipts SET status='completed', result=?, error=NULL, "
                "completed_at=?, lease_id=NULL, lease_expires_at=NULL, "
                "credits=credits + ?, credits_source=?, paid_by=?, paid_credits=? "
                "WHERE key=? AND batch_key=? AND status <> 'completed'",
                [
                    (
                        stored_json(results[key]),
                        now,
                        float(member_credits.get(key, 0.0)),
                        credits_source,
                        payers.get(key),
                        float(member_credits.get(key, 0.0)),
                        key,
                        agg_key,
                    )
                    for key in pending
                ],
            )
            total = sum(float(member_credits.get(key, 0.0)) for key in pending)
            conn.execute("UPDATE receipts SET credits=credits + ? WHERE key=?", (total, agg_key))
            return True

        try:
            return await self._db.write(tx)
        except _Rollback:
            return False

    async def fail_batch(
        self, agg_key: str, *, lease_id: str, error: str, release_members: bool
    ) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            owned = conn.execute(
                "UPDATE receipts SET status='failed', error=?, lease_id=NULL, "
                "lease_expires_at=NULL, sent_at=NULL "
                "WHERE key=? AND lease_id=? AND status='running'",
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

        await self._db.write(tx)

    async def mark_batch_ambiguous(self, agg_key: str, *, lease_id: str, reason: str) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            owned = conn.execute(
                "UPDATE receipts SET status='ambiguous', error=?, lease_expires_at=NULL "
                "WHERE key=? AND lease_id=? AND status='running'",
                (reason[:2000], agg_key, lease_id),
            ).rowcount
            if owned != 1:
                return False
            conn.execute(
                "UPDATE receipts SET status='ambiguous', error=?, lease_expires_at=NULL "
                "WHERE batch_key=? AND status IN ('running', 'failed')",
                (reason[:2000], agg_key),
            )
            return True

        return await self._db.write(tx)

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        def read(conn: sqlite3.Connection) -> dict[str, Receipt]:
            found: dict[str, Receipt] = {}
            for start in range(0, len(keys), 500):
                batch = list(keys[start : start + 500])
                marks = ",".join("?" * len(batch))
                for row in conn.execute(
                    "SELECT key, tool_id, status, result, error, owner, lease_id, "
                    "lease_expires_at, completed_at, attempts, credits, sent_at, generation, "
                    f"credits_source FROM receipts WHERE key IN ({marks})",
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
                        sent_at=row[11],
                        generation=row[12],
                        credits_source=row[13],
                    )
            return found

        return await self._db.read(read)

    async def sample(self, tool_id: str, limit: int = 1000) -> list[tuple[Any, float | None]]:
        def read(conn: sqlite3.Connection) -> list[tuple[Any, float | None]]:
            return [
                (json.loads(row[0]) if row[0] is not None else None, row[1])
                for row in conn.execute(
                    "SELECT result, credits FROM receipts "
                    "WHERE tool_id = ? AND status = 'completed' "
                    "ORDER BY completed_at DESC LIMIT ?",
                    (tool_id, limit),
                )
            ]

        return await self._db.read(read)

    async def run_receipts(self, prefix: str) -> list[ToolReceipts]:
        def read(conn: sqlite3.Connection) -> list[ToolReceipts]:
            return [
                ToolReceipts(
                    row[0], int(row[1]), float(row[2]), int(row[3]), int(row[4]), float(row[5] or 0)
                )
                for row in conn.execute(_RUN_RECEIPTS, {"prefix": prefix, "n": len(prefix)})
            ]

        return await self._db.read(read)

    async def close(self) -> None:
        await self._db.close()


#: A run's receipts per tool: paid by its rows, or last sent by its attempts.
_RUN_RECEIPTS = (
    "SELECT tool_id,"
    " SUM(CASE WHEN status = 'completed' AND substr(paid_by, 1, :n) = :prefix"
    " THEN 1 ELSE 0 END),"
    " SUM(CASE WHEN status = 'completed' AND substr(paid_by, 1, :n) = :prefix"
    " THEN COALESCE(paid_credits, credits) ELSE 0 END),"
    " SUM(CASE WHEN status = 'ambiguous' AND substr(owner, 1, :n) = :prefix THEN 1 ELSE 0 END),"
    " SUM(CASE WHEN substr(owner, 1, :n) = :prefix OR substr(paid_by, 1, :n) = :prefix"
    " THEN resends ELSE 0 END),"
    " SUM(CASE WHEN status = 'completed' AND substr(paid_by, 1, :n) = :prefix"
    " AND instr(paid_by, '#') = 0 THEN COALESCE(paid_credits, credits) ELSE 0 END)"
    " FROM receipts WHERE (substr(paid_by, 1, :n) = :prefix OR substr(owner, 1, :n) = :prefix)"
    " AND tool_id NOT LIKE '%#batch' GROUP BY tool_id ORDER BY tool_id"
)


def _unfinished_members(conn: sqlite3.Connection, agg_key: str, keys: list[str]) -> list[str]:
    """Which of ``keys`` are members of ``agg_key`` not completed yet: the ones a
    settlement completes, and so the ones it credits to the aggregate."""
    found: list[str] = []
    for start in range(0, len(keys), 500):
        page = keys[start : start + 500]
        marks = ",".join("?" * len(page))
        found.extend(
            row[0]
            for row in conn.execute(
                f"SELECT key FROM receipts WHERE key IN ({marks}) AND batch_key = ? "
                "AND status <> 'completed'",
                [*page, agg_key],
            )
        )
    chosen = set(found)
    return [key for key in keys if key in chosen]


class _Rollback(Exception):
    """Raised inside a write to undo it (its savepoint) and report ``False``."""
