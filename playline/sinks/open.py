"""A sink made ready to sync, and synced: its mapping (the catalog's, plus the
caller's), its destination and the sync ledger, for the command line and the play
step alike (:func:`sync_sink`).

The catalog's provider entry is read through :class:`ProviderLike` (what a
``ProviderSpec`` offers), so this room needs nothing of the call path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import httpx

from playline.config import Settings
from playline.contract import SyncInput
from playline.errors import PlaylineError
from playline.pacing.pacer import Pacer
from playline.sinks.crm import CrmDestination
from playline.sinks.destination import Destination
from playline.sinks.engine import SyncReport, sync_run
from playline.sinks.hubspot import HubSpotDestination
from playline.sinks.plan import SyncMapping
from playline.sinks.postgres import PostgresDestination
from playline.sinks.salesforce import SalesforceDestination
from playline.sinks.spec import (
    FieldPolicy,
    HubSpotSinkSpec,
    PostgresSinkSpec,
    SalesforceSinkSpec,
)
from playline.stores.receipts import ReceiptStore
from playline.stores.sheet import SheetStore
from playline.stores.sync_ledger import open_sync_ledger

__all__ = [
    "POLICIES",
    "ProviderLike",
    "RunStores",
    "find_sink",
    "open_destination",
    "sync_mapping",
    "sync_sink",
]

#: The overwrite policies, by name.
POLICIES: tuple[FieldPolicy, ...] = ("always", "if_blank", "if_verified")

#: A sink of any kind, as the catalog holds it.
AnySinkSpec = HubSpotSinkSpec | SalesforceSinkSpec | PostgresSinkSpec

#: The CRM destinations, by sink kind.
CRM_DESTINATIONS: dict[str, type[CrmDestination[Any]]] = {
    "hubspot": HubSpotDestination,
    "salesforce": SalesforceDestination,
}


class ProviderLike(Protocol):
    """What a sink reads of its catalog provider (``ProviderSpec`` has it)."""

    @property
    def timeout_s(self) -> float: ...

    def key_envs(self) -> tuple[str, ...]: ...

    def resolved_base_url(self, environ: Mapping[str, str]) -> str: ...


class RunStores(Protocol):
    """Where a sync reads the run's rows and keeps its batches' receipts (a worker's
    ``Services`` and the command line's ``Stores`` both have them)."""

    @property
    def sheet(self) -> SheetStore: ...

    @property
    def receipts(self) -> ReceiptStore: ...


def sync_mapping(
    name: str,
    spec: AnySinkSpec,
    *,
    extra_map: Mapping[str, str] | None = None,
    id_column: str | None = None,
    policies: Mapping[str, str] | None = None,
) -> SyncMapping:
    """The sink's mapping with the caller's columns, id and policies on top."""
    fields = {**spec.map, **(extra_map or {})}
    chosen: dict[str, FieldPolicy] = dict(spec.policies)
    for field_name, policy in (policies or {}).items():
        if policy not in POLICIES:
            raise PlaylineError(
                f"policy for {field_name!r} must be always, if_blank or if_verified, not {policy!r}"
            )
        if policy == "if_blank" and isinstance(spec, SalesforceSinkSpec):
            raise PlaylineError(f"sink {name!r}: salesforce sinks do not support if_blank yet")
        if policy == "if_verified" and field_name not in spec.verified:
            raise PlaylineError(
                f"sink {name!r} declares no `verified` rule for {field_name!r} (if_verified)"
            )
        chosen[field_name] = policy
    column = id_column or spec.id_column
    if not column:
        raise PlaylineError(
            f"sink {name!r} names no id_column: give one (--id COLUMN; id= in ctx.sync)"
        )
    if not fields:
        raise PlaylineError(
            f"nothing to write: sink {name!r} maps no column (--map COLUMN=FIELD; map= in ctx.sync)"
        )
    return SyncMapping(column, fields, chosen, spec.verified, spec.provenance_fields)


def find_sink(sinks: Mapping[str, AnySinkSpec], name: str) -> AnySinkSpec:
    """The catalog's sink ``name``; unknown, an error naming the ones it declares."""
    spec = sinks.get(name)
    if spec is None:
        declared = ", ".join(sorted(sinks)) or "none"
        raise PlaylineError(f"unknown sink {name!r}; the catalog declares: {declared}")
    return spec


async def open_destination(
    name: str,
    spec: AnySinkSpec,
    *,
    providers: Mapping[str, ProviderLike],
    environ: Mapping[str, str],
    http: httpx.AsyncClient,
    pacer: Pacer,
    fields: Sequence[str],
    patience_s: float = 300.0,
    need_token: bool = True,
) -> tuple[Destination, Callable[[], Awaitable[None]]]:
    """The sink's destination, and what closes what it opened (not ``http`` nor
    ``pacer``: the caller's). A CRM's provider is looked up in ``providers``."""
    if isinstance(spec, HubSpotSinkSpec | SalesforceSinkSpec):
        provider = providers.get(spec.provider)
        if provider is None:
            raise PlaylineError(f"sink {name!r} names provider {spec.provider!r}, unknown")
        envs = provider.key_envs()
        token = environ.get(envs[0], "") if envs else ""
        if not token and need_token:
            raise PlaylineError(
                f"sink {name!r} needs a token: set ${envs[0] if envs else 'its auth.env'}"
            )
        crm = CRM_DESTINATIONS[spec.kind](
            spec,
            base_url=provider.resolved_base_url(environ),
            token=token,
            http=http,
            pacer=pacer,
            pacing_key=spec.provider,
            timeout_s=provider.timeout_s,
            patience_s=patience_s,
        )
        return crm, crm.close
    from playline.db.postgres import PostgresPool
    from playline.db.urls import redact_url

    url = environ.get(spec.url_env, "")
    if not url:
        raise PlaylineError(f"sink {name!r} needs a database URL: set ${spec.url_env}")
    pool = await PostgresPool.open(url, max_size=2)
    table = PostgresDestination(spec, pool, where=redact_url(url))
    try:
        await table.check(list(fields))
    except BaseException:
        await pool.close()
        raise
    return table, pool.close


async def sync_sink(
    request: SyncInput,
    spec: AnySinkSpec,
    mapping: SyncMapping,
    *,
    settings: Settings,
    providers: Mapping[str, ProviderLike],
    http: httpx.AsyncClient,
    pacer: Pacer,
    stores: RunStores,
    dry_run: bool = False,
) -> SyncReport:
    """One sync of ``request`` (:func:`~playline.sinks.engine.sync_run`) with its
    destination and the sync ledger opened for it and closed after. ``mapping`` is
    the request's, made by :func:`sync_mapping` (the caller checks it before opening
    anything). A dry run needs no token: it sends nothing."""
    destination, close = await open_destination(
        request.sink,
        spec,
        providers=providers,
        environ=settings.environ,
        http=http,
        pacer=pacer,
        fields=mapping.destination_fields(),
        patience_s=request.patience_s,
        need_token=not dry_run,
    )
    try:
        ledger, close_ledger = await open_sync_ledger(settings)
        try:
            return await sync_run(
                sink=request.sink,
                run_ref=request.run_ref,
                mapping=mapping,
                sheet=stores.sheet,
                ledger=ledger,
                receipts=stores.receipts,
                destination=destination,
                dry_run=dry_run,
                lease_ttl_s=request.lease_ttl_s,
            )
        finally:
            await close_ledger()
    finally:
        await close()
