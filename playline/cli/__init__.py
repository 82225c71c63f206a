"""The ``playline`` command: dev stack, worker, running and inspecting plays, limits.

Errors are rendered here, once: a ``PlaylineError`` or a failed play prints its
message and exits 1; nothing prints a traceback a user did not ask for.

* :mod:`~playline.cli.stack` - ``demo``, ``dev``, ``worker``;
* :mod:`~playline.cli.run` - ``run``;
* :mod:`~playline.cli.estimate` - ``estimate`` (what a run would cost; nothing is sent);
* :mod:`~playline.cli.runs` - ``runs get|export|list|pause|resume|window|cancel|stop|audit|
  reconcile``;
* :mod:`~playline.cli.plays` - ``plays list``;
* :mod:`~playline.cli.setup` - ``setup`` (playline's search attributes in a namespace);
* :mod:`~playline.cli.limits` - ``limits show|set``;
* :mod:`~playline.cli.budgets` - ``budgets set|list|get`` (named budgets shared by runs);
* :mod:`~playline.cli.providers` - ``providers list|show`` (plan, limits, price, contract,
  last balance);
* :mod:`~playline.cli.catalog` - ``catalog reference`` (every key of a provider catalog);
* :mod:`~playline.cli.schedule` - ``schedule create|list|describe|pause|unpause|trigger|delete``
  (plays re-run on a Temporal Schedule);
* :mod:`~playline.cli.replay` - ``replay`` (recorded histories against the current code);
* :mod:`~playline.cli.codec_server` - ``codec-server`` (the Temporal UI's payload decoder);
* :mod:`~playline.cli.webhook` - ``webhook`` (asynchronous providers' job callbacks);
* :mod:`~playline.cli.ui` - ``ui`` (the sheet view: every run, cell by cell, in a browser);
* :mod:`~playline.cli.sync` - ``sync`` (a run's rows written back to a CRM or a table);
* :mod:`~playline.cli.starting` - what the commands that start a play share (flags, input, CSV
  upload, the unknown-play guard);
* :mod:`~playline.cli.flags` - flags several commands declare alike (Temporal, listening);
* :mod:`~playline.cli.render` - what gets printed;
* :mod:`~playline.cli.devserver` - the embedded Temporal dev server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

from playline import __version__
from playline.cli.render import console
from playline.config import Settings
from playline.errors import PlaylineError, root_cause

Command = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]


def build_parser() -> argparse.ArgumentParser:
    from playline.cli.budgets import add_budgets_parser
    from playline.cli.catalog import add_catalog_parser
    from playline.cli.codec_server import add_codec_server_parser
    from playline.cli.estimate import add_estimate_parser
    from playline.cli.flags import add_temporal_flags
    from playline.cli.limits import add_limits_parser
    from playline.cli.plays import add_plays_parser
    from playline.cli.providers import add_providers_parser
    from playline.cli.replay import add_replay_parser
    from playline.cli.run import PROVENANCE_HELP, RAW_HELP
    from playline.cli.runs import add_runs_parser
    from playline.cli.schedule import add_schedule_parser
    from playline.cli.setup import add_setup_parser
    from playline.cli.starting import add_budget_flags, add_play_flags, add_priority_flags
    from playline.cli.sync import add_sync_parser
    from playline.cli.ui import add_ui_parser
    from playline.cli.webhook import add_webhook_parser

    parser = argparse.ArgumentParser(
        prog="playline", description="Durable data-enrichment plays on Temporal."
    )
    parser.add_argument("--version", action="version", version=f"playline {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        add_temporal_flags(p)
        p.add_argument(
            "--task-queue", help="task queue (default: $PLAYLINE_TASK_QUEUE or playline)"
        )

    def run_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--out", help="write the result rows to this file: CSV, or JSON lines if .jsonl"
        )
        p.add_argument("--raw", action="store_true", help=f"with --out: {RAW_HELP}")
        p.add_argument("--provenance", action="store_true", help=f"with --out: {PROVENANCE_HELP}")
        add_budget_flags(
            p,
            "spend at most N credits (each paid call's worst case is reserved first, "
            "fleet-wide); when reached the run waits for `runs budget ID --add N`",
        )
        p.add_argument(
            "--retry-ambiguous",
            action="store_true",
            help="re-send calls that were sent without a definitive answer (they may have "
            "been charged); off by default so nothing is paid twice by accident",
        )
        p.add_argument(
            "--fixtures", nargs="+", help="fixture mode: answer tools from these JSONL files"
        )
        p.add_argument(
            "--enforce-pacing", action="store_true", help="pace fixture calls as if live"
        )
        p.add_argument(
            "--chunk-size", type=int, help="rows per chunk activity, 1 to 5000 (default 25)"
        )
        add_priority_flags(p)

    def stack_flags(p: argparse.ArgumentParser, provider_port: int) -> None:
        p.add_argument(
            "--provider-port",
            type=int,
            default=provider_port,
            help=f"local provider server port (default {provider_port or 'a free one'})",
        )
        p.add_argument(
            "--ui-port",
            type=int,
            default=8233,
            help="Temporal UI port of the embedded dev server (default 8233)",
        )
        p.add_argument(
            "--sheet-port",
            type=int,
            default=8234,
            help="port of the sheet view (`playline ui`) served beside it on 127.0.0.1 "
            "(default 8234; a free one when taken)",
        )

    demo = sub.add_parser("demo", help="run enrich_leads over the demo leads end to end")
    common(demo)
    run_flags(demo)
    stack_flags(demo, 0)
    demo.add_argument("--csv", help="leads CSV (default: the 240 demo leads shipped with playline)")
    demo.set_defaults(out="enriched.csv")

    dev = sub.add_parser("dev", help="Temporal dev server + UI, local provider server and a worker")
    common(dev)
    stack_flags(dev, 8787)
    dev.add_argument("--plays", nargs="*", default=[], help="modules declaring plays")

    worker = sub.add_parser("worker", help="run a worker")
    common(worker)
    worker.add_argument("--plays", nargs="*", default=[], help="modules declaring plays")
    worker.add_argument("--home", help="state directory (default $PLAYLINE_HOME or .playline)")
    worker.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on $PLAYLINE_METRICS_HOST (127.0.0.1):PORT/metrics "
        "(default: $PLAYLINE_METRICS_PORT; unset serves none)",
    )

    run = sub.add_parser("run", help="start a play and wait for it")
    common(run)
    run_flags(run)
    add_play_flags(run)
    run.add_argument(
        "--max-spend",
        type=float,
        metavar="AMOUNT",
        help="spend at most AMOUNT in the catalog's currency (each provider's credits at its "
        "credit_price; every provider the run may call must have one, in one currency); "
        "when reached the run waits for `runs budget ID --add-spend N`",
    )
    run.add_argument("--id", help="workflow id (default PLAY-timestamp-random)")
    run.add_argument(
        "--watch",
        action="store_true",
        help="show the progress line even when stderr is not a terminal (on a terminal it "
        "is shown by default); waits are announced on stderr either way",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line on a terminal (waits are still announced on stderr)",
    )
    run.add_argument(
        "--confirm-over",
        type=float,
        metavar="N",
        help="estimate first; refuse (exit 2) when the worst case is over N credits",
    )
    run.add_argument(
        "--yes", action="store_true", help="with --confirm-over: run whatever the estimate says"
    )
    run.add_argument(
        "--json", action="store_true", help="print the result (or failure) as one JSON document"
    )
    run.add_argument(
        "--fail-on-row-errors",
        action="store_true",
        help="exit 3 when any row failed (without it: only when rows failed and none succeeded)",
    )
    run.add_argument(
        "--no-play-check",
        action="store_true",
        help="start the play even if its name looks like a typo of a known play (a play "
        "only the workers have, never run on this namespace); they still end a run of "
        "a play none of them has",
    )
    run.add_argument(
        "--reconnect-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="keep waiting this long while Temporal is unreachable (default 60)",
    )

    add_runs_parser(sub, common)
    add_estimate_parser(sub, common)
    add_plays_parser(sub, common)
    add_providers_parser(sub)
    add_setup_parser(sub, common)
    add_schedule_parser(sub, common)
    add_sync_parser(sub, common)

    sub.add_parser("provider-server", help="run the local provider server", add_help=False)
    add_limits_parser(sub)
    add_budgets_parser(sub)
    add_catalog_parser(sub)
    add_replay_parser(sub)
    add_codec_server_parser(sub)
    add_webhook_parser(sub)
    add_ui_parser(sub)
    return parser


def _commands() -> dict[str, Command]:
    from playline.cli.budgets import cmd_budgets
    from playline.cli.catalog import cmd_catalog
    from playline.cli.codec_server import cmd_codec_server
    from playline.cli.estimate import cmd_estimate
    from playline.cli.plays import cmd_plays
    from playline.cli.providers import cmd_providers
    from playline.cli.replay import cmd_replay
    from playline.cli.run import cmd_run
    from playline.cli.runs import cmd_runs
    from playline.cli.schedule import cmd_schedule
    from playline.cli.setup import cmd_setup
    from playline.cli.stack import cmd_demo, cmd_dev, cmd_worker
    from playline.cli.sync import cmd_sync
    from playline.cli.ui import cmd_ui
    from playline.cli.webhook import cmd_webhook

    return {
        "demo": cmd_demo,
        "dev": cmd_dev,
        "worker": cmd_worker,
        "run": cmd_run,
        "runs": cmd_runs,
        "plays": cmd_plays,
        "providers": cmd_providers,
        "setup": cmd_setup,
        "replay": cmd_replay,
        "codec-server": cmd_codec_server,
        "estimate": cmd_estimate,
        "budgets": cmd_budgets,
        "catalog": cmd_catalog,
        "schedule": cmd_schedule,
        "webhook": cmd_webhook,
        "ui": cmd_ui,
        "sync": cmd_sync,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "provider-server":
        from playline.provider_server.__main__ import main as provider_main

        return provider_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = Settings.from_env(
            temporal_address=getattr(args, "address", None),
            temporal_namespace=getattr(args, "namespace", None),
            home=getattr(args, "home", None),
        )
        if hasattr(args, "task_queue"):
            # Given (--task-queue, $PLAYLINE_TASK_QUEUE): used as is. Else a `playline
            # dev` running in this home names its queue (stack_record), else the default.
            args.task_queue_given = args.task_queue is not None or bool(
                settings.environ.get("PLAYLINE_TASK_QUEUE")
            )
            if args.task_queue is None:
                live = None
                if args.command not in ("dev", "demo", "worker"):
                    from playline.cli.stack_record import live_stack_queue

                    live = live_stack_queue(settings.home)
                args.task_queue = live or settings.task_queue
        if hasattr(args, "metrics_port") and args.metrics_port is None:
            args.metrics_port = settings.metrics_port
        if args.command == "limits":
            from playline.cli.limits import run_limits

            return run_limits(args, settings)
        return asyncio.run(_commands()[args.command](args, settings))
    except KeyboardInterrupt:
        return 130
    except PlaylineError as err:
        console.print(f"[red]error:[/] {err}")
        return 1
    except WorkflowFailureError as err:
        cause = root_cause(err)
        console.print(f"[red]play failed:[/] {getattr(cause, 'message', cause)}")
        return 1
    except RPCError as err:
        if args.verbose:
            raise
        console.print(f"[red]Temporal error:[/] {err.message}")
        return 1
    except Exception as err:  # a bug or an unforeseen failure: still one line, unless -v
        if args.verbose:
            raise
        console.print(
            f"[red]error:[/] unexpected {type(err).__name__}: {err} (run with -v for details)"
        )
        return 1


def entrypoint() -> NoReturn:
    """The ``playline`` console script: ``main()``, then exit without interpreter teardown.

    The Temporal SDK's native (Rust) threads can outlive the event loop and crash
    CPython while it finalizes (temporalio/sdk-python#300: "PyGILState_Release ...
    finalizing", seen here as SIGSEGV/SIGBUS/SIGABRT in about 1 exit in 20 after
    client calls). Everything a command owns is closed by the time ``main`` returns,
    so the output is flushed and the process ends with ``os._exit``.
    """
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entrypoint()
