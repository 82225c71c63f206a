"""Every setting playline reads from the environment, read once, in one place.

``Settings.from_env()`` is called at the edge (the CLI, ``playline worker``, your
own worker code) and the resulting object is passed down; no other module reads
``os.environ``. Provider API keys and base-URL overrides are looked up by the
variable names the catalog gives, in the same snapshot (``Settings.environ``),
so a worker sees one consistent environment from start to finish.

Temporal's own variables are read through the SDK's environment configuration
(:mod:`temporalio.envconfig`), so profiles in ``temporal.toml`` work as they do for
the ``temporal`` CLI: ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``,
``TEMPORAL_TLS*``, ``TEMPORAL_PROFILE``, ``TEMPORAL_CONFIG_FILE``.

| variable | field | default |
|---|---|---|
| ``TEMPORAL_ADDRESS`` (or the profile's) | ``temporal_address`` | ``localhost:7233`` |
| ``TEMPORAL_NAMESPACE`` (or the profile's) | ``temporal_namespace`` | ``default`` |
| ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS*`` | ``temporal_api_key``, ``temporal_tls`` | none |
| ``PLAYLINE_HOME`` | ``home`` | ``.playline`` |
| ``PLAYLINE_STORE_URL`` | ``store_url`` | unset: ``sqlite:///`` + ``home`` |
| ``PLAYLINE_CATALOG`` | ``catalog_path`` | the demo catalog shipped in the package |
| ``PLAYLINE_PG_DSN`` | ``pg_dsn`` | deprecated: fleet pacing only; use ``PLAYLINE_STORE_URL`` |
| ``PLAYLINE_FLEET_PREFIX`` | ``fleet_table_prefix`` | ``playline_`` |
| ``PLAYLINE_PACING`` | ``pacing`` | ``governor`` (``off``: the unpaced baseline) |
| ``PLAYLINE_UI_URL`` | ``ui_url`` | derived from the Temporal address |
| ``PLAYLINE_SHEETS_URL`` | ``sheets_url`` | unset: no sheet links (``dev``, ``demo`` set it) |
| ``PLAYLINE_UI_TOKEN`` | ``ui_token`` | unset: ``playline ui`` serves loopback only |
| ``PLAYLINE_TASK_QUEUE`` | ``task_queue`` | ``playline`` |
| ``PLAYLINE_METRICS_HOST`` | ``metrics_host`` | ``127.0.0.1`` (``0.0.0.0`` in a container) |
| ``PLAYLINE_METRICS_PORT`` | ``metrics_port`` | unset: no metrics endpoint |
| ``PLAYLINE_HTTP_TRANSPORT`` | ``http_transport`` | ``aiohttp`` (``httpx``: httpcore's pool) |
| ``PLAYLINE_CODEC_KEYS`` | ``codec_keys`` | unset: payloads are not encrypted |
| ``PLAYLINE_CODEC_TOKEN`` | ``codec_token`` | unset: the codec server asks for no bearer token |
| ``PLAYLINE_DATA_DIRS`` | ``data_dirs`` | unset: no worker-local file (``store:`` works) |
| ``PLAYLINE_URL_LOADS`` | ``url_loads`` | ``off`` (``on``: public hosts) |
| ``PLAYLINE_URL_ALLOW_HOSTS`` | ``url_allow_hosts`` | none: private addresses refused |
| ``PLAYLINE_URL_MAX_BYTES`` | ``url_max_bytes`` | 512 MiB |
| ``PLAYLINE_WEBHOOK_URL`` | ``webhook_url`` | unset: asynchronous jobs are polled only |
| (catalog-named) | ``environ`` | API keys (``ACME_API_KEY``...) and ``base_url_env`` overrides |
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from temporalio.envconfig import ClientConfigProfile
from temporalio.service import TLSConfig

from playline.errors import PlaylineError

__all__ = ["ENV_VARIABLES", "Settings"]

#: Every variable ``Settings.from_env`` reads besides the catalog-named ones (API keys,
#: ``base_url_env``) and Temporal's own profile file: checked against deployments.
ENV_VARIABLES = (
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "TEMPORAL_API_KEY",
    "TEMPORAL_TLS",
    "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "TEMPORAL_TLS_SERVER_NAME",
    "TEMPORAL_PROFILE",
    "TEMPORAL_CONFIG_FILE",
    "PLAYLINE_HOME",
    "PLAYLINE_STORE_URL",
    "PLAYLINE_CATALOG",
    "PLAYLINE_PG_DSN",
    "PLAYLINE_FLEET_PREFIX",
    "PLAYLINE_PACING",
    "PLAYLINE_UI_URL",
    "PLAYLINE_SHEETS_URL",
    "PLAYLINE_UI_TOKEN",
    "PLAYLINE_WEBHOOK_URL",
    "PLAYLINE_TASK_QUEUE",
    "PLAYLINE_METRICS_HOST",
    "PLAYLINE_METRICS_PORT",
    "PLAYLINE_HTTP_TRANSPORT",
    "PLAYLINE_CODEC_KEYS",
    "PLAYLINE_CODEC_TOKEN",
    "PLAYLINE_DATA_DIRS",
    "PLAYLINE_URL_LOADS",
    "PLAYLINE_URL_ALLOW_HOSTS",
    "PLAYLINE_URL_MAX_BYTES",
)

DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
DEFAULT_TASK_QUEUE = "playline"
DEFAULT_HOME = ".playline"
DEFAULT_FLEET_PREFIX = "playline_"
PACING_MODES = ("governor", "off")
SQLITE_URL_PREFIX = "sqlite:///"
POSTGRES_URL_PREFIXES = ("postgresql://", "postgres://")
#: The largest CSV a worker downloads from a URL unless ``PLAYLINE_URL_MAX_BYTES`` says.
DEFAULT_URL_MAX_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """Where a worker keeps its state and whom it talks to.

    Build it with :meth:`from_env` at the edge; construct it directly (every
    field defaulted) in tests and embedded code. ``environ`` is the snapshot
    catalog-named variables (API keys, base URL overrides) are read from.
    """

    temporal_address: str = DEFAULT_TEMPORAL_ADDRESS
    temporal_namespace: str = DEFAULT_NAMESPACE
    #: Temporal Cloud / cluster API key (sent as a bearer token; never printed).
    temporal_api_key: str | None = field(default=None, repr=False)
    #: TLS to the Temporal frontend: False, True (system roots) or a TLSConfig.
    temporal_tls: bool | TLSConfig = False
    temporal_rpc_metadata: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), repr=False
    )
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
    #: The sheet view's base URL (``playline ui``): a run's details and the CLI's
    #: summary link to its sheet there; ``None``: no link.
    sheets_url: str | None = None
    #: The token ``playline ui`` asks of requests from beyond this machine (``--token``).
    ui_token: str | None = field(default=None, repr=False)
    #: The task queue workers poll and plays are started on.
    task_queue: str = DEFAULT_TASK_QUEUE
    #: Where ``--metrics-port`` binds: loopback, or 0.0.0.0 in a container.
    metrics_host: str = "127.0.0.1"
    #: Serve Prometheus metrics on this port (``None``: serve none).
    metrics_port: int | None = None
    http_max_connections: int = 256
    http_max_keepalive: int = 32
    #: "aiohttp" (httpx's API over aiohttp, the default) or "httpx" (httpcore's pool).
    http_transport: Literal["aiohttp", "httpx"] = "aiohttp"
    #: ``kid1:<base64 32 bytes>,kid2:...``: encrypt payloads (the first key) and
    #: decrypt them (any key); see :mod:`playline.codec`. Secret: never printed.
    codec_keys: str | None = field(default=None, repr=False)
    #: A bearer token the codec server requires of every request (``None``: none).
    codec_token: str | None = field(default=None, repr=False)
    #: Directories whose files a play may name as a worker-local CSV or fixture path
    #: (resolved, symlinks followed); empty: none (``store:`` references always work).
    data_dirs: tuple[Path, ...] = ()
    #: Whether plays may name ``http(s)://`` CSV URLs for the worker to download.
    url_loads: bool = False
    #: Hosts (name or address, optionally ``:port``) a CSV URL may reach although they
    #: are private (an internal file server); every other private, loopback or
    #: link-local address is refused, on every redirect hop.
    url_allow_hosts: tuple[str, ...] = ()
    #: The most bytes a CSV download may hold.
    url_max_bytes: int = DEFAULT_URL_MAX_BYTES
    #: the public base URL of ``playline webhook``, passed to asynchronous providers
    #: as each job's callback (unset: their jobs are polled only)
    webhook_url: str | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``environ`` (default: the process environment), then ``overrides``.

        Overrides whose value is ``None`` are ignored, so CLI flags can be passed
        straight through (``--home`` unset keeps ``$PLAYLINE_HOME``).
        """
        env = dict(os.environ if environ is None else environ)
        temporal = _temporal_profile(env)
        tls = temporal.get("tls", False)
        settings = cls(
            temporal_address=temporal.get("target_host") or DEFAULT_TEMPORAL_ADDRESS,
            temporal_namespace=temporal.get("namespace") or DEFAULT_NAMESPACE,
            temporal_api_key=temporal.get("api_key"),
            temporal_tls=tls if isinstance(tls, bool | TLSConfig) else False,
            temporal_rpc_metadata=MappingProxyType(dict(temporal.get("rpc_metadata") or {})),
            home=Path(env.get("PLAYLINE_HOME") or DEFAULT_HOME),
            catalog_path=env.get("PLAYLINE_CATALOG") or None,
            store_url=env.get("PLAYLINE_STORE_URL") or None,
            pg_dsn=env.get("PLAYLINE_PG_DSN") or None,
            fleet_table_prefix=env.get("PLAYLINE_FLEET_PREFIX") or DEFAULT_FLEET_PREFIX,
            pacing=env.get("PLAYLINE_PACING") or "governor",
            ui_url=env.get("PLAYLINE_UI_URL") or None,
            sheets_url=env.get("PLAYLINE_SHEETS_URL") or None,
            ui_token=env.get("PLAYLINE_UI_TOKEN") or None,
            task_queue=env.get("PLAYLINE_TASK_QUEUE") or DEFAULT_TASK_QUEUE,
            metrics_host=env.get("PLAYLINE_METRICS_HOST") or "127.0.0.1",
            metrics_port=_port(env.get("PLAYLINE_METRICS_PORT")),
            http_transport="httpx" if env.get("PLAYLINE_HTTP_TRANSPORT") == "httpx" else "aiohttp",
            codec_keys=env.get("PLAYLINE_CODEC_KEYS") or None,
            codec_token=env.get("PLAYLINE_CODEC_TOKEN") or None,
            data_dirs=_paths(env.get("PLAYLINE_DATA_DIRS")),
            url_loads=_switch("PLAYLINE_URL_LOADS", env.get("PLAYLINE_URL_LOADS")),
            url_allow_hosts=tuple(
                h.strip()
                for h in (env.get("PLAYLINE_URL_ALLOW_HOSTS") or "").split(",")
                if h.strip()
            ),
            url_max_bytes=_positive("PLAYLINE_URL_MAX_BYTES", env.get("PLAYLINE_URL_MAX_BYTES"))
            or DEFAULT_URL_MAX_BYTES,
            webhook_url=env.get("PLAYLINE_WEBHOOK_URL") or None,
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

    def client_connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``temporalio.client.Client.connect``."""
        kwargs: dict[str, Any] = {
            "target_host": self.temporal_address,
            "namespace": self.temporal_namespace,
            "tls": self.temporal_tls,
        }
        if self.temporal_api_key:
            kwargs["api_key"] = self.temporal_api_key
        if self.temporal_rpc_metadata:
            kwargs["rpc_metadata"] = dict(self.temporal_rpc_metadata)
        return kwargs

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
    def budgets_path(self) -> Path:
        """The SQLite budget ledger's file, next to the other stores (see
        :mod:`~playline.stores.budgets_ledger`: created by its first use)."""
        return (self.sqlite_dir or self.home) / "budgets.db"

    @property
    def balances_path(self) -> Path:
        """The SQLite file of the balance readings, next to the other stores (see
        :mod:`~playline.stores.balances`: created by its first use)."""
        return (self.sqlite_dir or self.home) / "balances.db"

    @property
    def jobs_path(self) -> Path:
        """The SQLite job ledger's file, next to the other stores (see
        :mod:`~playline.stores.jobs_ledger`: created by its first use)."""
        return (self.sqlite_dir or self.home) / "jobs.db"

    @property
    def journal_dir(self) -> Path:
        """Where a worker journals paid results its receipt store would not take."""
        return self.home / "journal"

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

    def secret_values(self, variables: Iterable[str] = ()) -> list[str]:
        """Every secret this worker holds: the values of ``variables`` (the catalog's API
        key variables), the Temporal API key, the codec keys and token, the sheet view's
        token, and the passwords in the store URLs. Error texts pass a scrubber holding
        them all."""
        values = [self.environ.get(name, "") for name in variables]
        values += [self.temporal_api_key or "", self.codec_token or "", self.ui_token or ""]
        if self.codec_keys:
            values.append(self.codec_keys)
            values += [part.partition(":")[2].strip() for part in self.codec_keys.split(",")]
        for url in (self.store_url, self.pg_dsn):
            if url:
                values += _url_passwords(url)
        return [v for v in values if v]

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


def _port(value: str | None) -> int | None:
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise PlaylineError(f"PLAYLINE_METRICS_PORT must be a port number, got {value!r}")
    return int(value)


def _url_passwords(url: str) -> list[str]:
    """The passwords a database URL carries: in its netloc and as ``?password=``."""
    parts = urlsplit(url)
    found = [parts.password or ""]
    found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password"]
    return [unquote(p) for p in found if p] + [p for p in found if p]


def _paths(value: str | None) -> tuple[Path, ...]:
    """``PLAYLINE_DATA_DIRS``: directories separated by ``os.pathsep``."""
    return tuple(Path(p).expanduser() for p in (value or "").split(os.pathsep) if p.strip())


_ON = ("1", "on", "true", "yes")
_OFF = ("", "0", "off", "false", "no")


def _switch(name: str, value: str | None) -> bool:
    text = (value or "").strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise PlaylineError(f"{name} must be on or off, got {value!r}")


def _positive(name: str, value: str | None) -> int | None:
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise PlaylineError(f"{name} must be a positive whole number, got {value!r}")
    return int(value)


def _temporal_profile(env: Mapping[str, str]) -> dict[str, Any]:
    """The Temporal connection as the SDK's envconfig reads it (profile file + variables)."""
    try:
        profile = ClientConfigProfile.load(
            profile=env.get("TEMPORAL_PROFILE") or None, override_env_vars=env
        )
    except Exception as err:  # a malformed temporal.toml or TLS file
        raise PlaylineError(f"Temporal client configuration is invalid: {err}") from None
    return dict(profile.to_client_connect_config())
