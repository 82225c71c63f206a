"""Starting a play from the command line: what ``run``, ``estimate``, ``schedule`` and
``demo`` share.

The run flags become ``RunOptions`` (:func:`run_options`: fixtures, chunk size, budget,
fairness and priority), ``--input`` becomes the play's input (:func:`play_input`) and
``--csv`` is streamed into the workers' store (:func:`upload_input_csv`).

An unknown play is caught twice. Before anything is uploaded or started,
:func:`check_play_name` asks what the workers polling the task queue published
(:mod:`playline.published_plays`) and refuses a name none of them has, suggesting the
closest. Where no worker answers (none polls yet, or they run an older playline) it
compares the name with the plays this process can see (those it imports, the demo's,
and those that have run on the namespace) and refuses only a name that is almost surely
a typo of one of them; any other name is started, and :func:`refuse_unknown_play`
ends it within seconds if no worker on its task queue knows it, naming the plays
that do exist.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from playline import search_attributes as sa
from playline.cli.render import console, ui_url
from playline.config import Settings
from playline.contract import RunOptions
from playline.datasets import store_source, upload_csv
from playline.errors import PlaylineError, format_validation_errors
from playline.published_plays import QueuePlays, read_published_plays
from playline.stores.backends import open_stores
from playline.worker import import_plays
from playline.workflows.play import registered_plays

#: ``run``'s and ``estimate``'s exit when they refuse before anything was uploaded or
#: started (as argparse's usage errors).
EXIT_REFUSED = 2
#: The SDK's message when a worker is asked to run a workflow type it lacks.
NOT_REGISTERED = "is not registered on this worker"
#: Failed workflow-task attempts of "not registered" before the run is ended: a fleet
#: whose workers disagree gets a few chances to hand the task to one that knows it.
NOT_REGISTERED_ATTEMPTS = 3
#: How long to watch a new run for the above; once a worker has run it, it is known.
WATCH_START_S = 60.0
#: Warn once when nothing polls the task queue this long after the start.
NO_WORKER_WARNING_S = 5.0
#: How alike (``difflib``'s ratio, case ignored) an unknown name and a known play must
#: be for the name to be refused as a typo of it before anything starts: one letter
#: off in a name of ten (``enrich_leds``), not a sibling (``t_waterfall`` and
#: ``t_scalar_waterfall`` are 0.76; ``enrich_leads_v2`` and ``enrich_leads`` 0.89). A
#: name that extends a known one (``enrich_leads2``) is never taken for its typo: it is
#: how a new version of a play is named.
TYPO_CUTOFF = 0.9
#: How alike a known play must be to be suggested (``difflib``'s default).
SUGGEST_CUTOFF = 0.6
#: How many of the namespace's most recent play runs name the plays seen there.
RECENT_PLAY_RUNS = 200
#: At most this many known plays are listed in a message.
KNOWN_LISTED = 20
#: Names safe to put in a visibility query as they are.
_QUERYABLE = re.compile(r"^[A-Za-z0-9_.:@/-]{1,200}$")

#: what a numeric flag parses to (``_number``)
N = TypeVar("N")


def run_options(args: argparse.Namespace) -> RunOptions:
    """The ``RunOptions`` the run flags describe; invalid values are one clear line."""
    fields: dict[str, Any] = {}
    if getattr(args, "fixtures", None):
        fields["integration_mode"] = "fixture"
        fields["fixtures"] = [str(Path(f).resolve()) for f in args.fixtures]
        fields["enforce_fixture_pacing"] = bool(args.enforce_pacing)
    if getattr(args, "chunk_size", None) is not None:
        fields["chunk_size"] = args.chunk_size
    if getattr(args, "retry_ambiguous", False):
        fields["retry_ambiguous"] = True
    fields.update(budget_options(args))
    fields.update(priority_options(args))
    try:
        return RunOptions(**fields)
    except ValidationError as err:
        problems = format_validation_errors(err.errors())
        raise PlaylineError(f"invalid run options: {problems.replace('_', '-')}") from None


#: ``--fairness-key``'s values: ``RunOptions.fairness_key``'s pattern.
_FAIRNESS_KEY = re.compile(r"^[A-Za-z0-9_.:@/-]{1,128}$")
#: The priority classes, first to last (``RunOptions.priority``).
PRIORITIES = range(1, 6)
#: The largest ``--weight`` (Temporal clamps fairness weights to it as well).
MAX_WEIGHT = 1000.0


def add_play_flags(p: argparse.ArgumentParser) -> None:
    """The play to start and its input: ``PLAY``, ``--csv`` and ``--input`` (run, estimate)."""
    p.add_argument("play", help="play name (its workflow type)")
    p.add_argument(
        "--csv",
        help="a local CSV: streamed into the workers' store and passed as the input's csv_path",
    )
    p.add_argument("--input", help="play input as a JSON object")


def add_budget_flags(p: argparse.ArgumentParser, max_credits_help: str, per: str = "") -> None:
    """``--max-credits``, ``--max-credits-for``, ``--budget`` and ``--on-budget`` (run,
    demo, schedule create); ``per`` names what a cap is counted over (``"firing"``)
    when it is not the run."""
    scope = f", per {per}" if per else ""
    who = f"{per}s also" if per else "also"
    p.add_argument("--max-credits", type=float, help=max_credits_help)
    p.add_argument(
        "--max-credits-for",
        action="append",
        metavar="PROVIDER=N",
        help=f"a cap for one provider{scope} (repeatable)",
    )
    p.add_argument(
        "--budget",
        metavar="NAME",
        help=f"{who} draw on a named budget (`playline budgets`)",
    )
    p.add_argument(
        "--on-budget",
        choices=["wait", "stop"],
        help="when a budget is reached: wait for more (default) or skip the rows and finish",
    )


def add_priority_flags(p: argparse.ArgumentParser) -> None:
    """``--fairness-key``, ``--weight`` and ``--priority`` (run, demo, schedule create).

    Read as text and checked by :func:`priority_options`, so a bad value is one line
    naming the flag, not argparse's usage block.
    """
    p.add_argument(
        "--fairness-key",
        metavar="KEY",
        help="who the run's provider calls and Temporal tasks count for when plays share "
        "them (a team, a customer): runs of one key share one fair share "
        "(default: the run itself)",
    )
    p.add_argument(
        "--weight",
        metavar="W",
        help="the key's weight: a weight-2 key gets twice the share of a weight-1 key "
        f"(above 0, at most {MAX_WEIGHT:g}; default 1)",
    )
    p.add_argument(
        "--priority",
        metavar="1..5",
        help="priority class, 1 first to 5 last (default 3): lower classes are served first",
    )


def priority_options(args: argparse.Namespace) -> dict[str, Any]:
    """The fairness flags as ``RunOptions`` fields; a bad value is one ``PlaylineError``."""
    fields: dict[str, Any] = {}
    key = getattr(args, "fairness_key", None)
    if key is not None:
        if not _FAIRNESS_KEY.match(key):
            raise PlaylineError(
                f"--fairness-key {key!r}: use 1 to 128 letters, digits and _ . : @ / -"
            )
        fields["fairness_key"] = key
    weight = getattr(args, "weight", None)
    if weight is not None:
        fields["fairness_weight"] = _number(
            float,
            weight,
            lambda value: 0 < value <= MAX_WEIGHT,  # NaN and infinities fail here too
            f"--weight must be a number above 0 and at most {MAX_WEIGHT:g}, not {weight!r}",
        )
    priority = getattr(args, "priority", None)
    if priority is not None:
        fields["priority"] = _number(
            int,
            str(priority).strip(),
            lambda value: value in PRIORITIES,
            f"--priority must be 1 (first) to 5 (last), not {priority!r}",
        )
    return fields


def _number(parse: Callable[[Any], N], raw: Any, fits: Callable[[N], bool], error: str) -> N:
    """``raw`` parsed by ``parse``; ``error`` (one ``PlaylineError``) when it does not
    parse or does not fit."""
    try:
        value: N | None = parse(raw)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise PlaylineError(error)
    return value


def budget_options(args: argparse.Namespace) -> dict[str, Any]:
    """The budget flags as ``RunOptions`` fields (``--max-credits-for acme=50``)."""
    fields: dict[str, Any] = {}
    if getattr(args, "max_credits", None) is not None:
        fields["max_credits"] = args.max_credits
    caps: dict[str, float] = {}
    for given in getattr(args, "max_credits_for", None) or []:
        provider, sep, amount = given.partition("=")
        try:
            caps[provider.strip()] = float(amount)
        except ValueError:
            sep = ""
        if not sep or not provider.strip():
            raise PlaylineError(f"--max-credits-for wants PROVIDER=N, not {given!r}")
    if caps:
        fields["max_credits_by_provider"] = caps
    if getattr(args, "max_spend", None) is not None:
        fields["max_spend"] = args.max_spend
    if getattr(args, "budget", None):
        fields["budget"] = args.budget
    if getattr(args, "on_budget", None):
        fields["on_budget"] = args.on_budget
    return fields


def play_input(args: argparse.Namespace) -> dict[str, Any]:
    """The play input from ``--input`` (JSON); ``--csv`` is checked here, uploaded later."""
    try:
        data = json.loads(args.input) if args.input else {}
    except json.JSONDecodeError as err:
        raise PlaylineError(f"--input is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise PlaylineError("--input must be a JSON object")
    if args.csv and not Path(args.csv).is_file():
        raise PlaylineError(f"--csv {args.csv}: no such file")
    return data


async def upload_input_csv(path: str, settings: Settings) -> str:
    """Stream a local CSV into the workers' store; the ``store:`` reference a play reads.

    The workers need not see this machine's disk: they read the rows from the store
    (SQLite under ``PLAYLINE_HOME`` on one machine, PostgreSQL for a fleet). Uploading
    is a write the user asked for, so it may create the store (a play can be started
    before any worker has opened it); reading results back never creates one.
    """
    async with await open_stores(settings, create=True) as stores:
        ref = await upload_csv(stores.sheet, path)
    console.print(f"uploaded {ref.count} rows of {path} to the store as {ref.id}")
    return store_source(ref.id)


@dataclass
class PlayCheck:
    """What :func:`check_play_name` found: the plays known to this process, and
    ``refusal`` (a typo: start nothing) or ``warning`` (start it all the same)."""

    play: str
    known: list[str] = field(default_factory=list)
    refusal: str | None = None
    warning: str | None = None
    #: what the workers on the task queue published (``None``: nobody answered)
    published: QueuePlays | None = None


async def check_play_name(client: Client, play: str, task_queue: str) -> PlayCheck:
    """Is ``play`` a play, as far as this process can tell? Nothing is started.

    Known plays are those this process registers (importing the demo's module, as
    every worker does, and any module imported already) and those that have run on
    the namespace (``PlaylinePlay``, set by a play as it runs; skipped when the
    namespace lacks playline's search attributes or cannot be searched). A play
    only a worker has and that never ran here is not among them, so an unknown name
    is refused only when it is a near-copy of a known one (``TYPO_CUTOFF``: one
    letter off, case ignored) that does not merely extend it; any other unknown
    name is started, with a warning when it resembles known plays, and left to
    :func:`refuse_unknown_play`.
    """
    published = await read_published_plays(client, task_queue)
    check = PlayCheck(play, published=published)
    if published is not None:
        return _against_published(check, published)
    import_plays(())
    local = set(registered_plays())
    if play in local:
        return check
    seen, exact = await _seen_on_namespace(client, play)
    if exact:
        return check
    known = sorted(local | seen)
    check.known = known
    if play in known:
        return check
    listed = ", ".join(known[:KNOWN_LISTED]) or "no plays"
    if len(known) > KNOWN_LISTED:
        listed += f" and {len(known) - KNOWN_LISTED} more (playline plays list)"
    typo = typo_of(play, known)
    if typo is not None:
        check.refusal = (
            f"no play named {play!r}; did you mean {typo!r}? (known: {listed}); nothing "
            f"was started. If a worker on task queue {task_queue!r} does have {play!r} (a "
            "play that never ran on this namespace), run again with --no-play-check"
        )
        return check
    similar = _close(play, known, SUGGEST_CUTOFF, 3)
    if similar:
        check.warning = (
            f"no play named {play!r} is registered here or has run on this namespace "
            f"(did you mean {' or '.join(repr(n) for n in similar)}?); starting it for the "
            f"workers on task queue {task_queue!r}, which end it if none of them has it"
        )
    return check


def _against_published(check: PlayCheck, published: QueuePlays) -> PlayCheck:
    """The workers polling the queue said what they have: a name none of them has is
    refused, whatever it resembles (nothing would run it)."""
    play, known = check.play, sorted(published.plays)
    check.known = known
    if play in published.plays:
        return check
    listed = ", ".join(known[:KNOWN_LISTED]) or "no plays"
    if len(known) > KNOWN_LISTED:
        listed += f" and {len(known) - KNOWN_LISTED} more (playline plays list)"
    similar = _close(play, known, SUGGEST_CUTOFF, 1)
    guess = f"; did you mean {similar[0]!r}?" if similar else ""
    n = len(published.live)
    workers = "the worker" if n == 1 else f"the {n} workers"
    check.refusal = (
        f"no play named {play!r}{guess} ({workers} on task queue {published.task_queue!r} "
        f"{'has' if n == 1 else 'have'}: {listed}); nothing was started. Start a worker "
        "that imports the play's module (playline worker --plays MODULE), name its queue "
        "with --task-queue, or start it anyway with --no-play-check"
    )
    return check


def typo_of(play: str, known: list[str]) -> str | None:
    """The known play ``play`` is almost surely a typo of (``TYPO_CUTOFF``), if any; a
    name that extends a known one is a new play, not a typo."""
    lower = play.lower()
    candidates = [n for n in known if len(n) == len(play) or not lower.startswith(n.lower())]
    found = _close(play, candidates, TYPO_CUTOFF, 1)
    return found[0] if found else None


def _close(play: str, known: list[str], cutoff: float, n: int) -> list[str]:
    """The known names most like ``play`` (case ignored), best first."""
    by_lower = {name.lower(): name for name in reversed(known)}
    found = difflib.get_close_matches(play.lower(), list(by_lower), n=n, cutoff=cutoff)
    return [by_lower[name] for name in found]


async def _seen_on_namespace(client: Client, play: str) -> tuple[set[str], bool]:
    """The plays of the namespace's most recent runs, and whether ``play`` ever ran
    there; nothing when the namespace cannot be searched by ``PlaylinePlay``."""
    try:
        query = f"{sa.PLAY.name} = '{play}'"
        if _QUERYABLE.match(play) and (await client.count_workflows(query)).count:
            return set(), True
        seen: set[str] = set()
        async for execution in client.list_workflows(
            f"{sa.PLAY.name} IS NOT NULL", limit=RECENT_PLAY_RUNS, page_size=RECENT_PLAY_RUNS
        ):
            seen.add(execution.typed_search_attributes.get(sa.PLAY) or execution.workflow_type)
        return seen, False
    except RPCError:
        return set(), False


@dataclass(frozen=True, slots=True)
class Launch:
    """A play to start from the command line (``run``, ``estimate``, ``demo``): the
    client and settings it goes through, the play, its input and options, the queue."""

    client: Client
    settings: Settings
    play: str
    input: dict[str, Any]
    options: RunOptions
    task_queue: str

    async def started(
        self, handle: WorkflowHandle[Any, Any], workflow_id: str, said: str | None
    ) -> None:
        """Once the workflow is started: ``SAID PLAY as ID`` and its Temporal UI link
        (nothing when ``said`` is None), then the unknown-play guard."""
        if said is not None:
            console.print(f"{said} {self.play} as {workflow_id}")
            console.print(
                f"  Temporal UI: {ui_url(self.settings, workflow_id, handle.result_run_id)}"
            )
        await refuse_unknown_play(self.client, handle, self.play, self.task_queue)


async def refuse_unknown_play(
    client: Client, handle: WorkflowHandle[Any, Any], play: str, task_queue: str
) -> None:
    """Return once a worker ran the play's first task; end the run if none knows the play.

    Temporal retries a workflow task that failed because no worker registered its
    type forever; the user would wait forever. This ends the run after
    ``NOT_REGISTERED_ATTEMPTS`` such attempts and raises a ``PlaylineError``
    naming the plays the workers do know. It also warns (once) when no worker
    polls the task queue at all.
    """
    started = time.monotonic()
    warned = False
    while time.monotonic() - started < WATCH_START_S:
        not_registered: str | None = None
        # The whole (short) history at once: an abandoned history iterator leaves an RPC
        # behind that can crash the interpreter as it exits.
        history = await handle.fetch_history()
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                return
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                message = event.workflow_task_failed_event_attributes.failure.message
                if NOT_REGISTERED in message:
                    not_registered = message
        if not_registered is not None:
            desc = await handle.describe()
            pending = desc.raw_description.pending_workflow_task
            if pending.attempt >= NOT_REGISTERED_ATTEMPTS:
                known = _registered_plays(not_registered)
                await handle.terminate(reason=f"no worker on task queue {task_queue} has {play}")
                raise PlaylineError(
                    f"no worker on task queue {task_queue!r} has play {play!r}; the workers "
                    f"there have: {', '.join(known) or 'no plays'}. Start a worker that "
                    "imports the play's module (playline worker --plays MODULE); the run "
                    f"{handle.id} was terminated"
                )
        elif not warned and time.monotonic() - started > NO_WORKER_WARNING_S:
            if not await _has_pollers(client, task_queue):
                console.print(
                    f"[yellow]warning:[/] no worker is polling task queue {task_queue!r} yet; "
                    "the play starts when one does (playline worker --task-queue "
                    f"{task_queue})"
                )
            warned = True
        await asyncio.sleep(0.5)


def _registered_plays(message: str) -> list[str]:
    """The workflow types a worker listed, without playline's own."""
    _, _, listed = message.partition("available workflows:")
    names = [n.strip() for n in listed.split(",") if n.strip()]
    return [n for n in names if not n.startswith("playline.")]


async def _has_pollers(client: Client, task_queue: str) -> bool:
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return bool(response.pollers)
