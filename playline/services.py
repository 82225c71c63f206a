"""The worker's long-lived resources, opened from ``Settings``.

One ``Services`` per worker process: the catalog, the governor, the receipt and
sheet stores (:func:`~playline.stores.backends.open_stores`, migrated at start),
the shared httpx client and the fixture books. The plugin opens them when the worker starts
and closes them when it stops (``run_context``); activities reach them through the
``ServicesHolder`` they were constructed with, never through globals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import httpx

from playline.calls.catalog import Catalog
from playline.calls.fixtures import FixtureBook
from playline.calls.http import ProviderClient, SecretScrubber
from playline.calls.transport import make_http_client
from playline.config import PACING_MODES, Settings
from playline.errors import CatalogError
from playline.pace_recorder import PaceRecorder
from playline.pacing.governor import Governor
from playline.pacing.pacer import Pacer
from playline.pacing.unpaced import UnpacedGovernor
from playline.package_data import DEMO_CATALOG
from playline.stores.backends import Stores, open_stores
from playline.stores.balances import BalanceLedger
from playline.stores.budgets import BudgetStore
from playline.stores.budgets_ledger import BudgetLedger
from playline.stores.jobs import JobStore
from playline.stores.jobs_ledger import JobLedger
from playline.stores.journal import ResultJournal
from playline.stores.receipts import ReceiptStore
from playline.stores.sheet import SheetStore

if TYPE_CHECKING:
    from playline.pacing.fleet_store import FleetPacer

logger = logging.getLogger("playline")

#: a ledger ``Services`` holds (budgets, jobs)
L = TypeVar("L")


def _ledger(given: L | None, stores_own: L | None, in_file: Callable[[], L]) -> L:
    """The ledger given, else the stores' own; services assembled by hand without
    either (tests) get the SQLite ledger under their settings, opened by its first use."""
    if given is not None:
        return given
    if stores_own is not None:
        return stores_own
    return in_file()


class Services:
    """The open resources of one worker process."""

    def __init__(
        self,
        *,
        settings: Settings,
        catalog: Catalog,
        governor: Pacer,
        receipts: ReceiptStore,
        sheet: SheetStore,
        http: httpx.AsyncClient,
        fleet: FleetPacer | None = None,
        stores: Stores | None = None,
        budgets: BudgetStore | None = None,
        jobs: JobStore | None = None,
    ) -> None:
        self.settings = settings
        self._stores = stores
        self.fleet = fleet
        self.catalog = catalog
        self.governor = governor
        self.receipts = receipts
        self.sheet = sheet
        #: the budget ledger (reservations before paid calls)
        self.budgets: BudgetStore = _ledger(
            budgets,
            stores.budgets if stores is not None else None,
            lambda: BudgetLedger.in_file(settings.budgets_path),
        )
        #: the job ledger (asynchronous provider jobs)
        self.jobs: JobStore = _ledger(
            jobs,
            stores.jobs if stores is not None else None,
            lambda: JobLedger.in_file(settings.jobs_path),
        )
        #: the providers' balance readings (``playline.reconcile``), opened by first use
        self.balances: BalanceLedger = (
            stores.balances
            if stores is not None and stores.balances is not None
            else BalanceLedger.in_file(settings.balances_path)
        )
        self.http = http
        #: every secret of this worker (API keys, store passwords, codec keys): error
        #: texts that leave the worker pass through it
        self.scrub = SecretScrubber(settings.secret_values(catalog.secret_variables()))
        self.provider = ProviderClient(catalog, http, environ=settings.environ, scrub=self.scrub)
        #: paid results the receipt store would not take, kept on this worker's disk
        self.journal = ResultJournal(settings.journal_dir)
        self._fixture_books: dict[tuple[tuple[str, int, int], ...], FixtureBook] = {}
        #: the runs' pace over time, sampled for the sheet view's charts
        self.pace = PaceRecorder(sheet, governor)

    @classmethod
    async def open(cls, settings: Settings | None = None) -> Services:
        """Open everything ``settings`` describes (default: ``Settings.from_env()``)."""
        settings = settings or Settings.from_env()
        for warning in settings.deprecations():
            logger.warning(warning)
        # Without a catalog of its own, a worker serves the demo's (package data).
        catalog = Catalog.from_toml(settings.catalog_path or DEMO_CATALOG)
        stores = await open_stores(settings, create=True)
        try:
            governor, fleet = await open_governor(settings, catalog)
        except BaseException:
            await stores.close()
            raise
        http = make_http_client(
            max_connections=settings.http_max_connections,
            max_keepalive=settings.http_max_keepalive,
            transport=settings.http_transport,
        )
        services = cls(
            settings=settings,
            catalog=catalog,
            governor=governor,
            fleet=fleet,
            receipts=stores.receipts,
            sheet=stores.sheet,
            http=http,
            stores=stores,
        )
        logger.info("playline services open: stores=%s tools=%d", stores.where, len(catalog.tools))
        try:
            await services.settle_journal()
        except Exception as err:  # the store is down: the next chunk tries again
            logger.warning("journalled results not recorded yet: %s", err)
        return services

    async def settle_journal(self) -> None:
        """Record results an earlier attempt on this worker paid for but could not store
        (see :mod:`~playline.stores.journal`); nothing to do is one ``stat``."""
        if self.journal.pending():
            await self.journal.replay(self.receipts)

    def fixture_book(self, paths: list[str]) -> FixtureBook:
        """The fixture book of ``paths``, opened once per worker while the files are unchanged.

        Indexing fixture files blocks; activities call :meth:`open_fixture_book`
        first (``prepare_run`` does), so chunks find the book open. Every path must
        lie under the worker's data directories (a play names them): checked first.
        """
        from playline.datasets import check_fixture_paths

        check_fixture_paths(self.settings, paths)
        key = _fixture_key(paths)
        book = self._fixture_books.get(key)
        if book is None:
            book = FixtureBook.open(paths, index_dir=self.settings.fixture_index_dir)
            self._fixture_books[key] = book
        return book

    async def open_fixture_book(self, paths: list[str]) -> FixtureBook:
        """:meth:`fixture_book`, indexing the files on a thread when they are new (the
        paths checked first, as there)."""
        from playline.datasets import check_fixture_paths

        check_fixture_paths(self.settings, paths)
        key = _fixture_key(paths)
        if key not in self._fixture_books:
            book = await asyncio.to_thread(
                FixtureBook.open, paths, index_dir=self.settings.fixture_index_dir
            )
            if self._fixture_books.setdefault(key, book) is not book:
                book.close()  # another activity opened the same files meanwhile
        return self._fixture_books[key]

    async def close(self) -> None:
        await self.governor.aclose()
        if self.fleet is not None:
            await self.fleet.aclose()
        await self.http.aclose()
        for book in self._fixture_books.values():
            book.close()
        if self._stores is not None:
            await self._stores.close()
        else:
            await self.receipts.close()
            await self.sheet.close()
            await self.budgets.close()
            await self.jobs.close()
        if self._stores is None or self._stores.balances is not self.balances:
            await self.balances.close()


def _fixture_key(paths: list[str]) -> tuple[tuple[str, int, int], ...]:
    """The fixture paths with each one's size and modification time: an edited file is
    indexed again, an unchanged one is not even digested again."""
    key = []
    for name in sorted(paths):
        path = Path(name)
        for file in sorted(path.glob("*.jsonl")) if path.is_dir() else [path]:
            try:
                stat = file.stat()
            except OSError:
                key.append((str(file), -1, -1))  # FixtureBook.open names the missing path
            else:
                key.append((str(file), stat.st_size, stat.st_mtime_ns))
    return tuple(key)


async def open_governor(settings: Settings, catalog: Catalog) -> tuple[Pacer, FleetPacer | None]:
    """The governor of a worker (or of a command that calls providers itself, ``playline
    sync``), sharing pacing through PostgreSQL when the store is there (or the
    deprecated ``PLAYLINE_PG_DSN`` is set). Close the fleet after the governor."""
    if settings.pacing not in PACING_MODES:
        raise CatalogError(f"PLAYLINE_PACING must be 'governor' or 'off', not {settings.pacing!r}")
    if settings.pacing == "off":
        return UnpacedGovernor(catalog.providers), None
    dsn = settings.fleet_dsn
    if not dsn:
        return Governor(catalog.pacing_policies()), None
    from playline.pacing.fleet_store import FleetPacer

    fleet = await FleetPacer.create(dsn, table_prefix=settings.fleet_table_prefix)
    governor = Governor(catalog.pacing_policies(), fleet=fleet)
    await governor.start()
    return governor, fleet


class ServicesHolder:
    """A late-bound reference to ``Services``, filled while the worker runs."""

    def __init__(self, services: Services | None = None) -> None:
        self._services = services

    def set(self, services: Services | None) -> None:
        self._services = services

    @property
    def services(self) -> Services:
        if self._services is None:
            raise RuntimeError(
                "playline services are not open; run activities through a worker built "
                "with PlaylinePlugin"
            )
        return self._services


class HolderActivities:
    """The base of the activity classes that need the worker's services: each is built
    before the services open (the plugin registers it), so it keeps the holder and reads
    ``self._holder.services`` per activity."""

    def __init__(self, holder: ServicesHolder) -> None:
        self._holder = holder
