"""Opening the receipt, sheet and budget stores from ``Settings``: one function for workers
and clients.

``Settings.store`` (``PLAYLINE_STORE_URL``) names the backend:

* ``sqlite:///DIR`` (the default, ``DIR`` = ``PLAYLINE_HOME``): ``DIR/receipts.db``
  and ``DIR/sheet.db`` (and the budget and job ledgers ``DIR/budgets.db``,
  ``DIR/jobs.db``), for one machine;
* ``postgresql://user@host/db`` (or ``postgres://``): both stores in one database,
  shared by every worker and client of a fleet. Select a schema other than
  ``public`` with libpq's options: ``?options=-csearch_path%3Dplayline``.

A worker opens them with ``create=True`` (files created, schema migrated); a
client that reads or exports with ``create=False``, which creates nothing and
raises :class:`~playline.db.errors.StoreNotFound`, naming where it
looked, when the workers' store is not there. The budget ledger is the exception:
clients write it too (``playline budgets set``), so whoever uses it first creates it
(see :mod:`~playline.stores.budgets_ledger`), and the job ledger likewise (see
:mod:`~playline.stores.jobs_ledger`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from playline.config import Settings
from playline.db.errors import InvalidStoreUrl, StoreNotFound
from playline.db.urls import redact_url
from playline.stores.balances import BalanceLedger
from playline.stores.budgets import BudgetStore
from playline.stores.jobs import JobStore
from playline.stores.receipts import ReceiptStore
from playline.stores.sheet import SheetStore

__all__ = ["Stores", "open_stores"]


@dataclass
class Stores:
    """The open receipt, sheet and budget stores, closed together (``async with`` or
    :meth:`close`)."""

    receipts: ReceiptStore
    sheet: SheetStore
    budgets: BudgetStore
    #: the job ledger (asynchronous provider jobs); like the budget ledger, opened
    #: (SQLite: created) by its first use
    jobs: JobStore
    #: where they live, without any password (for logs and messages)
    where: str
    #: what the stores share and is closed after them (PostgreSQL: the pool)
    shared: list[Callable[[], Awaitable[None]]] = field(default_factory=list, repr=False)
    #: the providers' balance readings (``playline runs reconcile``); opened (SQLite:
    #: created) by its first use, like the job ledger; ``None``: stores assembled by hand
    balances: BalanceLedger | None = None
    _closed: bool = field(default=False, repr=False)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.receipts.close()
            await self.sheet.close()
            await self.budgets.close()
            await self.jobs.close()
            if self.balances is not None:
                await self.balances.close()
        finally:
            for close in self.shared:
                await close()

    async def __aenter__(self) -> Stores:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def open_stores(
    settings: Settings, *, create: bool, clock: Callable[[], float] | None = None
) -> Stores:
    """Open the stores ``settings.store`` names.

    Args:
        settings: the store URL (``PLAYLINE_STORE_URL``) or home (``PLAYLINE_HOME``).
        create: a worker's open (create the SQLite files, migrate the schema);
            ``False`` for a client, which must find the workers' store and
            changes nothing about it.
        clock: seconds since the epoch for leases and timestamps (tests move it
            by hand); default: this machine's clock for SQLite, the database
            server's for PostgreSQL.
    """
    url = settings.store
    if settings.store_is_postgres:
        return await _open_postgres(url, create=create, clock=clock)
    if settings.sqlite_dir is None:
        raise InvalidStoreUrl(
            f"PLAYLINE_STORE_URL {redact_url(url)!r} names no store playline knows; "
            "use sqlite:///DIR or postgresql://USER@HOST/DB"
        )
    return await _open_sqlite(settings, create=create, clock=clock or time.time)


async def _open_sqlite(settings: Settings, *, create: bool, clock: Callable[[], float]) -> Stores:
    from playline.stores.budgets_ledger import BudgetLedger
    from playline.stores.jobs_ledger import JobLedger
    from playline.stores.receipts_ledger import ReceiptLedger
    from playline.stores.sheet_ledger import SheetLedger

    if not create:
        for path in (settings.receipts_path, settings.sheet_path):
            if not path.is_file():
                raise StoreNotFound(
                    f"no playline store at {path}; set PLAYLINE_HOME or PLAYLINE_STORE_URL "
                    "to the workers' store"
                )
    receipts = await ReceiptLedger.in_file(
        settings.receipts_path, create=create, clock=clock
    ).ensure_open()
    try:
        sheet = SheetLedger.in_file(settings.sheet_path, create=create, clock=clock)
        if create:
            await sheet.open()  # a worker leaves the file its clients look for
    except BaseException:
        await receipts.close()
        raise
    budgets = BudgetLedger.in_file(settings.budgets_path, clock=clock)  # opened by its first use
    jobs = JobLedger.in_file(settings.jobs_path, clock=clock)  # opened by its first use
    balances = BalanceLedger.in_file(settings.balances_path, clock=clock)  # opened by first use
    return Stores(receipts, sheet, budgets, jobs, where=str(settings.sqlite_dir), balances=balances)


async def _open_postgres(url: str, *, create: bool, clock: Callable[[], float] | None) -> Stores:
    from playline.db.postgres import PostgresPool
    from playline.stores.budgets_ledger import BudgetLedger
    from playline.stores.jobs_ledger import JobLedger
    from playline.stores.receipts_ledger import ReceiptLedger
    from playline.stores.sheet_ledger import SheetLedger

    # Every store over one pool; each migrates its own component of playline_schema.
    pool = await PostgresPool.open(url)
    try:
        # Opened now: a worker's start migrates it, a client finds no store at once.
        receipts = await ReceiptLedger.in_database(pool, create=create, clock=clock).ensure_open()
    except BaseException:
        await pool.close()
        raise
    return Stores(
        receipts,
        SheetLedger.in_database(pool, create=create, clock=clock),  # migrated by first use
        BudgetLedger.in_database(pool, clock=clock),
        JobLedger.in_database(pool, clock=clock),
        where=pool.where,
        shared=[pool.close],
        balances=BalanceLedger.in_database(pool, clock=clock),
    )
