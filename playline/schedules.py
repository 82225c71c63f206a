"""Scheduled plays: re-run a play every week or month on Temporal's own Schedule API.

Contact data decays, so enrichment is re-run; receipts and freshness rules make a
re-run pay only for what went stale. A schedule here is a Temporal Schedule (no
timer of playline's own) whose action starts the play's workflow type with
``[input, options]``:

* ``options.estimate_first`` is set, so each firing first runs an estimate of itself
  (a child workflow) and records what is due before it pays for anything;
  ``options.schedule`` names the schedule in the run's summary;
* the workflow id is the schedule's name; Temporal appends the firing time;
* the action's ``priority`` is Temporal's of the options' fairness key (the
  schedule's name when unset), weight and priority class;
* ``PlaylinePlay`` is set from the firing's first moment, so ``runs list`` and the
  UI's play list show it as a play before its first workflow task ran;
* the schedule's memo (``playline_schedule``) holds the play, its input and the spec
  as written: ``list`` shows playline's schedules only, and ``describe`` shows a cron
  expression as given (the server turns it into calendars).

Defaults and why:

* ``overlap="skip"``: a firing still running when the next is due makes the next one
  skip (counted as skipped), never two runs of one play over the same rows;
* ``pause_on_failure=True``: a firing that failed (the input file gone, a key
  revoked) pauses the schedule with Temporal's note instead of failing every week;
* a firing's budget wait ends before the next firing at the latest: its options carry
  ``budget_wait_s``, the shortest gap between firings less a margin (a tenth of it, at
  most 5 minutes); past it the firing skips the rows its budget cannot cover (as with
  ``on_budget="stop"``) and ends, so the next firing is never skipped for it, and
  ``describe`` says "waiting for budget until ..." while it waits;
* ``catchup_window=10 minutes``: after Temporal was unavailable, a firing missed by
  less than that still runs; older ones are dropped (the next firing re-runs the
  play anyway), so an outage never releases a burst of paid runs. Temporal's own
  default is a year.

Errors are one-line ``PlaylineError`` s (``InvalidPlayInput`` for a bad input).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from playline import search_attributes as sa
from playline.client import DEFAULT_TASK_QUEUE, _validated, not_found_as
from playline.contract import PlayState, RunOptions
from playline.errors import PlaylineError
from playline.freshness import DurationLike, parse_duration
from playline.workflows.play import PlayWorkflow
from playline.workflows.priority import temporal_priority
from playline.workflows.status import play_static

__all__ = [
    "DEFAULT_CATCHUP_WINDOW",
    "OVERLAP_POLICIES",
    "SCHEDULE_MEMO",
    "Overlap",
    "ScheduleExists",
    "ScheduleFiring",
    "ScheduleView",
    "UnknownSchedule",
    "create_schedule",
    "delete_schedule",
    "describe_schedule",
    "duration_seconds",
    "list_schedules",
    "pause_schedule",
    "trigger_schedule",
    "unpause_schedule",
]

#: The schedule memo key marking a playline schedule: play, input, spec as written.
SCHEDULE_MEMO = "playline_schedule"
#: Firings missed by less than this (Temporal unavailable) still run; see the module doc.
DEFAULT_CATCHUP_WINDOW = timedelta(minutes=10)

Overlap = Literal[
    "skip", "buffer_one", "buffer_all", "allow_all", "cancel_other", "terminate_other"
]
#: What happens when a firing is due while the last one still runs (Temporal's policies).
OVERLAP_POLICIES: dict[str, ScheduleOverlapPolicy] = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer_one": ScheduleOverlapPolicy.BUFFER_ONE,
    "buffer_all": ScheduleOverlapPolicy.BUFFER_ALL,
    "allow_all": ScheduleOverlapPolicy.ALLOW_ALL,
    "cancel_other": ScheduleOverlapPolicy.CANCEL_OTHER,
    "terminate_other": ScheduleOverlapPolicy.TERMINATE_OTHER,
}
_OVERLAP_NAMES = {policy: name for name, policy in OVERLAP_POLICIES.items()}
#: A firing's budget wait ends this far before the next firing (at most)...
BUDGET_WAIT_MARGIN = timedelta(minutes=5)
#: ...and at most this fraction of the gap between firings.
BUDGET_WAIT_MARGIN_PART = 0.1
#: Schedule names: they are also the firings' workflow id prefix and go in UI links.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class UnknownSchedule(PlaylineError):
    """No schedule of that name in the namespace."""


class ScheduleExists(PlaylineError):
    """A schedule of that name exists already."""


class ScheduleFiring(BaseModel):
    """One firing of a schedule: the play run it started."""

    workflow_id: str
    run_id: str
    scheduled_at: datetime
    started_at: datetime


class ScheduleView(BaseModel):
    """A schedule as ``playline schedule describe|list`` shows it (and ``--json`` prints)."""

    name: str
    play: str
    #: ``every 7d`` or ``cron 0 6 * * 1``, as written at creation
    spec: str
    overlap: str
    pause_on_failure: bool
    catchup_window_s: float | None = None
    paused: bool
    note: str | None = None
    task_queue: str | None = None
    input: dict[str, Any] | None = None
    next_action_times: list[datetime] = Field(default_factory=list)
    #: the most recent firings, oldest first (Temporal keeps the last 10)
    recent_actions: list[ScheduleFiring] = Field(default_factory=list)
    #: workflow ids of the firings running now
    running: list[str] = Field(default_factory=list)
    #: running firings that wait for budget: ``{workflow id: what it says}``, with
    #: "waiting for budget until <next firing>"
    budget_waits: dict[str, str] = Field(default_factory=dict)
    num_actions: int = 0
    num_actions_skipped_overlap: int = 0
    num_actions_missed_catchup_window: int = 0
    created_at: datetime | None = None


def check_name(name: str) -> str:
    """``name`` if it can name a schedule (letters, digits, ``_ . -``; 1 to 100)."""
    if not _NAME.match(name):
        raise PlaylineError(
            f"invalid schedule name {name!r}: use letters, digits, '_', '.' and '-' "
            "(1 to 100, starting with a letter or digit)"
        )
    return name


def duration_text(seconds: float) -> str:
    """``7d``, ``12h``, ``90m``, ``5s``: the largest unit that divides ``seconds`` (days,
    not weeks: ``7d`` reads as written)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def duration_seconds(what: str, value: DurationLike) -> float:
    """``value`` in seconds (``"7d"``, seconds, a timedelta), at least 1; else a one-line
    error naming ``what``."""
    try:
        seconds = parse_duration(value)
    except ValueError as err:
        raise PlaylineError(f"{what}: {err}") from None
    if seconds is None or seconds < 1:
        raise PlaylineError(f"{what} must be at least 1 second, not {value!r}")
    return seconds


def schedule_spec(
    every: DurationLike | None = None, cron: str | None = None
) -> tuple[ScheduleSpec, str]:
    """The Temporal spec of exactly one of ``every`` and ``cron``, and its text."""
    if (every is None) == (cron is None or not cron.strip()):
        raise PlaylineError(
            "a schedule needs exactly one of every (e.g. '7d') and cron (e.g. '0 6 * * 1')"
        )
    if every is not None:
        seconds = duration_seconds("every", every)
        spec = ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=seconds))])
        return spec, f"every {duration_text(seconds)}"
    assert cron is not None
    expression = " ".join(cron.split())
    return ScheduleSpec(cron_expressions=[expression]), f"cron {expression}"


def overlap_policy(overlap: str) -> ScheduleOverlapPolicy:
    """Temporal's policy named ``overlap`` (``skip``, ``buffer_one``...)."""
    policy = OVERLAP_POLICIES.get(overlap.lower().replace("-", "_"))
    if policy is None:
        raise PlaylineError(
            f"unknown overlap policy {overlap!r}; use one of {', '.join(OVERLAP_POLICIES)}"
        )
    return policy


def scheduled_options(
    name: str, options: RunOptions | None, gap: timedelta | None = None
) -> RunOptions:
    """A firing's options: estimate first, named by its schedule, its own budget run
    (``max_credits`` caps each firing, not the schedule's lifetime) and, given the
    shortest ``gap`` between firings, a budget wait that ends before the next one."""
    update: dict[str, Any] = {"estimate_first": True, "schedule": name, "budget_run": None}
    if gap is not None and gap > timedelta(0):
        margin = min(BUDGET_WAIT_MARGIN, gap * BUDGET_WAIT_MARGIN_PART)
        update["budget_wait_s"] = max((gap - margin).total_seconds(), 0.5)
        update["budget_wait_until"] = None
    return (options or RunOptions()).model_copy(update=update)


def _shortest_gap(times: list[datetime]) -> timedelta | None:
    """The shortest time between consecutive firings (None: fewer than two known)."""
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return min(gaps) if gaps else None


def _play_and_input(
    play: type[PlayWorkflow[Any, Any]] | str, input: BaseModel | Mapping[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """The play's name and its input as JSON, validated when the play's class is given."""
    if isinstance(play, str):
        if isinstance(input, BaseModel):
            return play, input.model_dump(mode="json")
        return play, dict(input or {})
    checked = _validated(play, input if isinstance(input, BaseModel) else dict(input or {}))
    return play.play_name, checked.model_dump(mode="json")


async def _play_attribute_registered(client: Client) -> bool:
    """Whether the namespace has ``PlaylinePlay``: a firing whose action sets an
    unregistered attribute would fail to start, every time."""
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
    except RPCError:
        return False
    return dict(listed.custom_attributes).get(sa.PLAY.name) == int(sa.PLAY.indexed_value_type)


async def create_schedule(
    client: Client,
    name: str,
    play: type[PlayWorkflow[Any, Any]] | str,
    input: BaseModel | Mapping[str, Any] | None = None,
    *,
    every: DurationLike | None = None,
    cron: str | None = None,
    options: RunOptions | None = None,
    overlap: Overlap | str = "skip",
    pause_on_failure: bool = True,
    catchup_window: DurationLike = DEFAULT_CATCHUP_WINDOW,
    paused: bool = False,
    task_queue: str = DEFAULT_TASK_QUEUE,
    note: str | None = None,
) -> ScheduleHandle:
    """Schedule ``play`` on ``input`` every ``every`` (``"7d"``, seconds, a timedelta)
    or by ``cron``; Temporal's handle of the new schedule.

    Args:
        client: a client carrying ``PlaylinePlugin`` (its converter encodes the options).
        name: the schedule's id, and its firings' workflow id prefix.
        play: the play's class (its input is validated here) or its name.
        input: the play's input (a model or a JSON object); a ``csv_path`` must be one
            the workers can read (``store:<id>`` after an upload, or their disk).
        options: the firings' ``RunOptions`` (budget flags apply to each firing).
        overlap: what a firing due while the last one runs does (default skip it).
        pause_on_failure: pause the schedule when a firing fails (default on).
        catchup_window: how late a firing missed while Temporal was away may still run.
        paused: create it paused (``unpause`` starts it).
        note: the schedule's note (shown by ``describe`` and the UI).
    """
    check_name(name)
    spec, spec_text = schedule_spec(every, cron)
    policy = SchedulePolicy(
        overlap=overlap_policy(overlap),
        catchup_window=timedelta(seconds=duration_seconds("catchup_window", catchup_window)),
        pause_on_failure=pause_on_failure,
    )
    play_name, payload = _play_and_input(play, input)
    gap = spec.intervals[0].every if spec.intervals else None
    run_options = scheduled_options(name, options, gap)
    summary, details = play_static(play_name, payload, run_options)
    attributes = (
        TypedSearchAttributes([SearchAttributePair(sa.PLAY, play_name)])
        if await _play_attribute_registered(client)
        else TypedSearchAttributes.empty
    )
    action = ScheduleActionStartWorkflow(
        play_name,
        args=[payload, run_options],
        id=name,
        task_queue=task_queue,
        typed_search_attributes=attributes,
        static_summary=f"schedule {name}: {summary}",
        static_details=f"{details}\n- schedule: `{name}` ({spec_text})",
        # A firing's id is only known when it fires (the name and the time): without a
        # fairness key, its own tasks count for the schedule; the play then names its
        # dataset runs and chunks by its workflow id, as any run without a key.
        priority=temporal_priority(run_options, name),
    )
    memo = {
        SCHEDULE_MEMO: {
            "play": play_name,
            "input": payload,
            "spec": spec_text,
            "task_queue": task_queue,
        }
    }
    try:
        handle = await client.create_schedule(
            name,
            Schedule(
                action=action,
                spec=spec,
                policy=policy,
                state=ScheduleState(paused=paused, note=note),
            ),
            memo=memo,
        )
        if gap is None:
            # A cron's firings are known once Temporal has read it: bound the budget
            # wait by the shortest gap between the next ones.
            await _bound_budget_wait(handle, name, options)
        return handle
    except ScheduleAlreadyRunningError:
        raise ScheduleExists(
            f"a schedule named {name!r} exists already; see it with "
            f"`playline schedule describe {name}` or delete it first"
        ) from None
    except RPCError as err:
        if err.status == RPCStatusCode.INVALID_ARGUMENT and cron is not None:
            raise PlaylineError(f"invalid cron expression {cron!r}: {_one_line(err)}") from None
        if err.status == RPCStatusCode.INVALID_ARGUMENT:
            raise PlaylineError(f"Temporal refused schedule {name!r}: {_one_line(err)}") from None
        raise


async def _bound_budget_wait(handle: ScheduleHandle, name: str, options: RunOptions | None) -> None:
    """Set the firings' budget wait bound from the schedule's next action times."""
    desc = await handle.describe()
    gap = _shortest_gap(list(desc.info.next_action_times))
    if gap is None:
        return
    bounded = scheduled_options(name, options, gap)

    def update(given: ScheduleUpdateInput) -> ScheduleUpdate | None:
        schedule = given.description.schedule
        action = schedule.action
        if not isinstance(action, ScheduleActionStartWorkflow) or len(action.args) != 2:
            return None
        action.args = [action.args[0], bounded]
        return ScheduleUpdate(schedule=schedule)

    await handle.update(update)


def _one_line(err: RPCError) -> str:
    return " ".join(str(err.message).split())


def _known(name: str) -> contextlib.AbstractContextManager[None]:
    """Turn Temporal's "not found" about schedule ``name`` into ``UnknownSchedule``."""
    return not_found_as(
        UnknownSchedule(f"no schedule named {name!r}; `playline schedule list` shows them")
    )


async def _view(name: str, desc: ScheduleDescription) -> ScheduleView:
    memo = await desc.memo_value(SCHEDULE_MEMO, None)
    memo = memo if isinstance(memo, dict) else {}
    schedule, info = desc.schedule, desc.info
    action = schedule.action
    workflow = action.workflow if isinstance(action, ScheduleActionStartWorkflow) else "?"
    spec = memo.get("spec") or _spec_text(schedule.spec)
    window = schedule.policy.catchup_window
    return ScheduleView(
        name=name,
        play=memo.get("play") or workflow,
        spec=spec,
        overlap=_OVERLAP_NAMES.get(schedule.policy.overlap, str(schedule.policy.overlap)),
        pause_on_failure=schedule.policy.pause_on_failure,
        catchup_window_s=window.total_seconds() if window is not None else None,
        paused=schedule.state.paused,
        note=schedule.state.note or None,
        task_queue=memo.get("task_queue")
        or (action.task_queue if isinstance(action, ScheduleActionStartWorkflow) else None),
        input=memo.get("input"),
        next_action_times=list(info.next_action_times),
        recent_actions=[
            ScheduleFiring(
                workflow_id=a.action.workflow_id,
                run_id=a.action.first_execution_run_id,
                scheduled_at=a.scheduled_at,
                started_at=a.started_at,
            )
            for a in info.recent_actions
            if isinstance(a.action, ScheduleActionExecutionStartWorkflow)
        ],
        running=[
            r.workflow_id
            for r in info.running_actions
            if isinstance(r, ScheduleActionExecutionStartWorkflow)
        ],
        num_actions=info.num_actions,
        num_actions_skipped_overlap=info.num_actions_skipped_overlap,
        num_actions_missed_catchup_window=info.num_actions_missed_catchup_window,
        created_at=info.created_at,
    )


def _spec_text(spec: ScheduleSpec) -> str:
    """A spec made elsewhere (not by playline): its intervals and cron strings."""
    parts = [f"every {duration_text(i.every.total_seconds())}" for i in spec.intervals]
    parts += [f"cron {c}" for c in spec.cron_expressions]
    if spec.calendars:
        parts.append(f"{len(spec.calendars)} calendar(s)")
    return ", ".join(parts) or "no times"


#: How long ``describe`` waits for a running firing to answer its state query: a firing
#: whose workers are all gone cannot answer, and describing must not hang on it.
FIRING_QUERY_TIMEOUT = timedelta(seconds=5)


async def describe_schedule(
    client: Client, name: str, *, budget_waits: bool = True
) -> ScheduleView:
    """The schedule ``name``: its play, spec, policies, state, next and recent firings,
    and (unless ``budget_waits`` is false) what its running firings that wait for
    budget say, which asks each running firing by query."""
    with _known(name):
        desc = await client.get_schedule_handle(name).describe()
    view = await _view(name, desc)
    if budget_waits:
        view.budget_waits = await _budget_waits(client, view)
    return view


async def _firing_state(client: Client, workflow_id: str) -> PlayState | None:
    """A running firing's state, or None if it cannot answer within the timeout."""
    try:
        state: PlayState = await client.get_workflow_handle(workflow_id).query(
            "state", result_type=PlayState, rpc_timeout=FIRING_QUERY_TIMEOUT
        )
        return state
    except Exception:  # a firing that cannot answer now: nothing to say about it
        return None


async def _budget_waits(client: Client, view: ScheduleView) -> dict[str, str]:
    """The running firings waiting for budget, each with until when (the next firing)."""
    waits: dict[str, str] = {}
    states = await asyncio.gather(*(_firing_state(client, w) for w in view.running))
    for workflow_id, state in zip(view.running, states, strict=True):
        if state is None or not state.budget_wait:
            continue
        nxt = view.next_action_times[0] if view.next_action_times else None
        until = (
            f"waiting for budget until {nxt.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC (next firing)"
            if nxt is not None
            else "waiting for budget"
        )
        waits[workflow_id] = f"{until}: {state.budget_wait}"
    return waits


async def list_schedules(client: Client) -> list[ScheduleView]:
    """playline's schedules in the namespace (those with its memo), by name.

    The listing is Temporal's visibility (eventually consistent: a schedule created a
    moment ago may be missing); each is then described, which is exact.
    """
    names: list[str] = []
    async for listed in await client.list_schedules():
        if await listed.memo_value(SCHEDULE_MEMO, None) is not None:
            names.append(listed.id)
    views = []
    for name in sorted(names):
        with contextlib.suppress(UnknownSchedule):  # deleted since it was listed
            # the list says no budget waits: asking every running firing of every
            # schedule would make listing as slow as the slowest firing
            views.append(await describe_schedule(client, name, budget_waits=False))
    return views


async def pause_schedule(client: Client, name: str, note: str | None = None) -> None:
    """Pause ``name``: no firing starts until ``unpause_schedule`` (running ones go on)."""
    with _known(name):
        await client.get_schedule_handle(name).pause(note=note or "paused by playline")


async def unpause_schedule(client: Client, name: str, note: str | None = None) -> None:
    """Let ``name`` fire again at its next time (missed times are not made up)."""
    with _known(name):
        await client.get_schedule_handle(name).unpause(note=note or "unpaused by playline")


async def trigger_schedule(client: Client, name: str, overlap: Overlap | str | None = None) -> None:
    """Fire ``name`` now (``overlap``: this once, instead of the schedule's policy)."""
    policy = overlap_policy(overlap) if overlap is not None else None
    with _known(name):
        await client.get_schedule_handle(name).trigger(overlap=policy)


async def delete_schedule(client: Client, name: str) -> None:
    """Delete ``name``: no more firings; runs it started go on and stay listed."""
    with _known(name):
        await client.get_schedule_handle(name).delete()
