"""``playline schedule create|list|describe|pause|unpause|trigger|delete``: plays re-run
on a Temporal Schedule (weekly, monthly, by cron).

``create`` checks everything it can before it touches anything (the spec, the
durations, the input, the budget flags), then uploads a local ``--csv`` into the
workers' store once: every firing reads the same ``store:<id>`` rows, whatever
machine its worker runs on. A ``--csv store:<id>`` is passed as it is. The rest is
:mod:`playline.schedules`; every failure is one line (exit 1).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from playline.cli.render import console, out, print_json, ui_url
from playline.cli.starting import (
    add_budget_flags,
    add_priority_flags,
    budget_options,
    play_input,
    run_options,
    upload_input_csv,
)
from playline.config import Settings
from playline.errors import PlaylineError
from playline.schedules import (
    DEFAULT_CATCHUP_WINDOW,
    OVERLAP_POLICIES,
    ScheduleView,
    check_name,
    create_schedule,
    delete_schedule,
    describe_schedule,
    duration_seconds,
    duration_text,
    list_schedules,
    overlap_policy,
    pause_schedule,
    trigger_schedule,
    unpause_schedule,
)
from playline.worker import connect

__all__ = ["add_schedule_parser", "cmd_schedule"]

#: ``--csv`` values naming a dataset already in the workers' store.
STORE_PREFIX = "store:"


def add_schedule_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Any
) -> None:
    schedule = sub.add_parser(
        "schedule",
        help="re-run a play on a schedule (Temporal Schedules): create, list, describe...",
        description="Plays fired by a Temporal Schedule. Each firing estimates first (what is "
        "due, its worst case) and then runs; fresh cells and receipts make it pay only "
        "for what went stale.",
    )
    actions = schedule.add_subparsers(dest="schedule_command", required=True)

    create = actions.add_parser("create", help="schedule a play")
    common(create)
    create.add_argument("name", help="schedule name, also its runs' workflow id prefix")
    create.add_argument("--play", required=True, help="play name (its workflow type)")
    create.add_argument(
        "--csv",
        help="a local CSV (uploaded into the workers' store now, once) or store:DATASET",
    )
    create.add_argument("--input", help="play input as a JSON object")
    create.add_argument("--every", metavar="D", help="fire every D: 7d, 12h, 30m, 90s")
    create.add_argument("--cron", metavar="EXPR", help="fire by cron, e.g. '0 6 * * 1' (UTC)")
    add_budget_flags(create, "each firing spends at most N credits", per="firing")
    create.add_argument(
        "--overlap",
        choices=list(OVERLAP_POLICIES),
        default="skip",
        help="a firing due while the last one runs: skip it (default), buffer it, ...",
    )
    create.add_argument(
        "--no-pause-on-failure",
        dest="pause_on_failure",
        action="store_false",
        help="keep firing after a firing failed (default: pause the schedule)",
    )
    create.add_argument(
        "--catchup-window",
        metavar="D",
        default=f"{int(DEFAULT_CATCHUP_WINDOW.total_seconds())}s",
        help="a firing missed while Temporal was away still runs if this late at most "
        f"(default {duration_text(DEFAULT_CATCHUP_WINDOW.total_seconds())})",
    )
    add_priority_flags(create)
    create.add_argument("--paused", action="store_true", help="create it paused")
    create.add_argument("--note", help="a note shown with the schedule")
    create.add_argument("--json", action="store_true", help="print the schedule as JSON")

    listing = actions.add_parser("list", help="playline's schedules in the namespace")
    common(listing)
    listing.add_argument("--json", action="store_true", help="print one JSON document")

    describe = actions.add_parser("describe", help="one schedule: spec, state, firings")
    common(describe)
    describe.add_argument("name")
    describe.add_argument("--json", action="store_true", help="print one JSON document")

    pause = actions.add_parser("pause", help="stop firing (running firings go on)")
    common(pause)
    pause.add_argument("name")
    pause.add_argument("--note", help="why (shown with the schedule)")

    unpause = actions.add_parser("unpause", help="fire again at the next time")
    common(unpause)
    unpause.add_argument("name")
    unpause.add_argument("--note", help="a note shown with the schedule")

    trigger = actions.add_parser("trigger", help="fire now")
    common(trigger)
    trigger.add_argument("name")
    trigger.add_argument(
        "--overlap",
        choices=list(OVERLAP_POLICIES),
        help="this once, instead of the schedule's overlap policy",
    )

    delete = actions.add_parser("delete", help="delete the schedule (its runs stay)")
    common(delete)
    delete.add_argument("name")


async def cmd_schedule(args: argparse.Namespace, settings: Settings) -> int:
    """Run one ``schedule`` command; errors are ``PlaylineError`` s (one line, exit 1)."""
    command = args.schedule_command
    if command == "create":
        return await _create(args, settings)
    client = await connect(settings=settings)
    if command == "list":
        views = await list_schedules(client)
        if args.json:
            print_json([v.model_dump(mode="json") for v in views])
        else:
            _print_list(views)
        return 0
    if command == "describe":
        view = await describe_schedule(client, args.name)
        if args.json:
            print_json(view)
        else:
            _print_view(view, settings)
        return 0
    if command == "pause":
        await pause_schedule(client, args.name, args.note)
        out().print(f"paused schedule {args.name}: no firing starts until it is unpaused")
    elif command == "unpause":
        await unpause_schedule(client, args.name, args.note)
        out().print(f"unpaused schedule {args.name}: it fires at its next time")
    elif command == "trigger":
        await trigger_schedule(client, args.name, args.overlap)
        out().print(f"triggered schedule {args.name}: a firing starts now")
    elif command == "delete":
        await delete_schedule(client, args.name)
        out().print(f"deleted schedule {args.name} (the runs it started stay)")
    return 0


async def _create(args: argparse.Namespace, settings: Settings) -> int:
    # Everything checkable is checked before the upload and the connection.
    check_name(args.name)
    given = [flag for flag, value in (("--every", args.every), ("--cron", args.cron)) if value]
    if len(given) != 1:
        raise PlaylineError(
            "give exactly one of --every (e.g. 7d) and --cron (e.g. '0 6 * * 1')"
            + (f", not {' and '.join(given)}" if given else "")
        )
    if args.every:
        duration_seconds("--every", args.every)
    duration_seconds("--catchup-window", args.catchup_window)
    overlap_policy(args.overlap)
    budget_options(args)
    options = run_options(args)
    csv = args.csv
    if csv and csv.startswith(STORE_PREFIX):
        args.csv = None  # already in the store: nothing to check on this machine
    input = play_input(args)
    args.csv = csv
    client = await connect(settings=settings)
    if csv:
        input["csv_path"] = (
            csv if csv.startswith(STORE_PREFIX) else await upload_input_csv(csv, settings)
        )
    await create_schedule(
        client,
        args.name,
        args.play,
        input,
        every=args.every,
        cron=args.cron,
        options=options,
        overlap=args.overlap,
        pause_on_failure=args.pause_on_failure,
        catchup_window=args.catchup_window,
        paused=args.paused,
        task_queue=args.task_queue,
        note=args.note,
    )
    view = await describe_schedule(client, args.name)
    if args.json:
        print_json(view)
        return 0
    state = "paused" if view.paused else "active"
    out().print(
        f"created schedule {view.name}: play {view.play}, {view.spec} ({state}, "
        f"overlap {view.overlap})",
        markup=False,
        highlight=False,
    )
    if view.next_action_times and not view.paused:
        out().print(f"  next firing: {_when(view.next_action_times[0])}")
    console.print(f"  each firing's workflow id starts with {view.name}-")
    return 0


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _print_view(view: ScheduleView, settings: Settings) -> None:
    print_ = out().print
    window = (
        f", catch-up {duration_text(view.catchup_window_s)}"
        if view.catchup_window_s is not None
        else ""
    )
    lines = [
        f"schedule {view.name}: play {view.play}, {view.spec}",
        f"  policy: overlap {view.overlap}, "
        f"{'pause' if view.pause_on_failure else 'keep firing'} on failure{window}",
        f"  state: {'paused' if view.paused else 'active'}"
        + (f" (note: {view.note})" if view.note else ""),
    ]
    if view.input is not None:
        lines.append(f"  input: {json.dumps(view.input, ensure_ascii=False)}")
    lines.append(
        f"  firings: {view.num_actions}, skipped by overlap: "
        f"{view.num_actions_skipped_overlap}, missed (catch-up window): "
        f"{view.num_actions_missed_catchup_window}"
    )
    if view.running:
        lines.append(f"  running: {', '.join(view.running)}")
    for waiting, said in view.budget_waits.items():
        lines.append(f"  {waiting}: {said}")
    if view.next_action_times and not view.paused:
        lines.append("  next: " + ", ".join(_when(t) for t in view.next_action_times[:3]))
    if view.recent_actions:
        lines.append("  recent firings:")
        for firing in reversed(view.recent_actions[-5:]):
            lines.append(
                f"    {_when(firing.started_at)}  {firing.workflow_id}  "
                f"{ui_url(settings, firing.workflow_id, firing.run_id)}"
            )
    for line in lines:
        print_(line, markup=False, highlight=False)


def _print_list(views: list[ScheduleView]) -> None:
    if not views:
        out().print(
            "no playline schedules; create one with "
            "`playline schedule create NAME --play P --every 7d`",
            markup=False,
        )
        return
    header = ("NAME", "PLAY", "SPEC", "STATE", "NEXT", "FIRINGS", "SKIPPED")
    rows = [header] + [
        (
            v.name,
            v.play,
            v.spec,
            "paused" if v.paused else "active",
            _when(v.next_action_times[0]) if v.next_action_times and not v.paused else "-",
            str(v.num_actions),
            str(v.num_actions_skipped_overlap),
        )
        for v in views
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        out().print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            markup=False,
            highlight=False,
        )
