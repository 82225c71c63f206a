"""``playline providers list|show NAME``: the catalog's providers in one place.

For each provider: its plan (when the catalog names one), the limits in force (the
catalog's pacing, with what ``playline limits set`` stored fleet-wide applied and the
rate the fleet adapted to, when the workers share a PostgreSQL store), its credit
price, its idempotency contract, its balance endpoint and the last balance read (from
the reconciliation's readings, see :mod:`playline.reconcile`); then each tool's price,
billing rule and contract. The catalog is the workers' (``$PLAYLINE_CATALOG``, else the
demo's) unless ``--catalog`` names another. ``--json`` prints one document.
"""

from __future__ import annotations

import argparse
import difflib
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from playline import demo
from playline.calls.catalog import Catalog, ProviderSpec, ToolSpec
from playline.cli.render import out, print_json
from playline.config import Settings
from playline.errors import PlaylineError
from playline.pacing.policy import PacingPolicy
from playline.stores.backends import open_stores
from playline.stores.balances import BalanceReading

if TYPE_CHECKING:
    from playline.pacing.fleet_store import FleetKeyState

__all__ = ["add_providers_parser", "cmd_providers", "provider_document"]

logger = logging.getLogger("playline.cli")

#: The pacing limits shown, in order, with how each reads.
_LIMITS = (
    ("rps", "{:g} rps"),
    ("burst", "burst {:g}"),
    ("per_minute", "{:g}/minute"),
    ("per_hour", "{:g}/hour"),
    ("per_day", "{:g}/day"),
    ("max_concurrency", "{:g} in flight"),
)


def add_providers_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    providers = sub.add_parser(
        "providers", help="the catalog's providers: plan, limits, price, contract, balance"
    )
    providers_sub = providers.add_subparsers(dest="providers_command", required=True)
    listing = providers_sub.add_parser("list", help="one line per provider and its tools")
    show = providers_sub.add_parser("show", help="everything about one provider")
    show.add_argument("name", help="the provider's name in the catalog")
    for parser in (listing, show):
        parser.add_argument(
            "--catalog", help="the catalog file (default: $PLAYLINE_CATALOG, else the demo's)"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON document")


async def cmd_providers(args: argparse.Namespace, settings: Settings) -> int:
    catalog = _catalog(args.catalog or settings.catalog_path)
    if args.providers_command == "show":
        name = _known(catalog, args.name)
        names = [name]
    else:
        names = sorted(catalog.providers)
    fleet = await _fleet_state(settings)
    balances = await _last_balances(settings)
    documents = [
        provider_document(name, catalog, fleet.get("keys", {}), balances.get(name))
        for name in names
    ]
    notes = [note for note in (fleet.get("note"), balances.get("note")) if note]
    if args.json:
        if args.providers_command == "show":
            print_json(documents[0])
        else:
            print_json({"providers": documents, "notes": notes})
        return 0
    for document in documents:
        lines = _show_lines(document) if args.providers_command == "show" else _list_lines(document)
        for line in lines:
            out().print(line, markup=False, highlight=False)
    for note in notes:
        out().print(f"({note})", markup=False, highlight=False)
    return 0


def _catalog(path: str | None) -> Catalog:
    return Catalog.from_toml(path or demo.CATALOG)


def _known(catalog: Catalog, name: str) -> str:
    """``name`` if the catalog declares that provider, else a one-line error."""
    if name in catalog.providers:
        return name
    if name in catalog.tools:
        provider = catalog.tools[name].provider
        raise PlaylineError(
            f"{name!r} is a tool of provider {provider!r}: `playline providers show {provider}`"
        )
    close = difflib.get_close_matches(name, list(catalog.providers), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    declared = ", ".join(sorted(catalog.providers)) or "none"
    raise PlaylineError(f"unknown provider {name!r}{hint} (the catalog declares: {declared})")


async def _fleet_state(settings: Settings) -> dict[str, Any]:
    """The fleet store's limits and adapted rates by pacing key, or a note why none."""
    dsn = settings.fleet_dsn
    if not dsn:
        return {"note": "limits are the catalog's: no fleet store, nothing learned is shared"}
    from playline.pacing.fleet_store import FleetPacer, FleetPacingUnavailable

    try:
        async with await FleetPacer.create(dsn, table_prefix=settings.fleet_table_prefix) as fleet:
            return {"keys": await fleet.read_state()}
    except (FleetPacingUnavailable, OSError) as err:
        logger.debug("no fleet limits: %s", err)
        return {"note": "limits are the catalog's: the fleet store is not reachable from here"}


async def _last_balances(settings: Settings) -> dict[str, Any]:
    """Each provider's last balance read, or a note why none could be looked up."""
    try:
        async with await open_stores(settings, create=False) as stores:
            if stores.balances is None:
                return {}
            found: dict[str, Any] = dict(await stores.balances.latest())
            return found
    except (PlaylineError, OSError) as err:
        logger.debug("no balance readings: %s", err)
        return {"note": "no balance readings: the workers' store is not reachable from here"}


def _limits_in_force(
    policy: PacingPolicy, key: str, fleet: dict[str, FleetKeyState]
) -> dict[str, Any]:
    """The catalog's limits for ``key`` with the fleet's applied, and its adapted rate."""
    state = fleet.get(key)
    set_fleet_wide = state.limits.given() if state is not None and state.limits else {}
    in_force = state.limits.applied_to(policy) if state is not None and state.limits else policy
    limits = {name: getattr(in_force, name) for name, _ in _LIMITS}
    document: dict[str, Any] = {"key": key, "limits": limits, "set_fleet_wide": set_fleet_wide}
    if state is not None and state.rate is not None:
        document["adapted_rps"] = state.rate.rps
        document["paused_for_s"] = state.rate.paused_for_s
    return document


def _billing(tool: ToolSpec) -> str:
    """A tool's billing rule in words."""
    billing = tool.billing
    price = billing.price(tool.credits)
    if billing.rule == "per_request":
        said = f"{price:g} per request"
    elif billing.rule == "per_field":
        said = "per field: " + ", ".join(f"{n} {p:g}" for n, p in billing.fields.items())
    elif billing.rule == "per_hit":
        said = f"{price:g} per hit ({billing.hit})"
    else:
        said = f"{price:g} charged, refunded on a miss ({billing.hit})"
    if billing.free_if:
        said += f"; free if {billing.free_if}"
    reported = billing.charged_header or billing.charged_field
    if reported:
        said += f"; the provider reports the charge in {reported}"
    return said


def _tool_document(tool: ToolSpec) -> dict[str, Any]:
    kind = "job" if tool.job is not None else "bulk" if tool.batch is not None else "single"
    return {
        "id": tool.id,
        "request": f"{tool.method} {tool.path}",
        "kind": kind,
        "credits": tool.credits,
        "max_credits": tool.max_credits,
        "billing_rule": tool.billing.rule,
        "billing": _billing(tool),
        "idempotency": tool.idempotency,
        "typical_hit_rate": tool.typical_hit_rate,
        "source": tool.source,
    }


def _reading(reading: BalanceReading | None) -> dict[str, Any] | None:
    if reading is None:
        return None
    when = datetime.fromtimestamp(reading.read_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return {**reading.as_dict(), "read_at": when}


def provider_document(
    name: str,
    catalog: Catalog,
    fleet: dict[str, FleetKeyState],
    last_balance: BalanceReading | None,
) -> dict[str, Any]:
    """Everything ``providers show`` says of one provider, JSON-ready."""
    spec: ProviderSpec = catalog.providers[name]
    plan = getattr(spec, "plan", None)  # when the catalog's providers name a plan
    plans = getattr(spec, "plans", None)
    described = getattr(getattr(spec, "plan_in_force", None), "description", None)
    limits = [_limits_in_force(spec.pacing, name, fleet)]
    for key in catalog.pacing_keys(name):
        limits.append(_limits_in_force(spec.key_pacing or spec.pacing, key, fleet))
    balance = spec.balance
    return {
        "name": name,
        "base_url": spec.base_url,
        "base_url_env": spec.base_url_env,
        "plan": str(plan) if plan is not None else None,
        "plans": sorted(plans) if isinstance(plans, dict) and plans else None,
        "plan_description": described,
        "limits": limits,
        "credit_price": spec.credit_price,
        "currency": spec.currency,
        "idempotency": spec.idempotency,
        "balance": (
            {"method": balance.method, "path": balance.path, "kind": balance.kind}
            if balance is not None
            else None
        ),
        "last_balance": _reading(last_balance),
        "source": spec.source,
        "tools": [
            _tool_document(tool)
            for tool_id, tool in sorted(catalog.tools.items())
            if tool.provider == name
        ],
    }


def _limit_text(document: dict[str, Any]) -> str:
    limits = document["limits"]
    parts = [said.format(limits[n]) for n, said in _LIMITS if limits.get(n) is not None]
    text = ", ".join(parts)
    if document["set_fleet_wide"]:
        text += " (fleet-wide: " + ", ".join(sorted(document["set_fleet_wide"])) + ")"
    if "adapted_rps" in document:
        text += f"; adapted to {document['adapted_rps']:g} rps"
    return text


def _price(document: dict[str, Any]) -> str:
    if document["credit_price"] is None:
        return "price per credit not set"
    return f"{document['credit_price']:g} {document['currency']} per credit"


def _balance_text(document: dict[str, Any]) -> str:
    balance, last = document["balance"], document["last_balance"]
    if balance is None:
        return "no balance endpoint declared"
    said = f"{balance['method']} {balance['path']} ({balance['kind']})"
    if last is None:
        return said + "; never read"
    if last["value"] is None:
        return said + f"; last read failed at {last['read_at']}: {last['error']}"
    return said + f"; last read {last['value']:g} {last['kind']} at {last['read_at']}"


def _list_lines(document: dict[str, Any]) -> list[str]:
    tools = ", ".join(t["id"] for t in document["tools"]) or "no tools"
    plan = f" plan {document['plan']}," if document["plan"] else ""
    return [
        f"{document['name']}:{plan} {_limit_text(document['limits'][0])}; "
        f"idempotency {document['idempotency']}; {_price(document)}; "
        f"balance: {_balance_text(document)}",
        f"  tools: {tools}",
    ]


def _show_lines(document: dict[str, Any]) -> list[str]:
    lines = [f"provider {document['name']}"]
    env = f" (${document['base_url_env']} overrides)" if document["base_url_env"] else ""
    lines.append(f"  base URL: {document['base_url']}{env}")
    if document["plan"] or document["plans"]:
        plans = f" (plans: {', '.join(document['plans'])})" if document["plans"] else ""
        said = f": {document['plan_description']}" if document["plan_description"] else ""
        lines.append(f"  plan: {document['plan'] or 'not chosen'}{said}{plans}")
    for limits in document["limits"]:
        lines.append(f"  limits in force for {limits['key']}: {_limit_text(limits)}")
    lines.append(f"  price: {_price(document)}")
    lines.append(f"  idempotency: {document['idempotency']}")
    lines.append(f"  balance: {_balance_text(document)}")
    if document["source"]:
        lines.append(f"  source: {document['source']}")
    for tool in document["tools"]:
        lines.append(f"  tool {tool['id']}: {tool['request']} ({tool['kind']})")
        lines.append(f"    billing: {tool['billing']} ({tool['billing_rule']})")
        lines.append(f"    idempotency: {tool['idempotency']}")
        if tool["typical_hit_rate"] is not None:
            lines.append(f"    typical hit rate: {tool['typical_hit_rate']:.0%}")
        if tool["source"]:
            lines.append(f"    source: {tool['source']}")
    return lines
