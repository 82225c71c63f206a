"""Reading a provider's balance, once per run and phase.

The reading is receipted like a call: the store is asked first, and a reading it
already holds (a retried activity, a replayed workflow, a second worker) is the
answer; only a run and phase with no reading sends the request. A failed read is
recorded too, with a one-line reason that never holds a key (the worker's scrubber
passes over it), so the reconciliation names it instead of reading again.

A provider used with several API keys of *different* accounts (no ``auth.account``)
has one balance per key: they are read one by one and added up. Keys of one named
account share its balance: it is read once, with the first key.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from playline.calls.balance_spec import BalanceSpec
from playline.calls.catalog import Catalog, ProviderSpec
from playline.calls.log_scrub import scrub_http_logs
from playline.freshness import dig
from playline.stores.balances import BalanceLedger, BalanceReading, Phase

__all__ = ["BalanceUnread", "read_balance", "read_run_balances", "readable_providers"]

#: How long one balance request may take, in seconds.
BALANCE_TIMEOUT_S = 10.0


class BalanceUnread(Exception):
    """A balance could not be read (the message is one line, without the key)."""


def readable_providers(catalog: Catalog, environ: Mapping[str, str]) -> list[str]:
    """The providers that declare a balance and whose key this worker holds."""
    names = []
    for name, spec in sorted(catalog.providers.items()):
        if spec.balance is None:
            continue
        if any(not environ.get(env) for env in spec.key_envs()):
            continue
        names.append(name)
    return names


def _auth_requests(
    spec: ProviderSpec, environ: Mapping[str, str]
) -> list[tuple[dict[str, str], dict[str, str]]]:
    """The headers and query parameters of each balance to read (per key, or one for a
    named account): the key in its header, or in its query parameter (``auth.query``)."""
    accept = {"Accept": "application/json"}
    if spec.auth is None:
        return [(accept, {})]
    auth = spec.auth
    envs = auth.envs[:1] if auth.account is not None else auth.envs
    requests = []
    for env in envs:
        secret = environ.get(env, "")
        if auth.query is not None:
            requests.append((accept, {auth.query: secret}))
            continue
        assert auth.header is not None  # AuthSpec fills it when query is unset
        value = f"{auth.scheme} {secret}" if auth.scheme else secret
        requests.append(({**accept, auth.header: value}, {}))
    return requests


def _figure(answer: Any, balance: BalanceSpec) -> float:
    value = dig(answer, balance.field)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BalanceUnread(f"the answer holds no number at {balance.field!r}")
    try:
        number = float(value)
    except ValueError:
        raise BalanceUnread(f"the answer holds no number at {balance.field!r}") from None
    if not math.isfinite(number):
        raise BalanceUnread(f"the answer holds no number at {balance.field!r}")
    return number


async def read_balance(
    http: httpx.AsyncClient, name: str, spec: ProviderSpec, environ: Mapping[str, str]
) -> float:
    """The provider's balance now (summed over its accounts); ``BalanceUnread`` else."""
    balance = spec.balance
    if balance is None:
        raise BalanceUnread(f"provider {name!r} declares no balance")
    url = spec.resolved_base_url(environ) + balance.path
    total = 0.0
    if spec.auth is not None and spec.auth.query is not None:
        scrub_http_logs([spec.auth.query])  # the URL holds the key: keep it out of the logs
    for headers, params in _auth_requests(spec, environ):
        try:
            response = await http.request(
                balance.method, url, headers=headers, params=params, timeout=BALANCE_TIMEOUT_S
            )
        except httpx.HTTPError as err:
            raise BalanceUnread(f"{type(err).__name__} from {balance.path}") from None
        if response.status_code != 200:
            raise BalanceUnread(f"{balance.path} answered {response.status_code}")
        try:
            answer = response.json()
        except ValueError:
            raise BalanceUnread(f"{balance.path} answered something that is not JSON") from None
        total += _figure(answer, balance)
    return total


async def read_run_balances(
    store: BalanceLedger,
    http: httpx.AsyncClient,
    catalog: Catalog,
    environ: Mapping[str, str],
    *,
    run: str,
    run_id: str,
    phase: Phase,
    scrub: Callable[[str], str] = str,
) -> list[BalanceReading]:
    """Every readable provider's balance at ``phase`` of the run: the store's reading
    when it has one, else read now and recorded (the first recorded wins)."""
    names = readable_providers(catalog, environ)
    if not names:
        return []
    known = {
        (r.provider, r.phase): r for r in await store.readings(run, run_id) if r.phase == phase
    }

    async def one(name: str) -> BalanceReading:
        stored = known.get((name, phase))
        if stored is not None:
            return stored
        spec = catalog.providers[name]
        assert spec.balance is not None
        value: float | None = None
        error: str | None = None
        try:
            value = await read_balance(http, name, spec, environ)
        except BalanceUnread as err:
            error = scrub(str(err))
        reading = BalanceReading(run, run_id, phase, name, spec.balance.kind, value, error)
        return await store.record(reading)

    # All at once: one slow provider must not hold the others past the activity's time.
    return list(await asyncio.gather(*(one(name) for name in names)))
