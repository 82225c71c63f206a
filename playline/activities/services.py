"""The worker's long-lived resources and where they are configured.

One ``Services`` per worker process: the catalog, the governor, the receipt and
sheet stores, the shared httpx client. The plugin opens them when the worker starts
and closes them when it stops (``run_context``); activities reach them through the
``ServicesHolder`` they were constructed with, never through globals.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from playline.activities.catalog import Catalog, load_catalog
from playline.activities.fixtures import FixtureBook
from playline.activities.governor import Governor
from playline.activities.provider_http import ProviderClient
from playline.activities.receipts import ReceiptStore, SqliteReceiptStore
from playline.activities.sheet import SheetStore, SqliteSheetStore
from playline.activities.unpaced import UnpacedGovernor
from playline.errors import CatalogError

if TYPE_CHECKING:
    from playline.activities.fleet_pacing import FleetPacer

logger = logging.getLogger("playline")


@dataclass(frozen=True)
class Settings:
    """Where a worker keeps its state; every field has an environment variable."""

    home: Path = field(default_factory=lambda: Path(os.environ.get("PLAYLINE_HOME", ".playline")))
    catalog_path: str | None = field(default_factory=lambda: os.environ.get("PLAYLINE_CATALOG"))
    http_max_connections: int = 256
    #: httpcore scans every pooled connection per request; keep the idle pool small.
    http_max_keepalive: int = 32
    #: PostgreSQL for fleet-wide pacing; unset keeps pacing per worker process.
    pg_dsn: str | None = field(default_factory=lambda: os.environ.get("PLAYLINE_PG_DSN"))
    fleet_table_prefix: str = field(
        default_factory=lambda: os.environ.get("PLAYLINE_FLEET_PREFIX", "playline_")
    )
    #: "governor" (default) or "off": the flat, unpaced baseline for benchmarks.
    pacing: str = field(default_factory=lambda: os.environ.get("PLAYLINE_PACING", "governor"))

    @property
    def receipts_path(self) -> Path:
        return self.home / "receipts.db"

    @property
    def sheet_path(self) -> Path:
        return self.home / "sheet.db"


class Services:
    """The open resources of one worker process."""

    def __init__(
        self,
        *,
        settings: Settings,
        catalog: Catalog,
        governor: Governor,
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
        self.provider = ProviderClient(catalog, http)
        self._fixture_books: dict[tuple[str, ...], FixtureBook] = {}

    @classmethod
    async def open(cls, settings: Settings | None = None) -> Services:
        settings = settings or Settings()
        catalog = load_catalog(settings.catalog_path)
        http = httpx.AsyncClient(
            limits=httpx.Limits(
                max_connections=settings.http_max_connections,
                max_keepalive_connections=settings.http_max_keepalive,
            ),
            timeout=httpx.Timeout(15.0, connect=5.0),
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


async def _open_governor(
    settings: Settings, catalog: Catalog
) -> tuple[Governor, FleetPacer | None]:
    """The worker's governor, sharing pacing through PostgreSQL when a DSN is set."""
    if settings.pacing == "off":
        return UnpacedGovernor.from_catalog(catalog), None
    if settings.pacing != "governor":
        raise CatalogError(f"PLAYLINE_PACING must be 'governor' or 'off', not {settings.pacing!r}")
    if not settings.pg_dsn:
        return Governor.from_catalog(catalog), None
    from playline.activities.fleet_pacing import FleetPacer

    fleet = await FleetPacer.create(settings.pg_dsn, table_prefix=settings.fleet_table_prefix)
    governor = Governor.from_catalog(catalog, fleet=fleet)
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
