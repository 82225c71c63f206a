"""A sink made ready to sync: its mapping (the catalog's, plus the caller's) and its
destination, for the command line and the play step alike.

The catalog's provider entry is read through :class:`ProviderLike` (what a
``ProviderSpec`` offers), so this room needs nothing of the call path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import httpx

from playline.errors import PlaylineError
from playline.pacing.pacer import Pacer
from playline.sinks.destination import Destination
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

__all__ = ["POLICIES", "ProviderLike", "open_destination", "sync_mapping"]

#: The overwrite policies, by name.
POLICIES: tuple[FieldPolicy, ...] = ("always", "if_blank", "if_verified")


class ProviderLike(Protocol):
    """What a sink reads of its catalog provider (``ProviderSpec`` has it)."""

    @property
    def timeout_s(self) -> float: ...

    def key_envs(self) -> tuple[str, ...]: ...

    def resolved_base_url(self, environ: Mapping[str, str]) -> str: ...


def sync_mapping(
    name: str,
    spec: HubSpotSinkSpec | SalesforceSinkSpec | PostgresSinkSpec,
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


async def open_destination(
    name: str,
    spec: HubSpotSinkSpec | SalesforceSinkSpec | PostgresSinkSpec,
    *,
    provider: ProviderLike | None,
    environ: Mapping[str, str],
    http: httpx.AsyncClient,
    pacer: Pacer,
    fields: Sequence[str],
    patience_s: float = 300.0,
    need_token: bool = True,
) -> tuple[Destination, Callable[[], Awaitable[None]]]:
    """The sink's destination, and what closes what it opened (not ``http`` nor
    ``pacer``: the caller's)."""
    if isinstance(spec, HubSpotSinkSpec | SalesforceSinkSpec):
        if provider is None:
            raise PlaylineError(f"sink {name!r} names provider {spec.provider!r}, unknown")
        envs = provider.key_envs()
        token = environ.get(envs[0], "") if envs else ""
        if not token and need_token:
            raise PlaylineError(
                f"sink {name!r} needs a token: set ${envs[0] if envs else 'its auth.env'}"
            )
        if isinstance(spec, SalesforceSinkSpec):
            salesforce = SalesforceDestination(
                spec,
                base_url=provider.resolved_base_url(environ),
                token=token,
                http=http,
                pacer=pacer,
                pacing_key=spec.provider,
                timeout_s=provider.timeout_s,
                patience_s=patience_s,
            )
            return salesforce, salesforce.close
        hubspot = HubSpotDestination(
            spec,
            base_url=provider.resolved_base_url(environ),
            token=token,
            http=http,
            pacer=pacer,
            pacing_key=spec.provider,
            timeout_s=provider.timeout_s,
            patience_s=patience_s,
        )
        return hubspot, hubspot.close
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
