"""The engines under the stores (``playline.db``), on a real SQLite file and a real
PostgreSQL: a write is all or nothing, and a PostgreSQL write that loses a deadlock
is run again from the start."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from playline.db.conn import Conn
from playline.db.errors import StoreNotFound
from playline.db.migrations import Migration, Schema
from playline.db.postgres import PostgresPool
from playline.db.ready import ReadyOnFirstUse
from playline.db.sqlite import SqliteFile
from tests.pg import pg_schema

SCHEMA = Schema(
    "test",
    (
        Migration(
            1, "a counter table", ("CREATE TABLE playline_t (id {int} PRIMARY KEY, n {int})",)
        ),
    ),
)


def _seed(conn: Conn) -> None:
    conn.many("INSERT INTO playline_t (id, n) VALUES (?, ?)", [(1, 0), (2, 0)])


def _fail_half_way(conn: Conn) -> None:
    conn.execute("UPDATE playline_t SET n = n + 1 WHERE id = 1")
    raise RuntimeError("half-way")


async def _all_or_nothing(db: SqliteFile | PostgresPool) -> None:
    await db.migrate(SCHEMA, create=True)
    await db.write(_seed)
    with pytest.raises(RuntimeError, match="half-way"):
        await db.write(_fail_half_way)
    rows = await db.read(lambda conn: conn.all("SELECT id, n FROM playline_t ORDER BY id"))
    assert rows == [(1, 0), (2, 0)]
    assert await db.read(lambda conn: conn.scalar("SELECT count(*) FROM playline_t")) == 2


async def test_a_sqlite_write_that_raises_leaves_nothing(tmp_path: Path) -> None:
    db = SqliteFile(tmp_path / "t.db")
    try:
        await _all_or_nothing(db)
    finally:
        await db.close()


@pytest.mark.postgres
async def test_a_postgres_write_that_raises_leaves_nothing() -> None:
    async with pg_schema() as url:
        db = await PostgresPool.open(url, max_size=3)
        try:
            await _all_or_nothing(db)
        finally:
            await db.close()


@pytest.mark.postgres
async def test_a_postgres_write_that_loses_a_deadlock_is_run_again() -> None:
    async with pg_schema() as url:
        db = await PostgresPool.open(url, max_size=3)
        try:
            await db.migrate(SCHEMA, create=True)
            await db.write(_seed)
            both_locked = threading.Barrier(2, timeout=10)
            runs = {1: 0, 2: 0}

            def lock(first: int, second: int) -> Callable[[Conn], None]:
                def fn(conn: Conn) -> None:
                    runs[first] += 1
                    conn.execute("UPDATE playline_t SET n = n + 1 WHERE id = ?", [first])
                    if runs[first] == 1:  # only the first attempt waits for the other
                        both_locked.wait()
                    conn.execute("UPDATE playline_t SET n = n + 1 WHERE id = ?", [second])

                return fn

            await asyncio.gather(db.write(lock(1, 2)), db.write(lock(2, 1)))
            # One of them lost the deadlock and ran again; both are stored once.
            assert sorted(runs.values()) == [1, 2]
            rows = await db.read(lambda conn: conn.all("SELECT id, n FROM playline_t ORDER BY id"))
            assert rows == [(1, 2), (2, 2)]
        finally:
            await db.close()


async def test_a_client_finds_a_store_or_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "t.db"
    client = ReadyOnFirstUse.file(path, SCHEMA, create=False)
    with pytest.raises(StoreNotFound):
        await client()
    assert not path.exists() and not path.parent.exists()
    worker = ReadyOnFirstUse.file(path, SCHEMA)
    await (await worker()).write(_seed)
    await worker.close()
    db = await client()  # the worker's store is there now: checked, not migrated
    assert await db.read(lambda conn: conn.scalar("SELECT count(*) FROM playline_t")) == 2
    await client.close()
    assert not client.opened


@pytest.mark.postgres
async def test_a_postgres_client_finds_no_component_and_creates_nothing() -> None:
    async with pg_schema() as url:
        db = await PostgresPool.open(url, max_size=2)
        try:
            with pytest.raises(StoreNotFound):
                await ReadyOnFirstUse.shared(db, SCHEMA, create=False)()
            assert (
                await db.read(lambda conn: conn.scalar("SELECT to_regclass('playline_t')")) is None
            )
        finally:
            await db.close()
