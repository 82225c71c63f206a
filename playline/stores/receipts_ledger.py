"""``ReceiptLedger``: the receipt store, one implementation for SQLite and PostgreSQL.

See :mod:`playline.stores.receipts` for the states, the claim rule and the contract.
The hot calls (claims, sent marks and settlements of every chunk a worker runs) are
written in groups, each group by one function of a
:class:`~playline.db.conn.Conn`:

* on SQLite each call is a write of its own, and the file's group commit
  (:mod:`playline.db.sqlite`) commits the writes of a tick together; a group of the
  store's own in front of it would only add a loop tick per call;
* on PostgreSQL, which runs one transaction per write, the store coalesces the calls
  of a tick itself (:mod:`~playline.db.coalesce`): one transaction per group.

A claim group inserts, where rows rather than the database are locked, the keys
that have no receipt yet (``ON CONFLICT DO NOTHING``, so two workers racing for a
new key queue on it instead of both taking it), locks every key's row in key order
(the dialect's ``FOR UPDATE``; SQLite's write already holds the file), applies
:func:`~playline.stores.receipts.decide_claim` in submission order (two chunks asking
for one key in the same group get CLAIMED and HELD) and writes every lease taken.
A settlement or sent-mark group locks its rows, applies the lease fence in order and
writes the ones that hold; a lone one is one fenced statement. Each group costs a
fixed number of statements per 500 keys plus one ``executemany`` per kind of change,
and rows are always locked in key order, so concurrent PostgreSQL workers never
deadlock on each other's groups (a deadlock or serialization failure is retried
anyway). Batches (bulk endpoints) are rare and are one write each.

The tables: the file ``receipts.db`` (its ``user_version`` continues the numbering
of the SQLite store this replaced, so a file it left is at a known version), and the
``receipts`` component in PostgreSQL, whose first version adopts the table the
``stores`` component of the code before created (``IF NOT EXISTS``). A worker
creates them (``create``); a client only reads a store a worker made and upgraded.
Times come from the database's clock (SQLite: this machine's) unless a ``clock`` is
given.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Self, TypeVar

from playline.db.coalesce import Coalescer
from playline.db.conn import Conn, Params, chunks
from playline.db.dialect import marks
from playline.db.engine import Database
from playline.db.migrations import Migration, Schema
from playline.db.ready import ReadyOnFirstUse
from playline.db.store import LedgerStore
from playline.stores.receipts import (
    CREDITS_FROM_RULE,
    STATE_COLUMNS,
    BatchClaim,
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    Receipt,
    RunCall,
    StoredState,
    ToolReceipts,
    batch_sent_reason,
    decide_claim,
    stored_json,
)
from playline.stores.rows import record_columns, record_from_row

__all__ = ["SCHEMA", "ReceiptLedger"]

Item = TypeVar("Item")
Result = TypeVar("Result")


def _add_batch_columns(conn: Conn) -> None:
    """Files created before bulk endpoints (and before versioned migrations) lack the
    batch columns; files of version 1 and later have them."""
    present = {row[1] for row in conn.all("PRAGMA table_info(receipts)")}
    for name in ("batch_key", "request"):
        if name not in present:
            conn.execute(f"ALTER TABLE receipts ADD COLUMN {name} TEXT")


#: The receipts table as the code before created it last (``stores`` component,
#: versions 1-6), so a database it left is adopted as it is.
_POSTGRES_TABLE = (
    "CREATE TABLE IF NOT EXISTS playline_receipts ("
    " key text PRIMARY KEY, tool_id text NOT NULL, status text NOT NULL,"
    " result text, error text, owner text, lease_id text, lease_expires_at float8,"
    " created_at float8 NOT NULL, completed_at float8,"
    " attempts integer NOT NULL DEFAULT 0, credits float8 NOT NULL DEFAULT 0,"
    " batch_key text, request text, sent_at float8,"
    " generation integer NOT NULL DEFAULT 0, forced_by text, credits_source text,"
    " paid_by text, paid_credits float8, resends integer NOT NULL DEFAULT 0)"
)

SCHEMA = Schema(
    "receipts",
    (
        Migration(
            1,
            "receipts (SQLite files from before versioned migrations keep theirs; "
            "PostgreSQL adopts the table the 'stores' component made)",
            sqlite=(
                "CREATE TABLE IF NOT EXISTS receipts (key TEXT PRIMARY KEY,"
                " tool_id TEXT NOT NULL, status TEXT NOT NULL, result TEXT, error TEXT,"
                " owner TEXT, lease_id TEXT, lease_expires_at REAL, created_at REAL NOT NULL,"
                " completed_at REAL, attempts INTEGER NOT NULL DEFAULT 0,"
                " credits REAL NOT NULL DEFAULT 0, batch_key TEXT, request TEXT)",
            ),
            postgres=(
                _POSTGRES_TABLE,
                # a database the old code left at an earlier version of 'stores'
                "ALTER TABLE playline_receipts ADD COLUMN IF NOT EXISTS sent_at float8,"
                " ADD COLUMN IF NOT EXISTS generation integer NOT NULL DEFAULT 0,"
                " ADD COLUMN IF NOT EXISTS forced_by text,"
                " ADD COLUMN IF NOT EXISTS credits_source text,"
                " ADD COLUMN IF NOT EXISTS paid_by text,"
                " ADD COLUMN IF NOT EXISTS paid_credits float8,"
                " ADD COLUMN IF NOT EXISTS resends integer NOT NULL DEFAULT 0",
                "CREATE INDEX IF NOT EXISTS playline_receipts_batch ON playline_receipts"
                " (batch_key) WHERE batch_key IS NOT NULL",
                "CREATE INDEX IF NOT EXISTS playline_receipts_tool_completed"
                " ON playline_receipts (tool_id, completed_at) WHERE status = 'completed'",
            ),
            sqlite_apply=_add_batch_columns,
        ),
        Migration(
            2,
            "find a batch's members by their batch",
            sqlite=("CREATE INDEX IF NOT EXISTS receipts_batch ON receipts (batch_key)",),
            postgres=(),
        ),
        Migration(
            3,
            "sent marks, generations and forcing runs (idempotency contracts, ambiguous calls)",
            sqlite=(
                "ALTER TABLE receipts ADD COLUMN sent_at REAL",
                "ALTER TABLE receipts ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE receipts ADD COLUMN forced_by TEXT",
            ),
            postgres=(),
        ),
        Migration(
            4,
            "where a receipt's credits came from (the provider's report or the billing rule)",
            sqlite=("ALTER TABLE receipts ADD COLUMN credits_source TEXT",),
            postgres=(),
        ),
        Migration(
            5,
            "who paid for a receipt's answer (a dataset row), so its retry reads it as its own",
            sqlite=("ALTER TABLE receipts ADD COLUMN paid_by TEXT",),
            postgres=(),
        ),
        Migration(
            6,
            "find a tool's latest completed receipts (an estimate's hit rates and prices)",
            sqlite=(
                "CREATE INDEX IF NOT EXISTS receipts_tool_completed ON receipts "
                "(tool_id, completed_at) WHERE status = 'completed'",
            ),
            postgres=(),
        ),
        Migration(
            7,
            "what each answer cost on its own and how often a call was sent again (a run's audit)",
            sqlite=(
                "ALTER TABLE receipts ADD COLUMN paid_credits REAL",
                "ALTER TABLE receipts ADD COLUMN resends INTEGER NOT NULL DEFAULT 0",
            ),
            postgres=(),
        ),
        Migration(
            8,
            "one name for the table on both databases (SQLite's takes PostgreSQL's)",
            sqlite=("ALTER TABLE receipts RENAME TO playline_receipts",),
            postgres=(),
        ),
    ),
)

#: Errors are kept this long (a provider's message, a traceback's last line).
_ERROR_CHARS = 2000

#: What :meth:`ReceiptLedger.get` reads of a receipt: :class:`Receipt`'s fields, in order.
_RECEIPT_COLUMNS = ", ".join(record_columns(Receipt))

#: A placeholder for a key with no receipt yet, claimed by the same group: running
#: with an expired lease and never sent, which the claim rule takes like a missing one.
_INSERT_MISSING = (
    "INSERT INTO playline_receipts (key, tool_id, status, lease_expires_at, created_at,"
    " attempts) VALUES (?, ?, 'running', 0, ?, 0) ON CONFLICT (key) DO NOTHING"
)
#: A new receipt's lease, where no other writer can have inserted the key since the
#: group read it (the write holds the whole file).
_INSERT_GRANTED = (
    "INSERT INTO playline_receipts (owner, lease_id, lease_expires_at, attempts, generation,"
    " forced_by, batch_key, resends, key, tool_id, status, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?)"
)
_GRANT = (
    "UPDATE playline_receipts SET status = 'running', owner = ?, lease_id = ?,"
    " lease_expires_at = ?, error = NULL, sent_at = NULL, attempts = attempts + ?,"
    " generation = ?, forced_by = ?, batch_key = ?, resends = resends + ? WHERE key = ?"
)
#: A receipt a claim found sent and never settled (a tool that does not de-duplicate).
_AMBIGUATE = (
    "UPDATE playline_receipts SET status = 'ambiguous', error = ?, lease_expires_at = NULL"
    " WHERE key = ?"
)
# Settlements keep their lease fence in SQL too; the group already checked it under
# the row locks, so these change exactly the rows it counted.
_COMPLETE = (
    "UPDATE playline_receipts SET status = 'completed', result = ?, error = NULL,"
    " completed_at = ?, lease_id = NULL, lease_expires_at = NULL, credits = credits + ?,"
    " credits_source = ?, paid_by = ?, paid_credits = ?"
    " WHERE key = ? AND lease_id = ? AND status IN ('running', 'ambiguous')"
)
_FAIL = (
    "UPDATE playline_receipts SET status = 'failed', error = ?, lease_id = NULL,"
    " lease_expires_at = NULL, sent_at = NULL"
    " WHERE key = ? AND lease_id = ? AND status = 'running'"
)
# The lease id stays: it names the sender, whose answer may still arrive.
_MARK_AMBIGUOUS = (
    "UPDATE playline_receipts SET status = 'ambiguous', error = ?, lease_expires_at = NULL"
    " WHERE key = ? AND lease_id = ? AND status = 'running'"
)
_MARK_SENT = (
    "UPDATE playline_receipts SET sent_at = ?, lease_expires_at = ?"
    " WHERE key = ? AND lease_id = ? AND status = 'running'"
)
_RENEW = (
    "UPDATE playline_receipts SET lease_expires_at = ?"
    " WHERE key = ? AND lease_id = ? AND status = 'running'"
)
_RELEASE = (
    "UPDATE playline_receipts SET lease_expires_at = 0"
    " WHERE key = ? AND lease_id = ? AND status = 'running'"
)

#: A run's receipts per tool: paid by its rows, or last sent by its attempts. Every
#: pair of parameters is the prefix's length and the prefix.
_PAID = "status = 'completed' AND substr(paid_by, 1, ?) = ?"
_RUN_RECEIPTS = (
    "SELECT tool_id,"
    f" SUM(CASE WHEN {_PAID} THEN 1 ELSE 0 END),"
    f" SUM(CASE WHEN {_PAID} THEN COALESCE(paid_credits, credits) ELSE 0 END),"
    " SUM(CASE WHEN status = 'ambiguous' AND substr(owner, 1, ?) = ? THEN 1 ELSE 0 END),"
    " SUM(resends),"
    f" SUM(CASE WHEN {_PAID} AND paid_by NOT LIKE '%#%'"
    " THEN COALESCE(paid_credits, credits) ELSE 0 END)"
    " FROM playline_receipts"
    " WHERE (substr(paid_by, 1, ?) = ? OR substr(owner, 1, ?) = ?)"
    " AND tool_id NOT LIKE '%#batch' GROUP BY tool_id ORDER BY tool_id"
)
#: A run's receipts call by call (batches left out: their members are the calls).
_RUN_CALLS = (
    "SELECT key, tool_id, status,"
    f" CASE WHEN {_PAID} THEN COALESCE(paid_credits, credits) ELSE 0 END,"
    " credits_source, paid_by, owner FROM playline_receipts"
    " WHERE (substr(paid_by, 1, ?) = ? OR substr(owner, 1, ?) = ?)"
    " AND tool_id NOT LIKE '%#batch' ORDER BY key"
)
#: how many (length, prefix) pairs ``_RUN_RECEIPTS`` takes
_RUN_PARAMS = _RUN_RECEIPTS.count("?") // 2


@dataclass(frozen=True, slots=True)
class _Claim:
    requests: Sequence[ClaimRequest]
    owner: str
    lease_id: str
    ttl_s: float


@dataclass(frozen=True, slots=True)
class _Settlement:
    key: str
    lease_id: str
    status: str  # "completed", "failed" or "ambiguous"
    result: str | None = None
    error: str | None = None
    credits: float = 0.0
    credits_source: str | None = None
    paid_by: str | None = None


@dataclass(frozen=True, slots=True)
class _Send:
    keys: Sequence[str]
    lease_id: str
    ttl_s: float


@dataclass(frozen=True, slots=True)
class _Grant:
    owner: str
    lease_id: str
    expires: float
    claims: int  # how many claims of the group took it (attempts grow by as many)
    generation: int
    forced_by: str | None
    batch_key: str | None
    resends: int = 0  # how many of those claims send an unanswered call again


def _plan_claims(
    calls: Sequence[_Claim], rows: dict[str, StoredState], now: float
) -> tuple[list[list[ClaimOutcome]], dict[str, _Grant], dict[str, str]]:
    """Apply the claim rule to a group's calls in order: the outcomes, the leases taken
    and the receipts found ambiguous (key -> reason).

    ``rows`` holds each key's locked receipt and is updated as leases are taken, so a
    later call of the group sees an earlier one's lease, exactly as it would in a
    transaction of its own.
    """
    outcomes: list[list[ClaimOutcome]] = []
    grants: dict[str, _Grant] = {}
    ambiguous: dict[str, str] = {}
    for call in calls:
        mine: list[ClaimOutcome] = []
        for req in call.requests:
            row = rows.get(req.key)
            outcome = decide_claim(req, row, now=now, lease_id=call.lease_id, ttl_s=call.ttl_s)
            if outcome.status is ClaimStatus.CLAIMED:
                expires = outcome.lease_expires_at or now + call.ttl_s
                earlier = grants.get(req.key)
                forced_by = req.force_token if req.force else None
                grants[req.key] = _Grant(
                    call.owner,
                    call.lease_id,
                    expires,
                    (earlier.claims if earlier else 0) + 1,
                    outcome.generation,
                    forced_by,
                    outcome.batch_key,
                    (earlier.resends if earlier else 0) + int(outcome.resent),
                )
                base = row or StoredState(
                    "running", None, None, None, None, None, None, None, 0, None, None
                )
                rows[req.key] = base._replace(
                    status="running",
                    owner=call.owner,
                    lease_id=call.lease_id,
                    lease_expires_at=expires,
                    sent_at=None,
                    generation=outcome.generation,
                    forced_by=forced_by,
                    batch_key=outcome.batch_key,
                    error=None,
                )
            elif outcome.became_ambiguous and row is not None:
                ambiguous[req.key] = outcome.reason or ""
                rows[req.key] = row._replace(
                    status="ambiguous", error=outcome.reason, lease_expires_at=None
                )
            mine.append(outcome)
        outcomes.append(mine)
    return outcomes, grants, ambiguous


@lru_cache(maxsize=256)
def _select_locked(columns: str, count: int, for_update: str) -> str:
    """``SELECT key, columns`` of ``count`` keys, locked in key order (built once per
    size: a group's statements are a handful of sizes)."""
    return (
        f"SELECT key, {columns} FROM playline_receipts"
        f" WHERE key IN ({marks(count)}) ORDER BY key{for_update}"
    )


def _locked_states(conn: Conn, keys: Sequence[str]) -> dict[str, StoredState]:
    """The claim rule's view of each of ``keys`` (sorted), their rows locked in order."""
    found: dict[str, StoredState] = {}
    for page in chunks(keys, conn.dialect.max_params):
        sql = _select_locked(STATE_COLUMNS, len(page), conn.dialect.for_update)
        for row in conn.all(sql, page):
            found[row[0]] = StoredState(*row[1:])
    return found


def _locked_leases(conn: Conn, keys: Iterable[str]) -> dict[str, tuple[str, str | None]]:
    """``(status, lease_id)`` of each of ``keys`` that has a receipt, rows locked in
    key order: what a lease fence checks."""
    ordered = sorted(set(keys))
    found: dict[str, tuple[str, str | None]] = {}
    for page in chunks(ordered, conn.dialect.max_params):
        sql = _select_locked("status, lease_id", len(page), conn.dialect.for_update)
        for key, status, lease_id in conn.all(sql, page):
            found[key] = (status, lease_id)
    return found


def _many(conn: Conn, sql: str, rows: Sequence[Params]) -> None:
    """``conn.many``, or one plain statement for one row (the common case of a call
    written on its own, cheaper than a batch of one)."""
    if len(rows) == 1:
        conn.execute(sql, rows[0])
    elif rows:
        conn.many(sql, rows)


def _lock_members(conn: Conn, agg_key: str) -> None:
    """Lock a batch's members in key order before changing them (PostgreSQL; SQLite's
    write holds the file), as every other group locks rows."""
    if conn.dialect.for_update:
        conn.all(
            "SELECT key FROM playline_receipts WHERE batch_key = ?"
            f" ORDER BY key{conn.dialect.for_update}",
            [agg_key],
        )


def _end_batch(
    conn: Conn,
    agg_key: str,
    lease_id: str,
    message: str,
    *,
    agg_set: str,
    member_set: str,
    members: str,
) -> bool:
    """Mark a batch's aggregate, if ``lease_id`` still holds it running, then the members
    the condition ``members`` picks; both get ``message`` as their error, and the columns
    ``agg_set`` / ``member_set`` assign. False, and nothing written, when the lease no
    longer holds the aggregate."""
    owned = conn.execute(
        f"UPDATE playline_receipts SET {agg_set}, error = ?"
        " WHERE key = ? AND lease_id = ? AND status = 'running'",
        [message, agg_key, lease_id],
    )
    if owned != 1:
        return False
    _lock_members(conn, agg_key)
    conn.execute(
        f"UPDATE playline_receipts SET {member_set}, error = ? WHERE batch_key = ? AND {members}",
        [message, agg_key],
    )
    return True


def _write_in_order(conn: Conn, writes: list[tuple[str, Params]]) -> None:
    """Run ``writes`` in order, consecutive ones of one statement as one ``many``."""
    start = 0
    while start < len(writes):
        sql = writes[start][0]
        end = start
        while end < len(writes) and writes[end][0] == sql:
            end += 1
        _many(conn, sql, [params for _, params in writes[start:end]])
        start = end


class ReceiptLedger(LedgerStore):
    """Receipts on either database; safe across processes (SQLite) and workers.

    Build it with :meth:`in_file` (SQLite, ``Settings.receipts_path``) or
    :meth:`in_database` (PostgreSQL); it is opened by its first use, or at once with
    :meth:`ensure_open`. ``clock``: for leases and completions (default: the
    database's).
    """

    SCHEMA = SCHEMA

    def __init__(self, ready: ReadyOnFirstUse, *, clock: Callable[[], float] | None = None) -> None:
        super().__init__(ready, clock=clock)
        self._claims: Coalescer[_Claim, list[ClaimOutcome]] = Coalescer(
            self._group_writer(self._claim_group)
        )
        self._settlements: Coalescer[_Settlement, bool] = Coalescer(
            self._group_writer(self._settle_group)
        )
        self._sends: Coalescer[_Send, list[bool]] = Coalescer(self._group_writer(self._send_group))

    @classmethod
    def in_file(
        cls, path: str | Path, *, clock: Callable[[], float] | None = None, create: bool = True
    ) -> Self:
        """Receipts in a SQLite file of their own. ``create``: a worker's store (the
        file is created and migrated); ``False``: a client's, which must find it."""
        return cls(ReadyOnFirstUse.file(path, SCHEMA, create=create), clock=clock)

    @classmethod
    def in_database(
        cls, db: Database, *, clock: Callable[[], float] | None = None, create: bool = True
    ) -> Self:
        """Receipts in a database shared with other stores (PostgreSQL's pool);
        ``create`` as for :meth:`in_file`."""
        return cls(ReadyOnFirstUse.shared(db, SCHEMA, create=create), clock=clock)

    async def ensure_open(self) -> Self:
        """Open (and migrate, or check) the store now rather than on first use: a
        worker's store is there from its start, and a store that is missing or newer
        than this playline is refused when it is opened."""
        try:
            await self._ready()
        except BaseException:
            await self._ready.close()
            raise
        return self

    async def _write(self, fn: Callable[[Conn], Any]) -> Any:
        return await (await self._ready()).write(fn)

    async def _read(self, fn: Callable[[Conn], Any]) -> Any:
        return await (await self._ready()).read(fn)

    async def _write_or_false(self, fn: Callable[[Conn], bool]) -> bool:
        """``fn``'s answer, written; ``False`` (nothing written) when it raised
        :class:`_Rollback`."""
        try:
            result: bool = await self._write(fn)
        except _Rollback:
            return False
        return result

    def _group_writer(
        self, group_tx: Callable[[Conn, list[Item]], Sequence[Result]]
    ) -> Callable[[list[Item]], Awaitable[Sequence[Result]]]:
        """A coalescer's flush: the whole group in one write function."""

        async def flush(group: list[Item]) -> Sequence[Result]:
            result: Sequence[Result] = await self._write(lambda conn: group_tx(conn, group))
            return result

        return flush

    async def _grouped(
        self,
        coalescer: Coalescer[Item, Result],
        group_tx: Callable[[Conn, list[Item]], Sequence[Result]],
        item: Item,
    ) -> Result:
        """``item`` written with the others of its group. A database that commits the
        writes of a tick together (SQLite) groups them itself, so the item goes
        straight to it, one write function each, with no wait for the store's own
        group; otherwise (PostgreSQL) the store's coalescer makes the group, one
        transaction for all of it."""
        db = await self._ready()
        if db.groups_writes:
            [result] = await db.write(lambda conn: group_tx(conn, [item]))
            return result
        return await coalescer.submit(item)

    # ------------------------------------------------------------------ claims

    async def claim(
        self, requests: Sequence[ClaimRequest], *, owner: str, lease_id: str, ttl_s: float
    ) -> list[ClaimOutcome]:
        if not requests:
            return []
        call = _Claim(list(requests), owner, lease_id, ttl_s)
        return await self._grouped(self._claims, self._claim_group, call)

    def _claim_group(self, conn: Conn, calls: list[_Claim]) -> list[list[ClaimOutcome]]:
        now = self._now(conn)
        tools: dict[str, str] = {}
        for call in calls:
            for req in call.requests:
                tools.setdefault(req.key, req.tool_id)
        keys = sorted(tools)
        if conn.dialect.for_update:
            # Rows are locked, not the database: a key missing now could be inserted
            # by another worker before this group writes it, and both would take it.
            # Inserted first, its row exists and is locked (below) like any other.
            _many(conn, _INSERT_MISSING, [(key, tools[key], now) for key in keys])
        rows = _locked_states(conn, keys)
        found = set(rows)
        outcomes, grants, ambiguous = _plan_claims(calls, rows, now)
        updates: list[Params] = []
        inserts: list[Params] = []
        for key, g in sorted(grants.items()):
            lease = (g.owner, g.lease_id, g.expires, g.claims, g.generation, g.forced_by)
            if key in found:
                updates.append((*lease, g.batch_key, g.resends, key))
            else:
                inserts.append((*lease, g.batch_key, g.resends, key, tools[key], now))
        _many(conn, _GRANT, updates)
        _many(conn, _INSERT_GRANTED, inserts)
        _many(conn, _AMBIGUATE, [(ambiguous[key], key) for key in sorted(ambiguous)])
        return outcomes

    async def renew(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        if not keys:
            return []

        def tx(conn: Conn) -> list[bool]:
            expires = self._now(conn) + ttl_s
            held = _held(_locked_leases(conn, keys), lease_id)
            conn.many(_RENEW, [(expires, key, lease_id) for key in sorted(held)])
            return [key in held for key in keys]

        result: list[bool] = await self._write(tx)
        return result

    async def release(self, keys: Sequence[str], *, lease_id: str) -> None:
        if not keys:
            return

        def tx(conn: Conn) -> None:
            conn.many(_RELEASE, [(key, lease_id) for key in sorted(set(keys))])

        await self._write(tx)

    async def mark_sent(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        if not keys:
            return []
        send = _Send(list(keys), lease_id, ttl_s)
        return await self._grouped(self._sends, self._send_group, send)

    def _send_group(self, conn: Conn, group: list[_Send]) -> list[list[bool]]:
        now = self._now(conn)
        if len(group) == 1 and len(group[0].keys) == 1:  # the fenced statement says
            [key], lease_id, ttl_s = group[0].keys, group[0].lease_id, group[0].ttl_s
            return [[conn.execute(_MARK_SENT, (now, now + ttl_s, key, lease_id)) == 1]]
        leases = _locked_leases(conn, (key for send in group for key in send.keys))
        marked: list[list[bool]] = []
        writes: list[Params] = []
        for send in group:
            mine = []
            for key in send.keys:
                held = leases.get(key) == ("running", send.lease_id)
                if held:
                    writes.append((now, now + send.ttl_s, key, send.lease_id))
                mine.append(held)
            marked.append(mine)
        _many(conn, _MARK_SENT, writes)
        return marked

    # ------------------------------------------------------------------ settlements

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
        settlement = _Settlement(
            key,
            lease_id,
            "completed",
            result=stored_json(result),
            credits=float(credits),
            credits_source=credits_source,
            paid_by=paid_by,
        )
        return await self._grouped(self._settlements, self._settle_group, settlement)

    async def fail(self, key: str, *, lease_id: str, error: str) -> bool:
        settlement = _Settlement(key, lease_id, "failed", error=error[:_ERROR_CHARS])
        return await self._grouped(self._settlements, self._settle_group, settlement)

    async def mark_ambiguous(self, key: str, *, lease_id: str, reason: str) -> bool:
        settlement = _Settlement(key, lease_id, "ambiguous", error=reason[:_ERROR_CHARS])
        return await self._grouped(self._settlements, self._settle_group, settlement)

    def _settle_group(self, conn: Conn, group: list[_Settlement]) -> list[bool]:
        now = self._now(conn)
        if len(group) == 1:  # one fenced statement says itself whether it took
            sql, params = _settlement_write(group[0], now)
            return [conn.execute(sql, params) == 1]
        leases = _locked_leases(conn, (s.key for s in group))
        settled: list[bool] = []
        writes: list[tuple[str, Params]] = []
        # In submission order, each seeing the ones before it, as separate
        # transactions would (a lease settles its key once, so repeats are rare).
        for s in group:
            status, held = leases.get(s.key, (None, None))
            ok = held == s.lease_id and (
                status == "running" or (status == "ambiguous" and s.status == "completed")
            )
            settled.append(ok)
            if ok:
                writes.append(_settlement_write(s, now))
                leases[s.key] = (s.status, s.lease_id if s.status == "ambiguous" else None)
        _write_in_order(conn, writes)
        return settled

    # ------------------------------------------------------------------ reads

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        if not keys:
            return {}
        wanted = list(dict.fromkeys(keys))

        def read(conn: Conn) -> dict[str, Receipt]:
            found: dict[str, Receipt] = {}
            for page in chunks(wanted, conn.dialect.max_params):
                for row in conn.all(
                    f"SELECT {_RECEIPT_COLUMNS} FROM playline_receipts"
                    f" WHERE key IN ({marks(len(page))})",
                    page,
                ):
                    found[row[0]] = record_from_row(Receipt, row, ("result",))
            return found

        result: dict[str, Receipt] = await self._read(read)
        return result

    async def sample(self, tool_id: str, limit: int = 1000) -> list[tuple[Any, float | None]]:
        def read(conn: Conn) -> list[tuple[Any, float | None]]:
            return [
                (json.loads(result) if result is not None else None, credits)
                for result, credits in conn.all(
                    "SELECT result, credits FROM playline_receipts"
                    " WHERE tool_id = ? AND status = 'completed'"
                    " ORDER BY completed_at DESC LIMIT ?",
                    [tool_id, int(limit)],
                )
            ]

        result: list[tuple[Any, float | None]] = await self._read(read)
        return result

    async def run_receipts(self, prefix: str) -> list[ToolReceipts]:
        def read(conn: Conn) -> list[ToolReceipts]:
            return [
                ToolReceipts(
                    row[0],
                    int(row[1]),
                    float(row[2]),
                    int(row[3]),
                    int(row[4] or 0),
                    float(row[5] or 0),
                )
                for row in conn.all(_RUN_RECEIPTS, [len(prefix), prefix] * _RUN_PARAMS)
            ]

        result: list[ToolReceipts] = await self._read(read)
        return result

    async def run_calls(self, prefix: str) -> list[RunCall]:
        def read(conn: Conn) -> list[RunCall]:
            return [
                RunCall(row[0], row[1], row[2], float(row[3] or 0), row[4], row[5], row[6])
                for row in conn.all(_RUN_CALLS, [len(prefix), prefix] * 3)
            ]

        result: list[RunCall] = await self._read(read)
        return result

    # ------------------------------------------------------------------ bulk endpoints

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
        document = stored_json({"members": list(member_keys), "request": request})

        def tx(conn: Conn) -> bool:
            now = self._now(conn)
            held = _held(_locked_leases(conn, member_keys), lease_id)
            if len(held) != len(set(member_keys)):
                raise _Rollback
            conn.many(
                "UPDATE playline_receipts SET batch_key = ?"
                " WHERE key = ? AND lease_id = ? AND status = 'running'",
                [(agg_key, key, lease_id) for key in sorted(held)],
            )
            conn.execute(
                "INSERT INTO playline_receipts (key, tool_id, status, owner, lease_id,"
                " lease_expires_at, created_at, attempts, request)"
                " VALUES (?, ?, 'running', ?, ?, ?, ?, 1, ?)"
                " ON CONFLICT (key) DO UPDATE SET status = 'running', owner = excluded.owner,"
                " lease_id = excluded.lease_id, lease_expires_at = excluded.lease_expires_at,"
                " request = excluded.request, attempts = playline_receipts.attempts + 1",
                [agg_key, f"{tool_id}#batch", owner, lease_id, now + ttl_s, now, document],
            )
            return True

        return await self._write_or_false(tx)

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
        def tx(conn: Conn) -> BatchClaim:
            now = self._now(conn)
            row = conn.one(
                "SELECT status, lease_id, lease_expires_at, request, sent_at, owner, error"
                f" FROM playline_receipts WHERE key = ?{conn.dialect.for_update}",
                [agg_key],
            )
            if row is None or row[3] is None:
                raise LookupError(f"batch {agg_key} has no stored request")
            status, held, expires, doc, sent_at, sender, error = row
            document = json.loads(doc)
            members: list[str] = document["members"]
            if status == "completed":
                return BatchClaim(ClaimStatus.HIT, members, document["request"])
            if status == "running" and held != lease_id and (expires or 0) > now:
                return BatchClaim(ClaimStatus.HELD, members, document["request"])
            _lock_members(conn, agg_key)
            if not retry_ambiguous and (
                status == "ambiguous"
                or (ambiguous_if_sent and sent_at is not None and held != lease_id)
            ):
                reason = error if status == "ambiguous" else batch_sent_reason(sender)
                conn.execute(
                    "UPDATE playline_receipts SET status = 'ambiguous', error = ?,"
                    " lease_expires_at = NULL WHERE (key = ? OR batch_key = ?)"
                    " AND status IN ('running', 'failed')",
                    [reason, agg_key, agg_key],
                )
                return BatchClaim(
                    ClaimStatus.AMBIGUOUS,
                    members,
                    document["request"],
                    reason=reason,
                    became_ambiguous=status != "ambiguous",
                )
            conn.execute(
                "UPDATE playline_receipts SET status = 'running', owner = ?, lease_id = ?,"
                " lease_expires_at = ?, sent_at = NULL, attempts = attempts + 1 WHERE key = ?",
                [owner, lease_id, now + ttl_s, agg_key],
            )
            conn.execute(
                "UPDATE playline_receipts SET status = 'running', owner = ?, lease_id = ?,"
                " lease_expires_at = ? WHERE batch_key = ? AND status <> 'completed'",
                [owner, lease_id, now + ttl_s, agg_key],
            )
            return BatchClaim(ClaimStatus.CLAIMED, members, document["request"])

        result: BatchClaim = await self._write(tx)
        return result

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
        payers = member_paid_by or {}
        payloads = {key: stored_json(value) for key, value in results.items()}
        summary = stored_json({"members": len(results)})

        def tx(conn: Conn) -> bool:
            now = self._now(conn)
            # The aggregate first (fenced, and locked before its members, as every
            # batch transaction locks them), then the members, then what they cost.
            fenced = conn.execute(
                "UPDATE playline_receipts SET status = 'completed', completed_at = ?,"
                " lease_id = NULL, lease_expires_at = NULL, error = NULL, result = ?,"
                " credits_source = ?"
                " WHERE key = ? AND lease_id = ? AND status IN ('running', 'ambiguous')",
                [now, summary, credits_source, agg_key, lease_id],
            )
            if fenced != 1:
                raise _Rollback
            # Members are completed once: a resumed batch does not re-complete (or
            # re-credit) a member an earlier attempt recorded.
            pending = _unfinished_members(conn, agg_key, list(results))
            conn.many(
                "UPDATE playline_receipts SET status = 'completed', result = ?, error = NULL,"
                " completed_at = ?, lease_id = NULL, lease_expires_at = NULL,"
                " credits = credits + ?, credits_source = ?, paid_by = ?, paid_credits = ?"
                " WHERE key = ? AND batch_key = ? AND status <> 'completed'",
                [
                    (
                        payloads[key],
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
            conn.execute(
                "UPDATE playline_receipts SET credits = credits + ? WHERE key = ?",
                [total, agg_key],
            )
            return True

        return await self._write_or_false(tx)

    async def fail_batch(
        self, agg_key: str, *, lease_id: str, error: str, release_members: bool
    ) -> None:
        message = error[:_ERROR_CHARS]
        release = ", batch_key = NULL" if release_members else ""

        def tx(conn: Conn) -> None:
            _end_batch(
                conn,
                agg_key,
                lease_id,
                message,
                agg_set="status = 'failed', lease_id = NULL, lease_expires_at = NULL,"
                " sent_at = NULL",
                member_set=f"status = 'failed', lease_id = NULL, lease_expires_at = NULL{release}",
                members="status <> 'completed'",
            )

        await self._write(tx)

    async def mark_batch_ambiguous(self, agg_key: str, *, lease_id: str, reason: str) -> bool:
        message = reason[:_ERROR_CHARS]

        def tx(conn: Conn) -> bool:
            return _end_batch(
                conn,
                agg_key,
                lease_id,
                message,
                agg_set="status = 'ambiguous', lease_expires_at = NULL",
                member_set="status = 'ambiguous', lease_expires_at = NULL",
                members="status IN ('running', 'failed')",
            )

        result: bool = await self._write(tx)
        return result

    async def close(self) -> None:
        """Wait for queued claims, sent marks and settlements, then close the store's
        own file (SQLite); a shared database is closed by its owner."""
        await self._claims.drain()
        await self._sends.drain()
        await self._settlements.drain()
        await super().close()


def _settlement_write(s: _Settlement, now: float) -> tuple[str, Params]:
    """The fenced statement that records settlement ``s``."""
    if s.status == "completed":
        params = (s.result, now, s.credits, s.credits_source, s.paid_by, s.credits)
        return _COMPLETE, (*params, s.key, s.lease_id)
    if s.status == "failed":
        return _FAIL, (s.error, s.key, s.lease_id)
    return _MARK_AMBIGUOUS, (s.error, s.key, s.lease_id)


def _held(leases: Mapping[str, tuple[str, str | None]], lease_id: str) -> set[str]:
    """The keys of ``leases`` that ``lease_id`` holds (running under it)."""
    return {key for key, state in leases.items() if state == ("running", lease_id)}


def _unfinished_members(conn: Conn, agg_key: str, keys: list[str]) -> list[str]:
    """Which of ``keys`` are members of ``agg_key`` not completed yet (rows locked in
    key order): the ones a settlement completes, and so the ones it credits to the
    aggregate; in the order of ``keys``."""
    chosen: set[str] = set()
    for page in chunks(sorted(set(keys)), conn.dialect.max_params - 1):
        chosen.update(
            row[0]
            for row in conn.all(
                f"SELECT key FROM playline_receipts WHERE key IN ({marks(len(page))})"
                " AND batch_key = ? AND status <> 'completed'"
                f" ORDER BY key{conn.dialect.for_update}",
                [*page, agg_key],
            )
        )
    return [key for key in dict.fromkeys(keys) if key in chosen]


class _Rollback(Exception):
    """Raised inside a write to undo it and report ``False``."""
