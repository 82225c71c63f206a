"""``playline budgets set|list|get|release``: named budgets that every run naming them
draws from, and the reservations a run left open.

A named budget (``RunOptions(budget="NAME")``) is a limit in credits per UTC day or
month, shared by every run and worker using the store: each paid call reserves its
worst case against the current period before it is sent (see
:mod:`playline.stores.budgets`). These commands define budgets and show what each
period has spent and holds reserved. They use the workers' store as every client
command does (``open_stores(settings, create=False)``: the store must exist), and
write only its budget ledger, which a client may create.

``release --run ID`` settles or releases what a run left reserved (as the play does
itself when it ends; a terminated run runs no code): the same rule,
:func:`playline.calls.budget.end_run_budgets`. It refuses a run Temporal says is still
running; when Temporal cannot be asked, it says so and goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import sys
from datetime import UTC, datetime
from typing import Any

from playline.calls.budget import end_run_budgets
from playline.cli.render import print_json
from playline.config import Settings
from playline.errors import InvalidBudget, PlaylineError, UnknownBudget
from playline.stores.backends import open_stores
from playline.stores.budget_ids import BudgetId, NamedBudgetId
from playline.stores.budgets import (
    BudgetState,
    BudgetStore,
    NamedBudget,
    Period,
    check_name,
    period_bounds,
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
    release = actions.add_parser(
        "release",
        help="settle or release what a run that ended left reserved (a terminated run)",
    )
    release.add_argument("--run", required=True, metavar="ID", help="the play's id (or its run id)")
    release.add_argument("--json", action="store_true", help="print one JSON document")


class _Usage(Exception):
    """A command line the command refuses, in one line (exit 2)."""


async def cmd_budgets(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``budgets set|list|get``. Exit 0; 2 for a bad command line (one line on
    stderr); store errors and an unknown budget are ``PlaylineError`` s (exit 1)."""
    try:
        if args.budgets_command == "release":
            return await _release(args, settings)
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


#: How long ``release`` waits for Temporal before it goes on without asking it.
TEMPORAL_CHECK_S = 10.0


async def _release(args: argparse.Namespace, settings: Settings) -> int:
    run, note = await _ended_run(args.run, settings)
    async with await open_stores(settings, create=False) as stores:
        end = await end_run_budgets(stores.budgets, stores.receipts, stores.jobs, run)
    if args.json:
        print_json({**dataclasses.asdict(end), "note": note})
        return 0
    print(end.line() + (f" ({note})" if note else ""))
    return 0


async def _ended_run(given: str, settings: Settings) -> tuple[str, str]:
    """The run whose reservations ``release`` ends: a play's id is asked of Temporal
    (still running: refused; else its run id), anything else is taken as the run id
    reservations record. The second value says what could not be checked."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    from playline.worker import connect

    try:
        client = await asyncio.wait_for(connect(settings=settings), TEMPORAL_CHECK_S)
        desc = await asyncio.wait_for(
            client.get_workflow_handle(given).describe(), TEMPORAL_CHECK_S
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return given, "no play with this id in Temporal: taken as a run id"
        return given, f"Temporal could not be asked whether it still runs: {err}"
    except (PlaylineError, OSError, RuntimeError, TimeoutError) as err:
        return given, f"Temporal could not be asked whether it still runs: {err or 'timeout'}"
    if desc.status == WorkflowExecutionStatus.RUNNING:
        raise PlaylineError(
            f"play {given} is still running: it settles its reservations when it ends "
            f"(cancel it with `playline runs cancel {given}`)"
        )
    return desc.run_id, ""


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
        state: BudgetState | None = await budgets.state(NamedBudgetId(definition.name))
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
                "renews_at": _renewal(state.ref),
            }
        )
    return shown


def _renewal(current: BudgetId) -> str:
    """When the current period ends (UTC), read from its id (``named:NAME@2026-12-04``)
    so it agrees with the store's clock, not this machine's."""
    bounds = period_bounds(current) if isinstance(current, NamedBudgetId) else None
    if bounds is None:
        return "?"
    return datetime.fromtimestamp(bounds[1], UTC).strftime("%Y-%m-%d %H:%M UTC")


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
