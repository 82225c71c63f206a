"""The worker's long-lived resources, opened from ``Settings``.

One ``Services`` per worker process: the catalog, the governor, the receipt and
sheet stores, the shared httpx client. The plugin opens them when the worker starts
and closes them when it stops (``run_context``); activities reach them through the
``ServicesHolder`` they were constructed with, never through globals.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx

from playline import demo
from playline.calls.catalog import Catalog
from playline.calls.fixtures import FixtureBook
from playline.calls.http import ProviderClient
from playline.calls.transport import make_http_client
from playline.config import PACING_MODES, Settings
from playline.errors import CatalogError
from playline.pacing.governor import Governor
from playline.pacing.pacer import Pacer
from playline.pacing.unpaced import UnpacedGovernor
from playline.stores.receipts import ReceiptStore
from playline.stores.receipts_sqlite import SqliteReceiptStore
from playline.stores.sheet import SheetStore
from playline.stores.sheet_sqlite import SqliteSheetStore

if TYPE_CHECKING:
    from playline.pacing.fleet_store import FleetPacer

logger = logging.getLogger("playline")


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
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.catalog = catalog
        self.governor = governor
        self.receipts = receipts
        self.sheet = sheet
        self.http = http
        self.provider = ProviderClient(catalog, http, environ=settings.environ)
        self._fixture_books: dict[tuple[str, ...], FixtureBook] = {}

    @classmethod
    async def open(cls, settings: Settings | None = None) -> Services:
        """Open everything ``settings`` describes (default: ``Settings.from_env()``)."""
        settings = settings or Settings.from_env()
        # Without a catalog of its own, a worker serves the demo's (package data).
        catalog = Catalog.from_toml(settings.catalog_path or demo.CATALOG)
        http = make_http_client(
            max_connections=settings.http_max_connections,
            max_keepalive=settings.http_max_keepalive,
            transport=settings.http_transport,
        )
        governor, fleet = await _open_governor(settings, catalog)
        services = cls(
            settings=settings,
            catalog=catalog,
            governor=governor,
            fleet=fleet,
            receipts=SqliteReceiptStore(settings.receipts_path),
            sheet=SqliteSheetStore(settings.sheet_path),
            http=http,
        )
        logger.info("playline services open: home=%s tools=%d", settings.home, len(catalog.tools))
        return services

    def fixture_book(self, paths: list[str]) -> FixtureBook:
        """Fixture files are parsed once per worker, not once per chunk."""
        key = tuple(sorted(paths))
        if key not in self._fixture_books:
            self._fixture_books[key] = FixtureBook.load(key)
        return self._fixture_books[key]

    async def close(self) -> None:
        await self.governor.aclose()
        if self.fleet is not None:
            await self.fleet.aclose()
        await self.http.aclose()
        await self.receipts.close()
        await self.sheet.close()


async def _open_governor(settings: Settings, catalog: Catalog) -> tuple[Pacer, FleetPacer | None]:
    """The worker's governor, sharing pacing through PostgreSQL when a DSN is set."""
    if settings.pacing not in PACING_MODES:
        raise CatalogError(f"PLAYLINE_PACING must be 'governor' or 'off', not {settings.pacing!r}")
    if settings.pacing == "off":
        return UnpacedGovernor(catalog.providers), None
    if not settings.pg_dsn:
        return Governor(catalog.pacing_policies()), None
    from playline.pacing.fleet_store import FleetPacer

    fleet = await FleetPacer.create(settings.pg_dsn, table_prefix=settings.fleet_table_prefix)
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
