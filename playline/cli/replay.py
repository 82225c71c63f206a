"""``playline replay``: does the current play code still fit recorded histories?

```sh
temporal workflow show --workflow-id enrich_leads-1 --output json > histories/leads.json
playline replay --dir histories --plays mypkg.plays
playline replay --query 'WorkflowType="enrich_leads"' --plays mypkg.plays
```

Each workflow gets one line (``OK``, ``NONDETERMINISTIC``, ``UNREGISTERED`` or
``FAILED``, with what to do); the exit status is 1 when any failed, so the command
can gate a deploy. Replaying needs no provider, store or worker; ``--query`` needs
only the Temporal frontend, to fetch the histories.
"""

from __future__ import annotations

import argparse
from collections import Counter

from rich.text import Text

from playline.cli.render import console, out
from playline.config import Settings
from playline.errors import PlaylineError
from playline.replay import (
    ReplayOutcome,
    histories_from_files,
    history_files,
    replay_histories,
)
from playline.worker import connect, import_plays


def add_replay_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay",
        help="replay recorded histories against the current play code",
        description="Replay workflow histories against the current play code and report "
        "non-determinism per workflow (exit status 1 if any workflow fails).",
    )
    source = replay.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--file",
        nargs="+",
        metavar="H.json",
        help="history files (`temporal workflow show --output json`, or the UI's download)",
    )
    source.add_argument("--dir", help="a directory of *.json history files")
    source.add_argument(
        "--query",
        help="fetch histories from Temporal with a visibility query, "
        "e.g. 'WorkflowType=\"enrich_leads\"'",
    )
    replay.add_argument(
        "--plays", nargs="*", default=[], help="modules declaring plays (imported first)"
    )
    replay.add_argument(
        "--address", help="Temporal frontend for --query (default $TEMPORAL_ADDRESS)"
    )
    replay.add_argument(
        "--namespace", help="namespace for --query (default $TEMPORAL_NAMESPACE or default)"
    )
    replay.add_argument(
        "--limit", type=int, default=100, help="most workflows --query replays (default 100)"
    )


async def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    import_plays(args.plays)
    if args.query is not None:
        client = await connect(settings=settings)
        histories = client.list_workflows(args.query, limit=args.limit).map_histories()
        outcomes = await replay_histories(histories, settings=settings)
        if not outcomes:
            raise PlaylineError(f"no workflow matches the query {args.query!r}")
    else:
        files = args.file if args.file is not None else history_files(args.dir)
        outcomes = await replay_histories(histories_from_files(files), settings=settings)
    return report(outcomes)


def report(outcomes: list[ReplayOutcome]) -> int:
    """One line per workflow on stdout, a tally on stderr; 1 if any failed."""
    printer = out()
    for outcome in outcomes:
        head, _, rest = outcome.describe().partition("\n")
        line = Text(head, style="green" if outcome.ok else "red")
        if rest:
            line.append("\n" + rest)
        printer.print(line, highlight=False)
    tally = Counter(o.verdict for o in outcomes)
    parts = ", ".join(f"{n} {verdict.replace('_', ' ')}" for verdict, n in sorted(tally.items()))
    console.print(f"replayed {len(outcomes)} workflow(s): {parts}")
    return 0 if all(o.ok for o in outcomes) else 1
