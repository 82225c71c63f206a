"""``playline limits show|set``: read and change fleet-wide provider limits at run time.

The limits live in PostgreSQL (see :mod:`playline.activities.fleet_pacing`);
every running worker with fleet pacing reads them at least once a second, so
``playline limits set acme --rps 5 --max-concurrency 4`` slows the whole fleet
within a second, without a restart or redeploy.

The main CLI wires these in with::

    add_limits_parser(subparsers)      # adds the "limits" command
    ...
    return run_limits(args)            # when args.command == "limits"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, TextIO

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DSN_ENV = "PLAYLINE_PG_DSN"


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
        help=f"PostgreSQL DSN (default: ${DSN_ENV}, else {DEFAULT_DSN})",
    )
    limits.add_argument(
        "--table-prefix",
        default="playline_",
        help="prefix of the pacing tables (default: playline_)",
    )
    actions = limits.add_subparsers(dest="limits_action", metavar="{show,set}")
    actions.required = True
    actions.add_parser("show", help="print each key's configured and adapted limits")
    set_cmd = actions.add_parser("set", help="set a key's limits (takes effect within 1 s)")
    set_cmd.add_argument("key", help="pacing key, e.g. a provider name or 'acme:key=ab12cd'")
    set_cmd.add_argument("--rps", type=float, required=True, help="requests per second, > 0")
    set_cmd.add_argument(
        "--max-concurrency", type=int, required=True, help="most calls in flight, >= 1"
    )
    set_cmd.add_argument(
        "--burst", type=int, default=None, help="calls allowed back to back (default: keep)"
    )
    limits.set_defaults(func=run_limits)


def run_limits(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Run ``limits show`` or ``limits set``; return the process exit code.

    0 on success, 2 for invalid arguments or an unreachable database (the
    message on stderr says which).
    """
    from playline.activities.fleet_pacing import FleetPacingUnavailable

    stdout = out or sys.stdout
    dsn = args.dsn or os.environ.get(DSN_ENV) or DEFAULT_DSN
    action = getattr(args, "limits_action", None)
    try:
        if action == "set":
            _validate_set(args)
            return asyncio.run(_set(dsn, args, stdout))
        if action == "show":
            return asyncio.run(_show(dsn, args, stdout))
    except (ValueError, FleetPacingUnavailable) as err:
        print(f"playline limits: {err}", file=sys.stderr)
        return 2
    print("playline limits: choose 'show' or 'set'", file=sys.stderr)
    return 2


def _validate_set(args: argparse.Namespace) -> None:
    if not args.key:
        raise ValueError("KEY must not be empty")
    if not (args.rps > 0 and args.rps != float("inf")):
        raise ValueError(f"--rps must be a number > 0, got {args.rps}")
    if args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if args.burst is not None and args.burst < 1:
        raise ValueError(f"--burst must be >= 1, got {args.burst}")


async def _set(dsn: str, args: argparse.Namespace, out: TextIO) -> int:
    from playline.activities.fleet_pacing import FleetPacer

    async with await FleetPacer.create(dsn, table_prefix=args.table_prefix) as fleet:
        limits = await fleet.set_limits(
            args.key, rps=args.rps, max_concurrency=args.max_concurrency, burst=args.burst
        )
    print(
        f"{limits.key}: {limits.rps:g} rps, burst {limits.burst}, "
        f"max concurrency {limits.max_concurrency} (running workers apply it within 1 s)",
        file=out,
    )
    return 0


async def _show(dsn: str, args: argparse.Namespace, out: TextIO) -> int:
    from playline.activities.fleet_pacing import FleetPacer

    async with await FleetPacer.create(dsn, table_prefix=args.table_prefix) as fleet:
        state = await fleet.read_state()
    if not state:
        print("no pacing keys yet (none set, none used by a fleet worker)", file=out)
        return 0
    header = ("KEY", "RPS", "ADAPTED_RPS", "MAX_CONCURRENCY", "BURST", "PAUSED_S")
    rows = [header]
    for key, entry in sorted(state.items()):
        lim, rate = entry.limits, entry.rate
        rows.append(
            (
                key,
                f"{lim.rps:g}" if lim else "-",
                f"{rate.rps:g}" if rate else "-",
                str(lim.max_concurrency) if lim else "-",
                str(lim.burst if lim else rate.burst if rate else "-"),
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
