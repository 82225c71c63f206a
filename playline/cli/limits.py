"""``playline limits show|set``: read and change fleet-wide provider limits at run time.

The limits live in PostgreSQL (see :mod:`playline.pacing.fleet_store`), in the
tables the workers read: the database is the workers' ``$PLAYLINE_STORE_URL`` (or the
deprecated ``$PLAYLINE_PG_DSN``) and the table prefix
``$PLAYLINE_FLEET_PREFIX``, exactly as the workers take them from ``Settings``;
every running worker with fleet pacing reads them at least once a second, so
``playline limits set acme --rps 5 --max-concurrency 4`` slows the whole fleet
within a second, without a restart or redeploy. Each limit is set on its own
(``--per-day 1000`` alone changes only the daily quota); a limit never set
fleet-wide keeps the workers' catalog value.

The main CLI wires these in with::

    add_limits_parser(subparsers)      # adds the "limits" command
    ...
    return run_limits(args, settings)  # when args.command == "limits"
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TextIO

from playline.config import Settings


def add_limits_parser(subparsers: Any) -> None:
    """Add the ``limits`` command (with ``show`` and ``set``) to an argparse subparsers object."""
    limits = subparsers.add_parser(
        "limits",
        help="show or change fleet-wide provider limits (PostgreSQL)",
        description="Show or change the fleet-wide pacing limits every worker applies "
        "within a second.",
    )
    limits.add_argument(
        "--dsn",
        default=None,
        help="PostgreSQL DSN (default: the workers' PLAYLINE_STORE_URL, else PLAYLINE_PG_DSN)",
    )
    limits.add_argument(
        "--table-prefix",
        default=None,
        help="prefix of the pacing tables (default: $PLAYLINE_FLEET_PREFIX or playline_)",
    )
    actions = limits.add_subparsers(dest="limits_action", metavar="{show,set}")
    actions.required = True
    actions.add_parser("show", help="print each key's configured and adapted limits")
    set_cmd = actions.add_parser("set", help="set a key's limits (takes effect within 1 s)")
    set_cmd.add_argument("key", help="pacing key, e.g. a provider name or 'acme:key=ab12cd'")
    set_cmd.add_argument("--rps", type=float, help="requests per second, > 0")
    set_cmd.add_argument("--max-concurrency", type=int, help="most calls in flight, >= 1")
    set_cmd.add_argument("--burst", type=int, help="calls allowed back to back, >= 1")
    set_cmd.add_argument("--per-minute", type=int, help="most calls in any minute, >= 1")
    set_cmd.add_argument("--per-hour", type=int, help="most calls in any hour, >= 1")
    set_cmd.add_argument("--per-day", type=int, help="most calls in any 24 hours, >= 1")
    set_cmd.add_argument("--min-rps", type=float, help="floor of adaptive pacing, > 0")
    limits.set_defaults(func=run_limits)


def run_limits(
    args: argparse.Namespace, settings: Settings | None = None, *, out: TextIO | None = None
) -> int:
    """Run ``limits show`` or ``limits set``; return the process exit code.

    0 on success, 2 for invalid arguments, no configured database or an
    unreachable one (the message on stderr says which).
    """
    from playline.pacing.fleet_store import FleetPacingUnavailable

    settings = settings or Settings.from_env()
    stdout = out or sys.stdout
    dsn = args.dsn or settings.fleet_dsn
    prefix = args.table_prefix or settings.fleet_table_prefix
    action = getattr(args, "limits_action", None)
    if not dsn:
        print(
            "playline limits: no fleet database; set PLAYLINE_STORE_URL to the workers' "
            "postgresql:// store (or pass --dsn)",
            file=sys.stderr,
        )
        return 2
    try:
        if action == "set":
            _validate_set(args)
            return asyncio.run(_set(dsn, prefix, args, stdout))
        if action == "show":
            return asyncio.run(_show(dsn, prefix, stdout))
    except (ValueError, FleetPacingUnavailable) as err:
        print(f"playline limits: {err}", file=sys.stderr)
        return 2
    print("playline limits: choose 'show' or 'set'", file=sys.stderr)
    return 2


_LABELS = {
    "rps": "{:g} rps",
    "burst": "burst {:g}",
    "max_concurrency": "max concurrency {:g}",
    "per_minute": "{:g}/minute",
    "per_hour": "{:g}/hour",
    "per_day": "{:g}/day",
    "min_rps": "min {:g} rps",
}
_SET_FLAGS = ("rps", "max_concurrency", "burst", "per_minute", "per_hour", "per_day", "min_rps")


def _limits_given(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in _SET_FLAGS if getattr(args, name) is not None}


def _validate_set(args: argparse.Namespace) -> None:
    if not args.key:
        raise ValueError("KEY must not be empty")
    given = _limits_given(args)
    if not given:
        flags = ", ".join("--" + name.replace("_", "-") for name in _SET_FLAGS)
        raise ValueError(f"give at least one limit to set: {flags}")
    for name in ("rps", "min_rps"):
        value = given.get(name)
        if value is not None and not (value > 0 and value != float("inf")):
            raise ValueError(f"--{name.replace('_', '-')} must be a number > 0, got {value}")
    for name in ("max_concurrency", "burst", "per_minute", "per_hour", "per_day"):
        value = given.get(name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


async def _set(dsn: str, prefix: str, args: argparse.Namespace, out: TextIO) -> int:
    from playline.pacing.fleet_store import FleetPacer

    async with await FleetPacer.create(dsn, table_prefix=prefix) as fleet:
        limits = await fleet.set_limits(args.key, **_limits_given(args))
    shown = ", ".join(_LABELS[name].format(value) for name, value in limits.given().items())
    print(f"{limits.key}: {shown} (running workers apply it within 1 s)", file=out)
    return 0


async def _show(dsn: str, prefix: str, out: TextIO) -> int:
    from playline.pacing.fleet_store import FleetPacer

    async with await FleetPacer.create(dsn, table_prefix=prefix) as fleet:
        state = await fleet.read_state()
    if not state:
        print("no pacing keys yet (none set, none used by a fleet worker)", file=out)
        return 0
    header = (
        "KEY", "RPS", "ADAPTED_RPS", "MAX_CONCURRENCY", "BURST",
        "PER_MINUTE", "PER_HOUR", "PER_DAY", "MIN_RPS", "PAUSED_S",
    )  # fmt: skip
    rows = [header]
    for key, entry in sorted(state.items()):
        lim, rate = entry.limits, entry.rate

        def cell(value: float | int | None) -> str:
            return "-" if value is None else f"{value:g}"

        burst = lim.burst if lim and lim.burst is not None else rate.burst if rate else None
        rows.append(
            (
                key,
                cell(lim.rps if lim else None),
                cell(rate.rps if rate else None),
                cell(lim.max_concurrency if lim else None),
                cell(burst),
                cell(lim.per_minute if lim else None),
                cell(lim.per_hour if lim else None),
                cell(lim.per_day if lim else None),
                cell(lim.min_rps if lim else None),
                f"{rate.paused_for_s:.1f}" if rate and rate.paused_for_s > 0 else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )
    return 0
