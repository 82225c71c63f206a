"""A table of an existing PostgreSQL database as a destination.

A batch is one transaction. Per record: the row with the record's key is read
``FOR UPDATE``; absent, it is inserted (``ON CONFLICT`` on the key columns: a row
inserted meanwhile by someone else is updated instead); present, only the fields
to write are updated, ``if_blank`` ones only where the row's value is NULL or empty.
Nothing is created: a missing table, column or unique index on the key columns is
the database's error, reported as the batch's rejection.

The record id goes in the first key column; other key columns take the mapped
field of the same name (a record without a value there is rejected).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from playline.db.conn import Conn
from playline.db.engine import Database
from playline.errors import PlaylineError
from playline.sinks.destination import CREATED, KEPT, REJECTED, UPDATED, RecordOutcome
from playline.sinks.plan import RecordPlan, cell_text
from playline.sinks.spec import PostgresSinkSpec, check_identifier

__all__ = ["PostgresDestination"]


def _quoted(name: str) -> str:
    return '"' + check_identifier(name) + '"'


def _table(name: str) -> str:
    return ".".join(_quoted(part) for part in name.split("."))


class PostgresDestination:
    """See the module docstring; ``db`` is the destination database (not the stores')."""

    def __init__(self, spec: PostgresSinkSpec, db: Database, *, where: str) -> None:
        self.spec = spec
        self.max_batch = spec.max_batch
        self.scope = f"postgres:{where}:{spec.table}:{','.join(spec.key_columns)}"
        self.requests = 0
        self._db = db

    async def check(self, fields: Sequence[str]) -> None:
        """Refuse at once a table or a column the database does not have."""
        columns = ", ".join(_quoted(c) for c in dict.fromkeys([*self.spec.key_columns, *fields]))

        def probe(conn: Conn) -> None:
            conn.all(f"SELECT {columns} FROM {_table(self.spec.table)} WHERE false")

        try:
            await self._db.read(probe)
        except Exception as err:  # the driver's error, whichever it is
            raise PlaylineError(
                f"sink table {self.spec.table}: {str(err).splitlines()[0]}"
            ) from None

    async def write(
        self, batch: Sequence[RecordPlan], *, resent: bool = False
    ) -> list[RecordOutcome]:
        """One transaction; a ``resent`` batch is simply upserted again (its first
        transaction committed whole or not at all)."""
        self.requests += 1
        try:
            return await self._db.write(lambda conn: [self._upsert(conn, p) for p in batch])
        except Exception as err:  # the whole transaction was refused
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            return [RecordOutcome(plan.record, REJECTED, reason=reason) for plan in batch]

    def _upsert(self, conn: Conn, plan: RecordPlan) -> RecordOutcome:
        keys: dict[str, Any] = {self.spec.key_columns[0]: plan.record}
        for column in self.spec.key_columns[1:]:
            if cell_text(plan.values.get(column)) is None:
                return RecordOutcome(plan.record, REJECTED, reason=f"no value for key {column}")
            keys[column] = plan.values[column]
        writes = {k: v for k, v in plan.writes.items() if k not in keys}
        where = " AND ".join(f"{_quoted(k)} = ?" for k in keys)
        blank_checked = [f for f in plan.if_blank if f in writes]
        shown = ", ".join(_quoted(c) for c in [*keys, *blank_checked])
        row = conn.one(
            f"SELECT {shown} FROM {_table(self.spec.table)} WHERE {where} FOR UPDATE",
            list(keys.values()),
        )
        kept: dict[str, str | None] = {}
        if row is not None:
            held = dict(zip([*keys, *blank_checked], row, strict=True))
            for name in blank_checked:
                if cell_text(held[name]) is not None:
                    kept[name] = cell_text(writes.pop(name))
        written = {k: cell_text(v) for k, v in writes.items()}
        if row is None:
            names = [*keys, *writes]
            values = [*keys.values(), *writes.values()]
            update = ", ".join(f"{_quoted(n)} = excluded.{_quoted(n)}" for n in writes)
            conflict = ", ".join(_quoted(k) for k in keys)
            conn.execute(
                f"INSERT INTO {_table(self.spec.table)} ({', '.join(_quoted(n) for n in names)})"
                f" VALUES ({', '.join('?' for _ in names)}) ON CONFLICT ({conflict}) "
                + (f"DO UPDATE SET {update}" if update else "DO NOTHING"),
                values,
            )
            return RecordOutcome(plan.record, CREATED, written=written, kept=kept)
        if not writes:
            return RecordOutcome(plan.record, KEPT, kept=kept)
        assignments = ", ".join(f"{_quoted(n)} = ?" for n in writes)
        conn.execute(
            f"UPDATE {_table(self.spec.table)} SET {assignments} WHERE {where}",
            [*writes.values(), *keys.values()],
        )
        return RecordOutcome(plan.record, UPDATED, written=written, kept=kept)

    async def close(self) -> None:
        await self._db.close()
