"""``playline plays list``: the plays the running workers registered, those a worker
would register here, and those seen on Temporal.

Three sources, each named in the output:

* **registered by the workers on the task queue**: what each worker polling it now
  published as it started (:mod:`playline.published_plays`); the plays a run on that
  queue can use;
* **registered here**: importing ``--plays`` modules (and the demo's) declares plays,
  exactly as ``playline worker --plays ...`` does before it registers them;
* **seen on the namespace**: the play types of the most recent runs, from Temporal's
  visibility (``PlaylinePlay``, so it needs playline's search attributes; see
  ``playline setup``). A type seen there but not registered here has runs that a
  worker without its module cannot continue.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from playline import search_attributes as sa
from playline.cli.render import console, out, print_json
from playline.cli.setup import registered_search_attributes
from playline.config import Settings
from playline.published_plays import QueuePlays, read_published_plays
from playline.worker import connect, import_plays
from playline.workflows.play import registered_plays

#: How many recent runs ``plays list`` looks at on the namespace.
RECENT_RUNS = 1000


def add_plays_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Any) -> None:
    plays = sub.add_parser("plays", help="list plays")
    plays_sub = plays.add_subparsers(dest="plays_command", required=True)
    listing = plays_sub.add_parser(
        "list",
        help="plays the workers on the task queue registered, those a worker would "
        "register here, and play types seen on the namespace",
    )
    common(listing)
    listing.add_argument("--plays", nargs="*", default=[], help="modules declaring plays")
    listing.add_argument(
        "--local", action="store_true", help="only the plays registered here (no Temporal)"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")


async def cmd_plays(args: argparse.Namespace, settings: Settings) -> int:
    import_plays(args.plays)
    registered = {
        name: {
            "play": name,
            "module": cls.__module__,
            "input": cls.input_model.__name__,
            "input_fields": list(cls.input_model.model_fields),
            "required_columns": list(cls.required_columns),
        }
        for name, cls in sorted(registered_plays().items())
    }
    seen: dict[str, dict[str, Any]] = {}
    note = None
    workers: QueuePlays | None = None
    if not args.local:
        client = await connect(settings=settings)
        workers = await read_published_plays(client, args.task_queue)
        seen, note = await _seen_on_namespace(client)
    if args.json:
        print_json(
            {
                "task_queue": args.task_queue,
                "workers": None
                if workers is None
                else {
                    "live": workers.live,
                    "plays": [
                        {
                            "play": play,
                            "workers": identities,
                            # None: the workers did not say (an older playline)
                            "required_columns": workers.columns.get(play),
                        }
                        for play, identities in sorted(workers.plays.items())
                    ],
                },
                "registered_here": list(registered.values()),
                "seen_on_namespace": list(seen.values()),
                "note": note,
            }
        )
        return 0
    if not args.local:
        print_workers(args.task_queue, workers)
    out().print("[bold]registered here[/] (imported: the demo and --plays modules)")
    for info in registered.values():
        fields = ", ".join(info["input_fields"])
        out().print(
            f"  {info['play']:<24} {info['module']}  input {info['input']}({fields})"
            + columns_text(info["required_columns"]),
            markup=False,
            highlight=False,
        )
    if args.local:
        return 0
    out().print(
        f"[bold]seen on namespace {settings.temporal_namespace}[/] "
        f"(the last {RECENT_RUNS} play runs at most)"
    )
    if note:
        console.print(f"[yellow]{note}[/]")
    for info in seen.values():
        here = "" if info["play"] in registered else "  (not registered here)"
        out().print(
            f"  {info['play']:<24} {info['runs']} runs, {info['running']} running, "
            f"last started {info['last_started']}{here}"
        )
    return 0


def print_workers(task_queue: str, workers: QueuePlays | None) -> None:
    """The plays the workers polling ``task_queue`` published, or why there are none."""
    if workers is None:
        out().print(
            f"[bold]registered by the workers on task queue {task_queue}[/]: no worker polls "
            "it now, or its workers run a playline that does not publish its plays"
        )
        return
    count = len(workers.live)
    out().print(
        f"[bold]registered by the workers on task queue {task_queue}[/] "
        f"({count} worker{'s' if count != 1 else ''} polling now)"
    )
    for play, identities in sorted(workers.plays.items()):
        shown = "all of them" if len(identities) == count else ", ".join(identities)
        out().print(
            f"  {play:<24} {shown}" + columns_text(workers.columns.get(play)),
            markup=False,
            highlight=False,
        )


def columns_text(columns: Sequence[str] | None) -> str:
    """``  requires columns id, domain`` for a play that declares required columns."""
    return f"  requires columns {', '.join(columns)}" if columns else ""


async def _seen_on_namespace(client: Client) -> tuple[dict[str, dict[str, Any]], str | None]:
    if sa.PLAY.name not in await registered_search_attributes(client):
        return {}, (
            "playline's search attributes are not registered in this namespace, so its "
            "play runs cannot be told apart: register them with `playline setup`"
        )
    runs: Counter[str] = Counter()
    running: Counter[str] = Counter()
    last: dict[str, datetime] = {}
    try:
        async for execution in client.list_workflows("PlaylinePlay IS NOT NULL", limit=RECENT_RUNS):
            play = execution.typed_search_attributes.get(sa.PLAY) or execution.workflow_type
            runs[play] += 1
            if execution.close_time is None:
                running[play] += 1
            if play not in last or execution.start_time > last[play]:
                last[play] = execution.start_time
    except RPCError as err:
        return {}, f"cannot list the namespace's runs: {err.message}"
    return {
        play: {
            "play": play,
            "runs": runs[play],
            "running": running[play],
            "last_started": last[play].strftime("%Y-%m-%d %H:%M:%S UTC"),
        }
        for play in sorted(runs)
    }, None
