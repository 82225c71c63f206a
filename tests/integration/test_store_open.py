"""Opening the stores: workers migrate (even all at once), clients create nothing,
unknown or unreachable stores are one clear line. Real SQLite files, real PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import psycopg
import pytest

from playline.config import Settings
from playline.db.errors import InvalidStoreUrl, StoreNotFound, StoreSchemaTooNew, StoreUnavailable
from playline.stores.backends import open_stores
from playline.stores.receipts import ClaimRequest
from playline.stores.receipts_ledger import SCHEMA as RECEIPTS_SCHEMA
from playline.stores.receipts_ledger import ReceiptLedger
from tests.pg import pg_schema


async def test_a_client_never_creates_a_sqlite_store(tmp_path: Path) -> None:
    home = tmp_path / "not-the-workers-home"
    with pytest.raises(StoreNotFound) as info:
        await open_stores(Settings(home=home), create=False)
    message = str(info.value)
    assert str(home / "receipts.db") in message
    assert "PLAYLINE_HOME" in message and "PLAYLINE_STORE_URL" in message
    assert "\n" not in message
    assert not home.exists()  # not even the directory


async def test_a_client_reads_what_a_worker_wrote(store_url: str) -> None:
    settings = Settings(store_url=store_url)
    async with await open_stores(settings, create=True) as worker:
        await worker.sheet.put_source("src@1", ["id"], [["a"], ["b"]])
        await worker.receipts.claim([ClaimRequest("k", "t")], owner="w", lease_id="L", ttl_s=9)
    async with await open_stores(settings, create=False) as client:
        assert await client.sheet.source("src@1") == (["id"], 2)
        assert (await client.receipts.get(["k"]))["k"].owner == "w"


async def test_a_client_finds_no_store_in_an_empty_postgres_schema() -> None:
    async with pg_schema() as url:
        with pytest.raises(StoreNotFound, match=r"holds no playline (receipts )?store yet") as info:
            await open_stores(Settings(store_url=url), create=False)
        assert "PLAYLINE_STORE_URL" in str(info.value)
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
            )
            assert await cur.fetchone() == (0,)  # nothing was created


async def test_unknown_and_unreachable_stores_are_one_line_errors() -> None:
    with pytest.raises(InvalidStoreUrl, match="names no store playline knows"):
        await open_stores(Settings(store_url="mysql://db/pl"), create=True)
    with pytest.raises(StoreUnavailable) as info:
        await open_stores(Settings(store_url="postgresql://pl:s3cret@127.0.0.1:1/pl"), create=True)
    assert "s3cret" not in str(info.value) and "pl:***@127.0.0.1:1" in str(info.value)
    assert "\n" not in str(info.value)


async def test_workers_starting_together_migrate_a_postgres_store_once() -> None:
    async with pg_schema() as url:
        settings = Settings(store_url=url)
        opened = await asyncio.gather(*(open_stores(settings, create=True) for _ in range(6)))
        for stores in opened:
            await stores.close()
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute(
                "SELECT version FROM playline_schema WHERE component = 'receipts'"
            )
            assert await cur.fetchone() == (ReceiptLedger.SCHEMA.latest,)
        again = await open_stores(settings, create=True)  # already current: nothing to do
        await again.close()


async def test_workers_starting_together_migrate_a_sqlite_file_once(tmp_path: Path) -> None:
    path = tmp_path / "receipts.db"

    def open_and_close() -> None:
        async def go() -> None:
            await (await ReceiptLedger.in_file(path).ensure_open()).close()

        asyncio.run(go())

    await asyncio.gather(*(asyncio.to_thread(open_and_close) for _ in range(6)))
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (RECEIPTS_SCHEMA.latest,)


async def test_a_file_from_before_versioned_migrations_is_upgraded_in_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "receipts.db"
    with sqlite3.connect(path) as conn:  # the first release's table: no batch columns
        conn.execute(
            "CREATE TABLE receipts (key TEXT PRIMARY KEY, tool_id TEXT NOT NULL, status TEXT "
            "NOT NULL, result TEXT, error TEXT, owner TEXT, lease_id TEXT, lease_expires_at "
            "REAL, created_at REAL NOT NULL, completed_at REAL, attempts INTEGER NOT NULL "
            "DEFAULT 0, credits REAL NOT NULL DEFAULT 0)"
        )
        conn.execute(
            "INSERT INTO receipts (key, tool_id, status, result, created_at, completed_at, "
            "attempts) VALUES ('old', 't', 'completed', '{\"v\": 1}', 1, 2, 1)"
        )
    conn.close()
    store = ReceiptLedger.in_file(path)
    try:
        [hit] = await store.claim([ClaimRequest("old", "t")], owner="o", lease_id="L", ttl_s=5)
        assert hit.result == {"v": 1}
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(playline_receipts)")}
        assert {"batch_key", "request"} <= columns
        assert conn.execute("PRAGMA user_version").fetchone() == (RECEIPTS_SCHEMA.latest,)
    conn.close()


async def test_a_store_migrated_by_a_newer_playline_is_refused(
    store_url: str, tmp_path: Path
) -> None:
    settings = Settings(store_url=store_url)
    await (await open_stores(settings, create=True)).close()
    if settings.sqlite_dir is not None:
        with sqlite3.connect(settings.receipts_path) as conn:
            conn.execute("PRAGMA user_version = 99")
        conn.close()
    else:
        async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as conn:
            await conn.execute("UPDATE playline_schema SET version = 99")
    for create in (True, False):
        with pytest.raises(StoreSchemaTooNew, match="schema version 99"):
            await open_stores(settings, create=create)
