"""``playline budgets set|list|get``: named budgets that every run naming them draws from.

A named budget (``RunOptions(budget="NAME")``) is a limit in credits per UTC day or
month, shared by every run and worker using the store: each paid call reserves its
worst case against the current period before it is sent (see
:mod:`playline.stores.budgets`). These commands define budgets and show what each
period has spent and holds reserved. They use the workers' store as every client
command does (``open_stores(settings, create=False)``: the store must exist), and
write only its budget ledger, which a client may create.
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import UTC, datetime
from typing import Any

from playline.cli.render import print_json
from playline.config import Settings
from playline.errors import InvalidBudget, UnknownBudget
from playline.stores.backends import open_stores
from playline.stores.budgets import (
    BudgetState,
    BudgetStore,
    NamedBudget,
    Period,
    check_name,
    named_budget_ref,
    period_end,
)

__all__ = ["add_budgets_parser", "cmd_budgets"]


def add_budgets_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    budgets = sub.add_parser(
        "budgets",
        help="define and show named budgets shared by runs (credits per day or month)",
        description="Named budgets: every run with RunOptions(budget=NAME) reserves its paid "
        "calls against the current UTC day's or month's budget, fleet-wide.",
    )
    actions = budgets.add_subparsers(dest="budgets_command", required=True)
    set_cmd = actions.add_parser("set", help="create or change a named budget")
    set_cmd.add_argument("name", help="budget name: letters, digits, '_', '.', '-' (1 to 64)")
    set_cmd.add_argument("--per-day", metavar="N", help="credits per UTC day, > 0")
    set_cmd.add_argument("--per-month", metavar="N", help="credits per UTC month, > 0")
    set_cmd.add_argument("--json", action="store_true", help="print one JSON document")
    listing = actions.add_parser("list", help="every named budget and its current period")
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    get = actions.add_parser("get", help="one named budget and its current period")
    get.add_argument("name", help="budget name")
    get.add_argument("--json", action="store_true", help="print one JSON document")


class _Usage(Exception):
    """A command line the command refuses, in one line (exit 2)."""


async def cmd_budgets(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``budgets set|list|get``. Exit 0; 2 for a bad command line (one line on
    stderr); store errors and an unknown budget are ``PlaylineError`` s (exit 1)."""
    try:
        if args.budgets_command == "set":
            period, limit = _period_and_limit(args)
            name = check_name(args.name)
            async with await open_stores(settings, create=False) as stores:
                await stores.budgets.define(name, period=period, limit=limit)
                shown = await _shown(stores.budgets, [NamedBudget(name, period, limit)])
            return _print(args, shown[0])
        if args.budgets_command == "get":
            name = check_name(args.name)
            async with await open_stores(settings, create=False) as stores:
                found = [d for d in await stores.budgets.definitions() if d.name == name]
                if not found:
                    raise UnknownBudget(
                        f"no budget named {name!r}; define it with "
                        f"`playline budgets set {name} --per-day N` (or --per-month N)"
                    )
                shown = await _shown(stores.budgets, found)
            return _print(args, shown[0])
        async with await open_stores(settings, create=False) as stores:
            shown = await _shown(stores.budgets, await stores.budgets.definitions())
        return _print_list(args, shown)
    except (_Usage, InvalidBudget) as err:
        print(f"playline budgets {args.budgets_command}: {err}", file=sys.stderr)
        return 2


def _period_and_limit(args: argparse.Namespace) -> tuple[Period, float]:
    given: list[tuple[Period, str]] = []
    if args.per_day is not None:
        given.append(("day", args.per_day))
    if args.per_month is not None:
        given.append(("month", args.per_month))
    if len(given) != 1:
        raise _Usage("give exactly one of --per-day N and --per-month N")
    period, text = given[0]
    try:
        limit = float(text)
    except ValueError:
        limit = math.nan
    if not (math.isfinite(limit) and limit > 0):
        raise _Usage(f"--per-{period} must be a number of credits > 0, got {text!r}")
    return period, limit


async def _shown(budgets: BudgetStore, definitions: list[NamedBudget]) -> list[dict[str, Any]]:
    """Each definition with its current period's figures, as printed (and as JSON)."""
    shown = []
    for definition in definitions:
        state: BudgetState | None = await budgets.state(named_budget_ref(definition.name))
        assert state is not None  # defined, so its current period is known
        shown.append(
            {
                "name": definition.name,
                "period": definition.period,
                "limit": definition.limit,
                "current_period": state.budget,
                "period_limit": state.limit,
                "spent": state.spent,
                "reserved": state.reserved,
                "remaining": state.remaining,
                "renews_at": _renewal(definition.period, state.budget),
            }
        )
    return shown


def _renewal(period: Period, current: str) -> str:
    """When the current period ends (UTC), read from its id (``named:NAME@2026-12-04``)
    so it agrees with the store's clock, not this machine's."""
    stamp = current.rsplit("@", 1)[1] + ("-01" if period == "month" else "")
    start = datetime.strptime(stamp, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    return datetime.fromtimestamp(period_end(period, start), UTC).strftime("%Y-%m-%d %H:%M UTC")


def _print(args: argparse.Namespace, budget: dict[str, Any]) -> int:
    if args.json:
        print_json(budget)
        return 0
    print(
        f"{budget['name']}: {budget['limit']:g} credits per {budget['period']}\n"
        f"  this period ({budget['current_period']}): {budget['spent']:g} spent, "
        f"{budget['reserved']:g} reserved, {budget['remaining']:g} of "
        f"{budget['period_limit']:g} left; renews {budget['renews_at']}"
    )
    return 0


def _print_list(args: argparse.Namespace, shown: list[dict[str, Any]]) -> int:
    if args.json:
        print_json(shown)
        return 0
    if not shown:
        print("no named budgets yet; define one with `playline budgets set NAME --per-day N`")
        return 0
    header = ("NAME", "PERIOD", "LIMIT", "SPENT", "RESERVED", "REMAINING", "CURRENT")
    rows = [header] + [
        (
            b["name"],
            b["period"],
            f"{b['period_limit']:g}",
            f"{b['spent']:g}",
            f"{b['reserved']:g}",
            f"{b['remaining']:g}",
            b["current_period"],
        )
        for b in shown
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0
