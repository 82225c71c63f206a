"""Every setting playline reads from the environment, read once, in one place.

``Settings.from_env()`` is called at the edge (the CLI, ``playline worker``, your
own worker code) and the resulting object is passed down; no other module reads
``os.environ``. Provider API keys and base-URL overrides are looked up by the
variable names the catalog gives, in the same snapshot (``Settings.environ``),
so a worker sees one consistent environment from start to finish.

| variable | field | default |
|---|---|---|
| ``TEMPORAL_ADDRESS`` | ``temporal_address`` | ``localhost:7233`` |
| ``PLAYLINE_HOME`` | ``home`` | ``.playline`` |
| ``PLAYLINE_STORE_URL`` | ``store_url`` | unset: ``sqlite:///`` + ``home`` |
| ``PLAYLINE_CATALOG`` | ``catalog_path`` | the demo catalog shipped in the package |
| ``PLAYLINE_PG_DSN`` | ``pg_dsn`` | deprecated: fleet pacing only; use ``PLAYLINE_STORE_URL`` |
| ``PLAYLINE_FLEET_PREFIX`` | ``fleet_table_prefix`` | ``playline_`` |
| ``PLAYLINE_PACING`` | ``pacing`` | ``governor`` (``off``: the unpaced baseline) |
| ``PLAYLINE_UI_URL`` | ``ui_url`` | derived from the Temporal address |
| (catalog-named) | ``environ`` | API keys (``ACME_API_KEY``...) and ``base_url_env`` overrides |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = ["Settings"]

DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"
DEFAULT_HOME = ".playline"
DEFAULT_FLEET_PREFIX = "playline_"
PACING_MODES = ("governor", "off")
SQLITE_URL_PREFIX = "sqlite:///"
POSTGRES_URL_PREFIXES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class Settings:
    """Where a worker keeps its state and whom it talks to.

    Build it with :meth:`from_env` at the edge; construct it directly (every
    field defaulted) in tests and embedded code. ``environ`` is the snapshot
    catalog-named variables (API keys, base URL overrides) are read from.
    """

    temporal_address: str = DEFAULT_TEMPORAL_ADDRESS
    home: Path = Path(DEFAULT_HOME)
    catalog_path: str | None = None
    #: Where the receipt and sheet stores live: ``sqlite:///DIR`` (a directory
    #: holding ``receipts.db`` and ``sheet.db``; ``sqlite:////abs`` is absolute) or
    #: ``postgresql://...`` (both stores and fleet pacing in one database). Unset:
    #: SQLite under ``home``.
    store_url: str | None = None
    #: Deprecated alias: PostgreSQL for fleet-wide pacing while the stores stay in
    #: SQLite. Set ``store_url`` to a PostgreSQL URL instead.
    pg_dsn: str | None = None
    fleet_table_prefix: str = DEFAULT_FLEET_PREFIX
    #: "governor" (default) or "off": the flat, unpaced baseline for benchmarks.
    pacing: str = "governor"
    #: The Temporal UI's base URL for links; None derives it from the address.
    ui_url: str | None = None
    http_max_connections: int = 256
    #: httpcore scans every pooled connection per request; keep the idle pool small.
    http_max_keepalive: int = 32
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``environ`` (default: the process environment), then ``overrides``.

        Overrides whose value is ``None`` are ignored, so CLI flags can be passed
        straight through (``--home`` unset keeps ``$PLAYLINE_HOME``).
        """
        env = dict(os.environ if environ is None else environ)
        settings = cls(
            temporal_address=env.get("TEMPORAL_ADDRESS") or DEFAULT_TEMPORAL_ADDRESS,
            home=Path(env.get("PLAYLINE_HOME") or DEFAULT_HOME),
            catalog_path=env.get("PLAYLINE_CATALOG") or None,
            store_url=env.get("PLAYLINE_STORE_URL") or None,
            pg_dsn=env.get("PLAYLINE_PG_DSN") or None,
            fleet_table_prefix=env.get("PLAYLINE_FLEET_PREFIX") or DEFAULT_FLEET_PREFIX,
            pacing=env.get("PLAYLINE_PACING") or "governor",
            ui_url=env.get("PLAYLINE_UI_URL") or None,
            environ=MappingProxyType(env),
        )
        return settings.with_overrides(**overrides)

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with the non-``None`` overrides applied (``home`` may be a str)."""
        chosen = {k: v for k, v in overrides.items() if v is not None}
        if "home" in chosen:
            chosen["home"] = Path(chosen["home"])
        return replace(self, **chosen) if chosen else self

    def with_environ(self, **variables: str) -> Settings:
        """A copy whose ``environ`` also holds ``variables`` (without touching the process)."""
        return replace(self, environ=MappingProxyType({**self.environ, **variables}))

    @property
    def store(self) -> str:
        """The store URL in force: ``store_url``, else SQLite under ``home``."""
        return self.store_url or f"{SQLITE_URL_PREFIX}{self.home}"

    @property
    def store_is_postgres(self) -> bool:
        return self.store.startswith(POSTGRES_URL_PREFIXES)

    @property
    def sqlite_dir(self) -> Path | None:
        """The directory of the SQLite store files; ``None`` for another backend."""
        if not self.store.startswith(SQLITE_URL_PREFIX):
            return None
        return Path(self.store[len(SQLITE_URL_PREFIX) :] or ".")

    @property
    def receipts_path(self) -> Path:
        """The SQLite receipt store's file (under ``home`` when the store is not SQLite)."""
        return (self.sqlite_dir or self.home) / "receipts.db"

    @property
    def sheet_path(self) -> Path:
        """The SQLite sheet store's file (under ``home`` when the store is not SQLite)."""
        return (self.sqlite_dir or self.home) / "sheet.db"

    @property
    def fixture_index_dir(self) -> Path:
        """Where fixture files are indexed (one SQLite file per set of fixture files)."""
        return self.home / "fixtures"

    @property
    def fleet_dsn(self) -> str | None:
        """The PostgreSQL database fleet pacing uses: the store's when it is PostgreSQL,
        else the deprecated ``PLAYLINE_PG_DSN``; ``None``: pacing per worker process."""
        if self.store_is_postgres:
            return self.store
        return self.pg_dsn

    def deprecations(self) -> list[str]:
        """One line per deprecated setting in use, saying what to set instead."""
        if not self.pg_dsn:
            return []
        if self.store_is_postgres:
            return [
                "PLAYLINE_PG_DSN is deprecated and ignored: fleet pacing uses the "
                "PLAYLINE_STORE_URL database; unset PLAYLINE_PG_DSN"
            ]
        return [
            "PLAYLINE_PG_DSN is deprecated: set PLAYLINE_STORE_URL=<the same postgresql:// "
            "URL> to keep both stores and fleet pacing in that database (PLAYLINE_PG_DSN "
            "alone still paces the fleet there while the stores stay in SQLite)"
        ]
