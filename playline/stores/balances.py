"""The balance readings: what each provider said an account had, before and after a run.

A reading is receipted like a call: the first one recorded for ``(run, run_id, phase,
provider)`` is the reading, and a retried activity or a replayed workflow finds it
instead of asking the provider again (``record`` keeps the first and returns it). A
failed read is a reading too (``error`` set, no ``value``), so a provider that refused
is named in the reconciliation rather than read again and again.

One table, ``playline_balance_readings``, in its own SQLite file (``balances.db``,
next to the other stores) or in the shared PostgreSQL database (the ``balances``
component), created by its first use by a worker or a client alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from playline.db.conn import Conn
from playline.db.migrations import Migration, Schema
from playline.db.store import LedgerStore

__all__ = ["PHASES", "BalanceLedger", "BalanceReading", "Phase"]

#: When a run's balances are read.
Phase = Literal["before", "after"]
PHASES: tuple[Phase, ...] = ("before", "after")

SCHEMA = Schema(
    "balances",
    (
        Migration(
            1,
            "balance readings, one per run, phase and provider",
            statements=(
                "CREATE TABLE playline_balance_readings (run {text} NOT NULL,"
                " run_id {text} NOT NULL, phase {text} NOT NULL, provider {text} NOT NULL,"
                " kind {text} NOT NULL, value {real}, error {text}, read_at {real} NOT NULL,"
                " PRIMARY KEY (run, run_id, phase, provider))",
                "CREATE INDEX playline_balance_readings_latest"
                " ON playline_balance_readings (provider, read_at)",
            ),
        ),
    ),
)

_COLUMNS = "run, run_id, phase, provider, kind, value, error, read_at"


@dataclass(frozen=True, slots=True)
class BalanceReading:
    """One provider's balance as read at one phase of one run.

    Attributes:
        run: the play's workflow id.
        run_id: its Temporal run id (a workflow id reused later is another run).
        phase: ``"before"`` the first call or ``"after"`` the last.
        provider: the catalog's provider name.
        kind: ``"remaining"`` (credits left) or ``"used"`` (a usage counter).
        value: the figure read; ``None`` when the read failed.
        error: why the read failed (one line, no key), else ``None``.
        read_at: when it was read (seconds since the epoch, the store's clock).
    """

    run: str
    run_id: str
    phase: str
    provider: str
    kind: str
    value: float | None
    error: str | None = None
    read_at: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The reading as JSON output shows it (``runs reconcile``, ``providers show``):
        every field but ``run_id``."""
        reading = asdict(self)
        del reading["run_id"]
        return reading


def _reading(row: tuple[Any, ...]) -> BalanceReading:
    run, run_id, phase, provider, kind, value, error, read_at = row
    return BalanceReading(
        str(run),
        str(run_id),
        str(phase),
        str(provider),
        str(kind),
        float(value) if value is not None else None,
        str(error) if error is not None else None,
        float(read_at),
    )


class BalanceLedger(LedgerStore):
    """The balance readings on SQLite or PostgreSQL (see the module docstring)."""

    SCHEMA = SCHEMA

    async def record(self, reading: BalanceReading) -> BalanceReading:
        """Keep ``reading`` unless one is recorded for its run, phase and provider;
        returns the reading that stands (the first)."""

        def tx(conn: Conn) -> BalanceReading:
            read_at = reading.read_at or self._now(conn)
            conn.execute(
                f"INSERT INTO playline_balance_readings ({_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run, run_id, phase, provider) DO NOTHING",
                [
                    reading.run,
                    reading.run_id,
                    reading.phase,
                    reading.provider,
                    reading.kind,
                    reading.value,
                    reading.error,
                    read_at,
                ],
            )
            row = conn.one(
                f"SELECT {_COLUMNS} FROM playline_balance_readings"
                " WHERE run = ? AND run_id = ? AND phase = ? AND provider = ?",
                [reading.run, reading.run_id, reading.phase, reading.provider],
            )
            assert row is not None
            return _reading(row)

        return await (await self._ready()).write(tx)

    async def readings(self, run: str, run_id: str | None = None) -> list[BalanceReading]:
        """The run's readings (every Temporal run of the id when ``run_id`` is None)."""

        def read(conn: Conn) -> list[BalanceReading]:
            sql = f"SELECT {_COLUMNS} FROM playline_balance_readings WHERE run = ?"
            params: list[object] = [run]
            if run_id is not None:
                sql += " AND run_id = ?"
                params.append(run_id)
            return [_reading(row) for row in conn.all(sql + " ORDER BY read_at, provider", params)]

        return await (await self._ready()).read(read)

    async def latest(self) -> dict[str, BalanceReading]:
        """Each provider's latest successful reading (``playline providers``)."""

        def read(conn: Conn) -> dict[str, BalanceReading]:
            rows = conn.all(
                f"SELECT {_COLUMNS} FROM playline_balance_readings"
                " WHERE value IS NOT NULL ORDER BY read_at",
            )
            return {reading.provider: reading for reading in map(_reading, rows)}

        return await (await self._ready()).read(read)
