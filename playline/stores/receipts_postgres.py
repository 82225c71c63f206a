"""``PostgresReceiptStore``: the receipt store for a fleet, in PostgreSQL.

See :mod:`playline.stores.receipts` for the states, the claim rule and the contract.
Every bulk operation is a fixed number of statements whatever the number of keys
(arrays passed to ``unnest``), and two of them coalesce across every chunk of the
worker (:mod:`~playline.db.coalesce`):

* **claims**: one transaction per group of ``claim`` calls: insert the keys that
  have no receipt yet, lock every key's row in key order, apply
  :func:`~playline.stores.receipts.decide_claim` in Python (in submission order,
  so two chunks asking for one key in the same group get CLAIMED and HELD), and
  write every lease taken in one ``UPDATE``;
* **settlements** (``complete`` and ``fail``): one fenced ``UPDATE`` per group.

Rows are always locked in key order, so concurrent workers never deadlock on
each other's groups (a deadlock or serialization failure is retried anyway).

Times (leases, completion) come from the database server's clock unless a
``clock`` is given (tests), so workers on different machines need not agree.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg

from playline.db.coalesce import Coalescer
from playline.stores.postgres_db import PostgresDatabase
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

__all__ = ["PostgresReceiptStore"]

#: The server's clock, or the caller's when a clock was injected (``%(now)s`` set).
_NOW: LiteralString = "COALESCE(%(now)s::float8, extract(epoch FROM statement_timestamp()))"


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
    result: str | None
    error: str | None
    credits: float
    credits_source: str | None = None
    paid_by: str | None = None


@dataclass(frozen=True, slots=True)
class _Send:
    key: str
    lease_id: str
    ttl_s: float


_INSERT_MISSING: LiteralString = (
    "INSERT INTO playline_receipts (key, tool_id, status, lease_expires_at, created_at, attempts)"
    " SELECT k, t, 'running', 0, " + _NOW + ", 0"
    " FROM unnest(%(keys)s::text[], %(tools)s::text[]) AS u(k, t) ORDER BY k"
    " ON CONFLICT (key) DO NOTHING"
)
_LOCK_FOR_CLAIM: LiteralString = (
    "SELECT key, " + STATE_COLUMNS + ", " + _NOW + " FROM playline_receipts"
    " WHERE key = ANY(%(keys)s::text[]) ORDER BY key FOR UPDATE"
)
_GRANT: LiteralString = (
    "UPDATE playline_receipts AS r SET status = 'running', owner = g.owner,"
    " lease_id = g.lease_id, lease_expires_at = g.expires, error = NULL, sent_at = NULL,"
    " attempts = r.attempts + g.claims, generation = g.generation, forced_by = g.forced_by,"
    " batch_key = g.batch_key, resends = r.resends + g.resends"
    " FROM unnest(%(keys)s::text[], %(owners)s::text[], %(leases)s::text[],"
    " %(expires)s::float8[], %(claims)s::int[], %(generations)s::int[],"
    " %(forced)s::text[], %(batches)s::text[], %(resends)s::int[])"
    " AS g(key, owner, lease_id, expires, claims, generation, forced_by, batch_key, resends)"
    " WHERE r.key = g.key"
)
#: Receipts a claim found sent and never settled (a tool that does not de-duplicate).
_AMBIGUATE: LiteralString = (
    "UPDATE playline_receipts AS r SET status = 'ambiguous', error = a.reason,"
    " lease_expires_at = NULL"
    " FROM unnest(%(keys)s::text[], %(reasons)s::text[]) AS a(key, reason) WHERE r.key = a.key"
)
#: One fenced statement for a whole group of completions and failures; rows are
#: locked in key order first, as claims lock them.
_SETTLE: LiteralString = (
    "WITH v AS (SELECT * FROM unnest(%(keys)s::text[], %(leases)s::text[],"
    " %(statuses)s::text[], %(results)s::text[], %(errors)s::text[], %(credits)s::float8[],"
    " %(sources)s::text[], %(payers)s::text[])"
    " WITH ORDINALITY AS v(key, lease_id, status, result, error, credits, source, payer, ord)),"
    " locked AS (SELECT key FROM playline_receipts WHERE key IN (SELECT key FROM v)"
    " ORDER BY key FOR UPDATE)"
    " UPDATE playline_receipts AS r SET status = v.status,"
    " result = CASE WHEN v.status = 'completed' THEN v.result ELSE r.result END,"
    " error = v.error,"
    " completed_at = CASE WHEN v.status = 'completed' THEN " + _NOW + " ELSE r.completed_at END,"
    " sent_at = CASE WHEN v.status = 'failed' THEN NULL ELSE r.sent_at END,"
    # An ambiguous receipt keeps its sender's lease id: the sender's answer may come.
    " lease_id = CASE WHEN v.status = 'ambiguous' THEN r.lease_id ELSE NULL END,"
    " credits = r.credits + v.credits, lease_expires_at = NULL,"
    " credits_source = CASE WHEN v.status = 'completed' THEN v.source"
    " ELSE r.credits_source END,"
    " paid_by = CASE WHEN v.status = 'completed' THEN v.payer ELSE r.paid_by END,"
    " paid_credits = CASE WHEN v.status = 'completed' THEN v.credits ELSE r.paid_credits END"
    " FROM v WHERE r.key = v.key AND r.lease_id = v.lease_id"
    " AND (r.status = 'running' OR (r.status = 'ambiguous' AND v.status = 'completed'))"
    " AND r.key IN (SELECT key FROM locked)"
    " RETURNING v.ord"
)
#: A batch's aggregate, fenced by its lease; credited once its members are (below).
_COMPLETE_AGGREGATE: LiteralString = (
    "UPDATE playline_receipts SET status = 'completed', completed_at = " + _NOW + ","
    " lease_id = NULL, lease_expires_at = NULL, error = NULL, result = %(result)s,"
    " credits_source = %(source)s"
    " WHERE key = %(agg)s AND lease_id = %(lease)s AND status IN ('running', 'ambiguous')"
)
#: A batch's members, each with its own credits. Members are completed once: a resumed
#: batch does not re-complete (or re-credit) a member an earlier attempt recorded, and
#: returns only what this settlement charged, which the aggregate is credited.
_COMPLETE_MEMBERS: LiteralString = (
    "WITH v AS (SELECT * FROM unnest(%(keys)s::text[], %(results)s::text[],"
    " %(credits)s::float8[], %(payers)s::text[]) AS v(key, result, credits, payer)),"
    " locked AS (SELECT key FROM playline_receipts WHERE key IN (SELECT key FROM v)"
    " ORDER BY key FOR UPDATE)"
    " UPDATE playline_receipts AS r SET status = 'completed', result = v.result,"
    " error = NULL, completed_at = " + _NOW + ", lease_id = NULL,"
    " lease_expires_at = NULL, credits = r.credits + v.credits, credits_source = %(source)s,"
    " paid_by = v.payer, paid_credits = v.credits"
    " FROM v WHERE r.key = v.key AND r.batch_key = %(agg)s"
    " AND r.status <> 'completed' AND r.key IN (SELECT key FROM locked)"
    " RETURNING v.credits"
)
_MARK_SENT: LiteralString = (
    "WITH v AS (SELECT * FROM unnest(%(keys)s::text[], %(leases)s::text[], %(ttls)s::float8[])"
    " WITH ORDINALITY AS v(key, lease_id, ttl, ord)),"
    " locked AS (SELECT key FROM playline_receipts WHERE key IN (SELECT key FROM v)"
    " ORDER BY key FOR UPDATE)"
    " UPDATE playline_receipts AS r SET sent_at = " + _NOW + ","
    " lease_expires_at = " + _NOW + " + v.ttl"
    " FROM v WHERE r.key = v.key AND r.lease_id = v.lease_id AND r.status = 'running'"
    " AND r.key IN (SELECT key FROM locked)"
    " RETURNING v.ord"
)
_RENEW: LiteralString = (
    "WITH locked AS (SELECT key FROM playline_receipts WHERE key = ANY(%(keys)s::text[])"
    " ORDER BY key FOR UPDATE)"
    " UPDATE playline_receipts SET lease_expires_at = " + _NOW + " + %(ttl)s"
    " WHERE key IN (SELECT key FROM locked) AND lease_id = %(lease)s AND status = 'running'"
    " RETURNING key"
)


#: A run's receipts per tool: paid by its rows, or last sent by its attempts.
_RUN_RECEIPTS: LiteralString = (
    "SELECT tool_id,"
    " count(*) FILTER (WHERE status = 'completed' AND left(paid_by, %(n)s) = %(prefix)s),"
    " COALESCE(sum(COALESCE(paid_credits, credits))"
    " FILTER (WHERE status = 'completed' AND left(paid_by, %(n)s) = %(prefix)s), 0),"
    " count(*) FILTER (WHERE status = 'ambiguous' AND left(owner, %(n)s) = %(prefix)s),"
    " COALESCE(sum(resends), 0),"
    " COALESCE(sum(COALESCE(paid_credits, credits)) FILTER (WHERE status = 'completed'"
    " AND left(paid_by, %(n)s) = %(prefix)s AND strpos(paid_by, '#') = 0), 0)"
    " FROM playline_receipts"
    " WHERE (left(paid_by, %(n)s) = %(prefix)s OR left(owner, %(n)s) = %(prefix)s)"
    " AND tool_id NOT LIKE '%%#batch' GROUP BY tool_id ORDER BY tool_id"
)


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
    later call of the group sees an earlier one's lease.
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
                earlier = grants[req.key].claims if req.key in grants else 0
                forced_by = req.force_token if req.force else None
                grants[req.key] = _Grant(
                    call.owner,
                    call.lease_id,
                    expires,
                    earlier + 1,
                    outcome.generation,
                    forced_by,
                    outcome.batch_key,
                    (grants[req.key].resends if req.key in grants else 0) + int(outcome.resent),
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


class PostgresReceiptStore:
    """Receipts in PostgreSQL, shared by every worker of a fleet.

    Args:
        db: the stores' database (opened, migrated); the caller closes it.
        clock: seconds since the epoch for leases and completions; default: the
            database server's clock.
    """

    def __init__(self, db: PostgresDatabase, *, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._clock = clock
        self._claims: Coalescer[_Claim, list[ClaimOutcome]] = Coalescer(self._claim_group)
        self._settlements: Coalescer[_Settlement, bool] = Coalescer(self._settle_group)
        self._sends: Coalescer[_Send, bool] = Coalescer(self._send_group)

    def _now(self) -> float | None:
        return None if self._clock is None else self._clock()

    # ------------------------------------------------------------------ claims

    async def claim(
        self, requests: Sequence[ClaimRequest], *, owner: str, lease_id: str, ttl_s: float
    ) -> list[ClaimOutcome]:
        if not requests:
            return []
        return await self._claims.submit(_Claim(list(requests), owner, lease_id, ttl_s))

    async def _claim_group(self, calls: list[_Claim]) -> list[list[ClaimOutcome]]:
        tools = {req.key: req.tool_id for call in calls for req in call.requests}
        keys = sorted(tools)
        now_param = self._now()

        async def tx(conn: psycopg.AsyncConnection[Any]) -> list[list[ClaimOutcome]]:
            params = {"keys": keys, "tools": [tools[k] for k in keys], "now": now_param}
            await conn.execute(_INSERT_MISSING, params)
            cur = await conn.execute(_LOCK_FOR_CLAIM, params)
            found = await cur.fetchall()
            now = float(found[0][-1])
            # Receipts the insert above created are running with an expired lease and
            # never sent: the rule claims them as it would a missing one.
            rows = {row[0]: StoredState(*row[1:-1]) for row in found}
            outcomes, grants, ambiguous = _plan_claims(calls, rows, now)
            if grants:
                granted = sorted(grants)
                await conn.execute(
                    _GRANT,
                    {
                        "keys": granted,
                        "owners": [grants[k].owner for k in granted],
                        "leases": [grants[k].lease_id for k in granted],
                        "expires": [grants[k].expires for k in granted],
                        "claims": [grants[k].claims for k in granted],
                        "generations": [grants[k].generation for k in granted],
                        "forced": [grants[k].forced_by for k in granted],
                        "batches": [grants[k].batch_key for k in granted],
                        "resends": [grants[k].resends for k in granted],
                    },
                )
            if ambiguous:
                marked = sorted(ambiguous)
                await conn.execute(
                    _AMBIGUATE, {"keys": marked, "reasons": [ambiguous[k] for k in marked]}
                )
            return outcomes

        # BEGIN, the insert and the locking select go in one round trip, the grant
        # and COMMIT in another.
        return await self._db.transaction(tx, pipeline=True)

    async def renew(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        if not keys:
            return []
        async with self._db.connection() as conn:
            cur = await conn.execute(
                _RENEW, {"keys": list(keys), "lease": lease_id, "ttl": ttl_s, "now": self._now()}
            )
            renewed = {row[0] for row in await cur.fetchall()}
        return [key in renewed for key in keys]

    async def release(self, keys: Sequence[str], *, lease_id: str) -> None:
        if not keys:
            return
        async with self._db.connection() as conn:
            await conn.execute(
                "UPDATE playline_receipts SET lease_expires_at = 0"
                " WHERE key = ANY(%s::text[]) AND lease_id = %s AND status = 'running'",
                [sorted(keys), lease_id],
            )

    # ------------------------------------------------------------------ settlements

    async def mark_sent(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        results = []
        for key in keys:  # coalesced: the group goes in one statement
            results.append(self._sends.submit(_Send(key, lease_id, ttl_s)))
        return list(await asyncio.gather(*results))

    async def _send_group(self, group: list[_Send]) -> list[bool]:
        firsts: dict[str, int] = {}
        for index, item in enumerate(group):
            firsts.setdefault(item.key, index)
        chosen = [group[i] for i in sorted(firsts.values())]
        async with self._db.connection() as conn:
            cur = await conn.execute(
                _MARK_SENT,
                {
                    "keys": [s.key for s in chosen],
                    "leases": [s.lease_id for s in chosen],
                    "ttls": [float(s.ttl_s) for s in chosen],
                    "now": self._now(),
                },
            )
            marked = {chosen[int(row[0]) - 1].key for row in await cur.fetchall()}
        return [item.key in marked for item in group]

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
        return await self._settlements.submit(
            _Settlement(
                key,
                lease_id,
                "completed",
                stored_json(result),
                None,
                credits,
                credits_source,
                paid_by,
            )
        )

    async def fail(self, key: str, *, lease_id: str, error: str) -> bool:
        return await self._settlements.submit(
            _Settlement(key, lease_id, "failed", None, error[:2000], 0.0)
        )

    async def mark_ambiguous(self, key: str, *, lease_id: str, reason: str) -> bool:
        return await self._settlements.submit(
            _Settlement(key, lease_id, "ambiguous", None, reason[:2000], 0.0)
        )

    async def _settle_group(self, group: list[_Settlement]) -> list[bool]:
        # One settlement per key in a statement; a repeat (never seen in practice:
        # a lease settles its key once) would find the receipt settled: False.
        firsts: dict[str, int] = {}
        for index, item in enumerate(group):
            firsts.setdefault(item.key, index)
        chosen = [group[i] for i in sorted(firsts.values())]
        async with self._db.connection() as conn:
            cur = await conn.execute(
                _SETTLE,
                {
                    "keys": [s.key for s in chosen],
                    "leases": [s.lease_id for s in chosen],
                    "statuses": [s.status for s in chosen],
                    "results": [s.result for s in chosen],
                    "errors": [s.error for s in chosen],
                    "credits": [float(s.credits) for s in chosen],
                    "sources": [s.credits_source for s in chosen],
                    "payers": [s.paid_by for s in chosen],
                    "now": self._now(),
                },
            )
            settled = {int(row[0]) - 1 for row in await cur.fetchall()}
        done = {chosen[i].key for i in settled}
        return [item.key in done and firsts[item.key] == index for index, item in enumerate(group)]

    # ------------------------------------------------------------------ reads

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        if not keys:
            return {}
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT key, tool_id, status, result, error, owner, lease_id, lease_expires_at,"
                " completed_at, attempts, credits, sent_at, generation, credits_source"
                " FROM playline_receipts"
                " WHERE key = ANY(%s::text[])",
                [list(keys)],
            )
            rows = await cur.fetchall()
        return {
            row[0]: Receipt(
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
            for row in rows
        }

    async def run_receipts(self, prefix: str) -> list[ToolReceipts]:
        async with self._db.connection() as conn:
            cur = await conn.execute(_RUN_RECEIPTS, {"prefix": prefix, "n": len(prefix)})
            rows = await cur.fetchall()
        return [
            ToolReceipts(
                row[0], int(row[1]), float(row[2]), int(row[3]), int(row[4]), float(row[5] or 0)
            )
            for row in rows
        ]

    async def sample(self, tool_id: str, limit: int = 1000) -> list[tuple[Any, float | None]]:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "SELECT result, credits FROM playline_receipts"
                " WHERE tool_id = %s AND status = 'completed'"
                " ORDER BY completed_at DESC LIMIT %s",
                [tool_id, limit],
            )
            rows = await cur.fetchall()
        return [(json.loads(row[0]) if row[0] is not None else None, row[1]) for row in rows]

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
        members = sorted(set(member_keys))

        async def tx(conn: psycopg.AsyncConnection[Any]) -> bool:
            cur = await conn.execute(
                "WITH locked AS (SELECT key FROM playline_receipts WHERE key = ANY(%(keys)s)"
                " ORDER BY key FOR UPDATE)"
                " UPDATE playline_receipts SET batch_key = %(agg)s"
                " WHERE key IN (SELECT key FROM locked) AND lease_id = %(lease)s"
                " AND status = 'running'",
                {"keys": members, "agg": agg_key, "lease": lease_id},
            )
            if cur.rowcount != len(members):
                raise _Rollback
            await conn.execute(
                "INSERT INTO playline_receipts (key, tool_id, status, owner, lease_id,"
                " lease_expires_at, created_at, attempts, request)"
                " VALUES (%(agg)s, %(tool)s, 'running', %(owner)s, %(lease)s,"
                " " + _NOW + " + %(ttl)s, " + _NOW + ", 1, %(doc)s)"
                " ON CONFLICT (key) DO UPDATE SET status = 'running', owner = EXCLUDED.owner,"
                " lease_id = EXCLUDED.lease_id, lease_expires_at = EXCLUDED.lease_expires_at,"
                " request = EXCLUDED.request, attempts = playline_receipts.attempts + 1",
                {
                    "agg": agg_key,
                    "tool": f"{tool_id}#batch",
                    "owner": owner,
                    "lease": lease_id,
                    "ttl": ttl_s,
                    "doc": document,
                    "now": self._now(),
                },
            )
            return True

        try:
            return await self._db.transaction(tx)
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
        async def tx(conn: psycopg.AsyncConnection[Any]) -> BatchClaim:
            cur = await conn.execute(
                "SELECT status, lease_id, lease_expires_at, request, sent_at, owner, error, "
                + _NOW
                + " FROM playline_receipts WHERE key = %(agg)s FOR UPDATE",
                {"agg": agg_key, "now": self._now()},
            )
            row = await cur.fetchone()
            if row is None or row[3] is None:
                raise LookupError(f"batch {agg_key} has no stored request")
            status, held, expires, doc, sent_at, sender, error, now_value = row
            document = json.loads(doc)
            members: list[str] = document["members"]
            now = float(now_value)
            if status == "completed":
                return BatchClaim(ClaimStatus.HIT, members, document["request"])
            if status == "running" and held != lease_id and (expires or 0) > now:
                return BatchClaim(ClaimStatus.HELD, members, document["request"])
            if not retry_ambiguous and (
                status == "ambiguous"
                or (ambiguous_if_sent and sent_at is not None and held != lease_id)
            ):
                reason = error if status == "ambiguous" else batch_sent_reason(sender)
                await conn.execute(
                    "WITH locked AS (SELECT key FROM playline_receipts"
                    " WHERE key = %(agg)s OR batch_key = %(agg)s ORDER BY key FOR UPDATE)"
                    " UPDATE playline_receipts SET status = 'ambiguous', error = %(reason)s,"
                    " lease_expires_at = NULL WHERE key IN (SELECT key FROM locked)"
                    " AND status IN ('running', 'failed')",
                    {"agg": agg_key, "reason": reason},
                )
                return BatchClaim(
                    ClaimStatus.AMBIGUOUS,
                    members,
                    document["request"],
                    reason=reason,
                    became_ambiguous=status != "ambiguous",
                )
            params = {"agg": agg_key, "owner": owner, "lease": lease_id, "expires": now + ttl_s}
            await conn.execute(
                "UPDATE playline_receipts SET status = 'running', owner = %(owner)s,"
                " lease_id = %(lease)s, lease_expires_at = %(expires)s, sent_at = NULL,"
                " attempts = attempts + 1 WHERE key = %(agg)s",
                params,
            )
            await conn.execute(
                "WITH locked AS (SELECT key FROM playline_receipts WHERE batch_key = %(agg)s"
                " ORDER BY key FOR UPDATE)"
                " UPDATE playline_receipts SET status = 'running', owner = %(owner)s,"
                " lease_id = %(lease)s, lease_expires_at = %(expires)s"
                " WHERE key IN (SELECT key FROM locked) AND status <> 'completed'",
                params,
            )
            return BatchClaim(ClaimStatus.CLAIMED, members, document["request"])

        return await self._db.transaction(tx)

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
        keys = sorted(results)
        now = self._now()
        payers = member_paid_by or {}

        async def tx(conn: psycopg.AsyncConnection[Any]) -> bool:
            # The aggregate first (fenced, and locked before its members, as every
            # batch transaction locks them), then the members, then what they cost.
            cur = await conn.execute(
                _COMPLETE_AGGREGATE,
                {
                    "agg": agg_key,
                    "lease": lease_id,
                    "result": stored_json({"members": len(results)}),
                    "source": credits_source,
                    "now": now,
                },
            )
            if cur.rowcount != 1:
                raise _Rollback
            cur = await conn.execute(
                _COMPLETE_MEMBERS,
                {
                    "keys": keys,
                    "results": [stored_json(results[k]) for k in keys],
                    "credits": [float(member_credits.get(k, 0.0)) for k in keys],
                    "payers": [payers.get(k) for k in keys],
                    "source": credits_source,
                    "agg": agg_key,
                    "now": now,
                },
            )
            charged = sum(float(row[0]) for row in await cur.fetchall())
            await conn.execute(
                "UPDATE playline_receipts SET credits = credits + %(total)s WHERE key = %(agg)s",
                {"total": charged, "agg": agg_key},
            )
            return True

        try:
            return await self._db.transaction(tx)
        except _Rollback:
            return False

    async def fail_batch(
        self, agg_key: str, *, lease_id: str, error: str, release_members: bool
    ) -> None:
        release = ", batch_key = NULL" if release_members else ""

        async def tx(conn: psycopg.AsyncConnection[Any]) -> None:
            cur = await conn.execute(
                "UPDATE playline_receipts SET status = 'failed', error = %(error)s,"
                " lease_id = NULL, lease_expires_at = NULL, sent_at = NULL"
                " WHERE key = %(agg)s AND lease_id = %(lease)s AND status = 'running'",
                {"agg": agg_key, "lease": lease_id, "error": error[:2000]},
            )
            if cur.rowcount != 1:
                return
            await conn.execute(
                "WITH locked AS (SELECT key FROM playline_receipts WHERE batch_key = %(agg)s"
                " ORDER BY key FOR UPDATE)"
                " UPDATE playline_receipts SET status = 'failed', error = %(error)s,"
                " lease_id = NULL, lease_expires_at = NULL" + release + ""
                " WHERE key IN (SELECT key FROM locked) AND status <> 'completed'",
                {"agg": agg_key, "error": error[:2000]},
            )

        await self._db.transaction(tx)

    async def mark_batch_ambiguous(self, agg_key: str, *, lease_id: str, reason: str) -> bool:
        async def tx(conn: psycopg.AsyncConnection[Any]) -> bool:
            cur = await conn.execute(
                "UPDATE playline_receipts SET status = 'ambiguous', error = %(reason)s,"
                " lease_expires_at = NULL"
                " WHERE key = %(agg)s AND lease_id = %(lease)s AND status = 'running'",
                {"agg": agg_key, "lease": lease_id, "reason": reason[:2000]},
            )
            if cur.rowcount != 1:
                return False
            await conn.execute(
                "WITH locked AS (SELECT key FROM playline_receipts WHERE batch_key = %(agg)s"
                " ORDER BY key FOR UPDATE)"
                " UPDATE playline_receipts SET status = 'ambiguous', error = %(reason)s,"
                " lease_expires_at = NULL WHERE key IN (SELECT key FROM locked)"
                " AND status IN ('running', 'failed')",
                {"agg": agg_key, "reason": reason[:2000]},
            )
            return True

        return await self._db.transaction(tx)

    async def close(self) -> None:
        """Wait for queued claims and settlements; the database is closed by its owner."""
        await self._claims.drain()
        await self._sends.drain()
        await self._settlements.drain()


class _Rollback(Exception):
    """Raised inside a transaction to undo it and report ``False``."""
