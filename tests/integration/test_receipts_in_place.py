"""Receipt stores created by the code before ``playline.db`` open in place with today's.

Each test builds a store with the old schema and rows (:mod:`tests.old_schemas`): a
``receipts.db`` file at the versions the old SQLite store left, and a PostgreSQL schema
whose ``stores`` component holds the receipts. It then opens it through
``open_stores`` as a worker would, and checks that every receipt is there, reads as it
was written, and still answers claims, settlements and batches; then a client opens it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from playline.config import Settings
from playline.db.errors import StoreNotFound
from playline.stores.backends import open_stores
from playline.stores.receipts import ClaimRequest, ClaimStatus, Receipt, ToolReceipts
from playline.stores.receipts_ledger import SCHEMA, ReceiptLedger
from tests.integration.conftest import Clock
from tests.old_schemas import (
    RECEIPTS_SQLITE_VERSIONS,
    STORES_POSTGRES_VERSIONS,
    old_postgres,
    old_sqlite,
    up_to,
)
from tests.pg import pg_schema

TOOL = "acme.find"
BATCH = '{"members":["m1","m2"],"request":{"q":1}}'

#: every state a receipt can be in, as today's code writes them (schema of version 7 /
#: ``stores`` 6): (key, column values)
RECEIPTS: list[tuple[str, dict[str, Any]]] = [
    (
        "done",
        {
            "status": "completed",
            "result": '{"email":"ada@x.example"}',
            "completed_at": 2.0,
            "attempts": 1,
            "credits": 3.0,
            "credits_source": "provider",
            "paid_by": "run-1/chunk#0",
            "paid_credits": 3.0,
        },
    ),
    (
        "live",
        {"status": "running", "owner": "w1", "lease_id": "L1", "lease_expires_at": 5_000.0},
    ),
    (
        "maybe",
        {
            "status": "ambiguous",
            "owner": "run-1/chunk@1",
            "lease_id": "L2",
            "sent_at": 3.0,
            "error": "timed out",
            "resends": 1,
        },
    ),
    ("broke", {"status": "failed", "error": "boom", "attempts": 2}),
    (
        "agg",
        {
            "tool_id": f"{TOOL}#batch",
            "status": "running",
            "owner": "w2",
            "lease_id": "L3",
            "lease_expires_at": 0.0,
            "request": BATCH,
        },
    ),
    (
        "m1",
        {
            "status": "completed",
            "result": '{"n":1}',
            "completed_at": 2.0,
            "credits": 1.0,
            "batch_key": "agg",
        },
    ),
    (
        "m2",
        {
            "status": "running",
            "owner": "w2",
            "lease_id": "L3",
            "lease_expires_at": 0.0,
            "batch_key": "agg",
        },
    ),
]


def _inserts(table: str, receipts: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, list[Any]]]:
    rows = []
    for key, values in receipts:
        columns = {"key": key, "tool_id": TOOL, "created_at": 1.0, **values}
        names = ", ".join(columns)
        marks = ", ".join("?" * len(columns))
        rows.append((f"INSERT INTO {table} ({names}) VALUES ({marks})", list(columns.values())))
    return rows


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh store location of each backend (PostgreSQL: marked ``postgres``)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store'}"
        return
    async with pg_schema() as url:
        yield url


def _old_receipts(url: str) -> None:
    """Every kind of receipt, in the store as today's code leaves it."""
    if url.startswith("postgres"):
        ddl = up_to(STORES_POSTGRES_VERSIONS, len(STORES_POSTGRES_VERSIONS))
        old_postgres(url, "stores", ddl, 6, _inserts("playline_receipts", RECEIPTS))
    else:
        path = Settings(store_url=url).receipts_path
        old_sqlite(path, up_to(RECEIPTS_SQLITE_VERSIONS, 7), 7, _inserts("receipts", RECEIPTS))


async def _versions(url: str) -> dict[str, int]:
    """The schema versions the store records (SQLite: the file's, as ``receipts``)."""
    if not url.startswith("postgres"):
        path = Settings(store_url=url).receipts_path
        with sqlite3.connect(path) as conn:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        conn.close()
        assert "playline_receipts" in tables and "receipts" not in tables
        return {"receipts": int(version)}
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT component, version FROM playline_schema")
        return {str(c): int(v) for c, v in await cur.fetchall()}


async def test_an_old_receipt_store_opens_in_place_and_keeps_every_receipt(
    backend: str, clock: Clock
) -> None:
    _old_receipts(backend)
    settings = Settings(store_url=backend)
    keys = [key for key, _ in RECEIPTS]
    async with await open_stores(settings, create=True, clock=clock) as stores:
        receipts = stores.receipts
        found = await receipts.get(keys)
        assert sorted(found) == sorted(keys)
        done = found["done"]
        assert (done.status, done.result, done.credits, done.credits_source) == (
            "completed",
            {"email": "ada@x.example"},
            3.0,
            "provider",
        )
        assert (done.completed_at, done.attempts, done.lease_id) == (2.0, 1, None)
        assert (found["live"].owner, found["live"].lease_expires_at) == ("w1", 5_000.0)
        assert (found["maybe"].status, found["maybe"].sent_at) == ("ambiguous", 3.0)
        assert (found["broke"].status, found["broke"].error) == ("failed", "boom")
        assert {found[k].status for k in ("agg", "m1", "m2")} == {"running", "completed"}

        # Every one still answers claims as it did.
        outcomes = await receipts.claim(
            [ClaimRequest(k, TOOL) for k in ("done", "live", "maybe", "broke")],
            owner="w9",
            lease_id="L9",
            ttl_s=10,
        )
        hit, held, ambiguous, claimed = outcomes
        assert (hit.status, hit.result, hit.credits, hit.paid_by) == (
            ClaimStatus.HIT,
            {"email": "ada@x.example"},
            3.0,
            "run-1/chunk#0",
        )
        assert (held.status, held.owner) == (ClaimStatus.HELD, "w1")
        assert (ambiguous.status, ambiguous.reason) == (ClaimStatus.AMBIGUOUS, "timed out")
        assert claimed.status is ClaimStatus.CLAIMED
        assert await receipts.complete("broke", lease_id="L9", result={"ok": 1}, credits=0.5)
        assert (await receipts.get(["broke"]))["broke"].attempts == 3

        # The unfinished batch is taken over; its completed member keeps its credits.
        batch = await receipts.claim_batch("agg", owner="w9", lease_id="L9", ttl_s=10)
        assert (batch.status, batch.member_keys, batch.request) == (
            ClaimStatus.CLAIMED,
            ["m1", "m2"],
            {"q": 1},
        )
        assert await receipts.complete_batch(
            "agg",
            lease_id="L9",
            results={"m1": {"n": 9}, "m2": {"n": 2}},
            member_credits={"m1": 1.0, "m2": 2.0},
        )
        after = await receipts.get(["agg", "m1", "m2"])
        assert [(after[k].status, after[k].credits) for k in ("agg", "m1", "m2")] == [
            ("completed", 2.0),
            ("completed", 1.0),
            ("completed", 2.0),
        ]
        assert after["m1"].result == {"n": 1}

        # The audit and the estimate read the old rows too.
        assert await receipts.run_receipts("run-1/") == [ToolReceipts(TOOL, 1, 3.0, 1, 1, 0.0)]
        assert ({"email": "ada@x.example"}, 3.0) in await receipts.sample(TOOL)

    versions = await _versions(backend)
    assert versions["receipts"] == SCHEMA.latest
    if backend.startswith("postgres"):
        assert versions["stores"] == len(STORES_POSTGRES_VERSIONS)  # left alone
    async with await open_stores(settings, create=False, clock=clock) as client:
        again = await client.receipts.get(keys)
        assert sorted(again) == sorted(keys)
        assert again["done"].result == {"email": "ada@x.example"}


@pytest.mark.parametrize("version", [1, 2, 3, 6])
async def test_an_older_receipts_file_is_migrated_through_every_version(
    tmp_path: Path, clock: Clock, version: int
) -> None:
    """Files the old store left at earlier versions gain the later columns, in order."""
    url = f"sqlite:///{tmp_path / 'store'}"
    settings = Settings(store_url=url)
    insert = (
        "INSERT INTO receipts (key, tool_id, status, result, created_at, completed_at,"
        " attempts, credits) VALUES ('old', 't', 'completed', '{\"v\":1}', 1, 2, 1, 4)"
    )
    old_sqlite(
        settings.receipts_path,
        up_to(RECEIPTS_SQLITE_VERSIONS, version),
        version,
        [(insert, [])],
    )
    async with await open_stores(settings, create=True, clock=clock) as stores:
        receipt = (await stores.receipts.get(["old"]))["old"]
        assert (receipt.status, receipt.result, receipt.credits) == ("completed", {"v": 1}, 4)
        assert (receipt.generation, receipt.credits_source) == (0, None)
        [hit] = await stores.receipts.claim(
            [ClaimRequest("old", "t")], owner="o", lease_id="L", ttl_s=5
        )
        assert (hit.status, hit.result) == (ClaimStatus.HIT, {"v": 1})
    assert await _versions(url) == {"receipts": SCHEMA.latest}


async def _client_reads(settings: Settings, key: str) -> Receipt | None:
    """``key``'s receipt as a client reads it (``create=False``). On SQLite only the
    receipts file is opened: the old store built here has no ``sheet.db``."""
    if settings.sqlite_dir is None:
        async with await open_stores(settings, create=False) as stores:
            return (await stores.receipts.get([key])).get(key)
    client = await ReceiptLedger.in_file(settings.receipts_path, create=False).ensure_open()
    try:
        return (await client.get([key])).get(key)
    finally:
        await client.close()


async def test_a_client_waits_for_a_worker_to_upgrade_an_old_store(
    backend: str, clock: Clock
) -> None:
    """A client changes nothing: before any worker of this playline opened the old
    store, it is told to start one (one line), and the store is left as it was."""
    _old_receipts(backend)
    settings = Settings(store_url=backend)
    with pytest.raises(StoreNotFound, match="start a worker on it first") as info:
        await _client_reads(settings, "done")
    assert "\n" not in str(info.value)
    if backend.startswith("postgres"):
        assert "receipts" not in await _versions(backend)
    else:
        with sqlite3.connect(settings.receipts_path) as conn:
            assert conn.execute("PRAGMA user_version").fetchone() == (7,)
        conn.close()
    await (await open_stores(settings, create=True, clock=clock)).close()  # a worker starts
    receipt = await _client_reads(settings, "done")
    assert receipt is not None and receipt.credits == 3.0
