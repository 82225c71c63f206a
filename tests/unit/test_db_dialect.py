"""The dialect table and migrations' per-database steps (no database needed)."""

from __future__ import annotations

from typing import Any

import pytest

from playline.db.conn import Conn, chunks
from playline.db.dialect import POSTGRES, SQLITE, marks
from playline.db.migrations import Migration, Schema


def test_placeholders_are_spelled_for_psycopg_and_a_literal_percent_is_kept() -> None:
    sql = "SELECT '100%' || ? FROM t WHERE a = ? AND b LIKE 'x%'"
    assert POSTGRES.sql(sql) == "SELECT '100%%' || %s FROM t WHERE a = %s AND b LIKE 'x%%'"
    assert SQLITE.sql(sql) == sql


def test_only_postgresql_locks_rows_it_reads() -> None:
    assert (SQLITE.for_update, POSTGRES.for_update) == ("", " FOR UPDATE")


def test_marks_and_chunks() -> None:
    assert marks(3) == "?, ?, ?"
    with pytest.raises(ValueError):
        marks(0)
    assert [list(c) for c in chunks([1, 2, 3, 4, 5], 2)] == [[1, 2], [3, 4], [5]]


def _conn(dialect: Any) -> Conn:
    return Conn(object(), dialect, lambda sql, rows: None)  # type: ignore[arg-type]


def test_a_migration_step_is_spelled_per_database_or_shared_with_type_names() -> None:
    own = Migration(1, "old", sqlite=("CREATE TABLE jobs (a TEXT)",), postgres=())
    shared = Migration(2, "new", ("ALTER TABLE playline_x ADD COLUMN y {real}",))
    assert own.statements_for(_conn(SQLITE)) == ["CREATE TABLE jobs (a TEXT)"]
    assert own.statements_for(_conn(POSTGRES)) == []
    assert shared.statements_for(_conn(SQLITE)) == ["ALTER TABLE playline_x ADD COLUMN y REAL"]
    assert shared.statements_for(_conn(POSTGRES)) == ["ALTER TABLE playline_x ADD COLUMN y float8"]


def test_a_schema_must_be_numbered_from_one() -> None:
    assert Schema("c", (Migration(1, "a"), Migration(2, "b"))).latest == 2
    with pytest.raises(ValueError):
        _ = Schema("c", (Migration(2, "b"),)).latest
