"""``playline limits show|set|share``: read and change fleet-wide provider limits at run time.

The limits live in PostgreSQL (see :mod:`playline.pacing.fleet_store`), in the
tables the workers read: the database is the workers' ``$PLAYLINE_STORE_URL`` (or the
deprecated ``$PLAYLINE_PG_DSN``) and the table prefix
``$PLAYLINE_FLEET_PREFIX``, exactly as the workers take them from ``Settings``;
every running worker with fleet pacing reads them at least once a second, so
``playline limits set acme --rps 5 --max-concurrency 4`` slows the whole fleet
within a second, without a restart or redeploy. Each limit is set on its own
(``--per-day 1000`` alone changes only the daily quota); a limit never set
fleet-wide keeps the workers' catalog value. ``playline limits share team-a --weight 2``
weighs a fairness key against the others sharing a provider, fleet-wide, while runs
go; ``show`` lists each key's rate in force and how it was learnt (``limits set``, a
``429 measurement`` remembered with when and how long ago, or the catalog), and who
shares each provider now and what each is owed.

The main CLI wires these in with::

    add_limits_parser(subparsers)      # adds the "limits" command
    ...
    return run_limits(args, settings)  # when args.command == "limits"
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import ValidationError

from playline.config import Settings
from playline.pacing.policy import Limits

if TYPE_CHECKING:
    from playline.pacing.fleet_store import FleetKeyState, FleetShare, LearnedLimit


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
    share = actions.add_parser(
        "share",
        help="weigh a fairness key (a run's --fairness-key, or a play run's workflow id) "
        "against the others sharing a provider, fleet-wide, within 1 s",
    )
    share.add_argument("key", help="fairness key, e.g. 'team-a'")
    weight = share.add_mutually_exclusive_group(required=True)
    weight.add_argument("--weight", type=float, help="its weight, > 0 and <= 1000")
    weight.add_argument(
        "--clear", action="store_true", help="forget the weight set here: its runs' own apply"
    )
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
            return asyncio.run(_set(dsn, prefix, args.key, _validate_set(args), stdout))
        if action == "show":
            return asyncio.run(_show(dsn, prefix, stdout))
        if action == "share":
            return asyncio.run(_share(dsn, prefix, args, stdout))
    except (ValueError, FleetPacingUnavailable) as err:
        print(f"playline limits: {err}", file=sys.stderr)
        return 2
    print("playline limits: choose 'show', 'set' or 'share'", file=sys.stderr)
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


def _limits_given(args: argparse.Namespace) -> Limits:
    """The limits the flags give, checked as every limit change is (one line on error)."""
    given = {name: getattr(args, name) for name in _SET_FLAGS if getattr(args, name) is not None}
    try:
        return Limits(**given)
    except ValidationError as err:
        problem = err.errors()[0]
        name = str(problem["loc"][0])
        rule = "a number > 0" if name in ("rps", "min_rps") else ">= 1"
        flag = "--" + name.replace("_", "-")
        raise ValueError(f"{flag} must be {rule}, got {problem['input']}") from None


def _validate_set(args: argparse.Namespace) -> Limits:
    if not args.key:
        raise ValueError("KEY must not be empty")
    limits = _limits_given(args)
    if not limits.given():
        flags = ", ".join("--" + name.replace("_", "-") for name in _SET_FLAGS)
        raise ValueError(f"give at least one limit to set: {flags}")
    return limits


async def _set(dsn: str, prefix: str, key: str, limits: Limits, out: TextIO) -> int:
    from playline.pacing.fleet_store import FleetPacer

    async with await FleetPacer.create(dsn, table_prefix=prefix) as fleet:
        stored = await fleet.set_limits(key, limits)
    shown = ", ".join(_LABELS[name].format(value) for name, value in stored.given().items())
    print(f"{key}: {shown} (running workers apply it within 1 s)", file=out)
    return 0


async def _share(dsn: str, prefix: str, args: argparse.Namespace, out: TextIO) -> int:
    from playline.pacing.fleet_store import FleetPacer

    if not args.key.strip():
        raise ValueError("KEY must not be empty")
    weight = None if args.clear else args.weight
    if weight is not None and not (0 < weight <= 1000):
        raise ValueError(f"--weight must be a number > 0 and <= 1000, got {weight}")
    async with await FleetPacer.create(dsn, table_prefix=prefix) as fleet:
        await fleet.set_share_weight(args.key, weight)
    said = "its runs' own weight again" if weight is None else f"weight {weight:g}"
    print(f"{args.key}: {said} (running workers apply it within 1 s)", file=out)
    return 0


async def _show(dsn: str, prefix: str, out: TextIO) -> int:
    from playline.pacing.fleet_store import FleetPacer
    from playline.pacing.fleet_sync import SHARE_MAX_AGE_S

    async with await FleetPacer.create(dsn, table_prefix=prefix) as fleet:
        state = await fleet.read_state()
        shares = await fleet.read_shares(SHARE_MAX_AGE_S)
        weights = await fleet.read_share_weights()
        learned = await fleet.read_learned()
    if not state and not learned:
        print("no pacing keys yet (none set, none used by a fleet worker)", file=out)
        return 0
    _show_limits(state, learned, out)
    _show_learned(learned, out)
    _show_shares(shares, weights, out)
    return 0


def _age(seconds: float) -> str:
    """``42 s``, ``3 min``, ``5 h``, ``2 d``: how long ago, roughly."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _show_learned(learned: dict[str, LearnedLimit], out: TextIO) -> None:
    """The limits learnt below the catalog's, how and when: where the fleet's next run
    starts (an entry older than a week is ignored by the workers)."""
    from datetime import UTC, datetime

    from playline.pacing.governor import LEARNED_MAX_AGE_S

    if not learned:
        return
    rows = [("KEY", "LEARNED_RPS", "CATALOG_RPS", "HOW", "WHEN", "AGE")]
    for key, entry in sorted(learned.items()):
        when = datetime.fromtimestamp(entry.learned_at, UTC).isoformat(timespec="seconds")
        stale = " (too old: ignored)" if entry.age_s > LEARNED_MAX_AGE_S else ""
        rows.append(
            (
                key,
                f"{entry.rps:.4g}",
                "-" if entry.ceiling_rps is None else f"{entry.ceiling_rps:g}",
                entry.source,
                when,
                _age(entry.age_s) + stale,
            )
        )
    print("\nlearnt limits (the fleet's next run starts at them):", file=out)
    _print_table(rows, out)


def _show_shares(shares: list[FleetShare], weights: dict[str, float], out: TextIO) -> None:
    """Who waits for each key now, fleet-wide: each fairness key's class, weight, calls
    waiting and workers, and the part of the key it is owed (its weight's part of the
    highest class waiting; a lower class is owed nothing until that one is served)."""
    from playline.pacing.fleet_sync import fleet_owed

    if weights:
        shown = ", ".join(f"{k} {w:g}" for k, w in sorted(weights.items()))
        print(f"\nweights set with `limits share`: {shown}", file=out)
    merged: dict[tuple[str, str], list[FleetShare]] = {}
    for share in shares:
        if share.waiting > 0:
            merged.setdefault((share.key, share.fairness_key), []).append(share)
    if not merged:
        return
    owed = fleet_owed(shares, weights)
    rows = [("KEY", "FAIRNESS_KEY", "CLASS", "WEIGHT", "WAITING", "WORKERS", "OWED")]
    for (key, fkey), found in sorted(merged.items()):
        rows.append(
            (
                key,
                fkey,
                str(min(s.priority for s in found)),
                f"{weights.get(fkey, max(s.weight for s in found)):g}",
                str(sum(s.waiting for s in found)),
                str(len({s.worker for s in found})),
                f"{owed[key][fkey]:.0%}",
            )
        )
    print("\nsharing now:", file=out)
    _print_table(rows, out)


def _print_table(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )


def _show_limits(
    state: dict[str, FleetKeyState], learned: dict[str, LearnedLimit], out: TextIO
) -> None:
    """Each key's limits: ``RPS`` set with ``limits set``, ``ADAPTED_RPS`` the fleet's
    rate in force, ``HOW`` how that rate was learnt (``limits set``, a ``429
    measurement`` remembered in the learned table, else the ``catalog``)."""
    header = (
        "KEY", "RPS", "ADAPTED_RPS", "HOW", "MAX_CONCURRENCY", "BURST",
        "PER_MINUTE", "PER_HOUR", "PER_DAY", "MIN_RPS", "PAUSED_S",
    )  # fmt: skip
    rows = [header]
    for key, entry in sorted(state.items()):
        lim, rate = entry.limits, entry.rate
        how = "catalog"
        if lim is not None and lim.rps is not None:
            how = "limits set"
        elif key in learned:
            how = learned[key].source

        def cell(value: float | int | None) -> str:
            return "-" if value is None else f"{value:g}"

        burst = lim.burst if lim and lim.burst is not None else rate.burst if rate else None
        rows.append(
            (
                key,
                cell(lim.rps if lim else None),
                cell(rate.rps if rate else None),
                how.replace(" ", "-"),  # one word a column
                cell(lim.max_concurrency if lim else None),
                cell(burst),
                cell(lim.per_minute if lim else None),
                cell(lim.per_hour if lim else None),
                cell(lim.per_day if lim else None),
                cell(lim.min_rps if lim else None),
                f"{rate.paused_for_s:.1f}" if rate and rate.paused_for_s > 0 else "-",
            )
        )
    _print_table(rows, out)
