"""Start plays from Python by their class, typed end to end.

```python
from playline import start_play
from playline.demo.enrich_leads import EnrichLeadsInput, enrich_leads

handle = await start_play(client, enrich_leads, EnrichLeadsInput(csv_path="/abs/leads.csv"))
result = await handle.result()          # PlayRunResult[EnrichLeadsOutput]
print(result.output.rows if result.output else 0)
```

The handle is Temporal's own ``WorkflowHandle``, parametrized with the play's
workflow class and ``PlayRunResult[Output]``: mypy checks the input model at the
call and knows ``result.output`` is the play's output model. It is decoded into
that model, not left a dict, because ``@play`` declares the workflow's result as
``PlayRunResult[Output]`` and the SDK takes the result type from there (so
``client.execute_workflow(enrich_leads.run, ...)`` decodes it the same way).
``client`` is any client carrying ``PlaylinePlugin`` (for example from
:func:`playline.worker.connect`), whose pydantic converter encodes the input.

The input is validated here, before anything is started, so a bad input fails at
the caller with the same one-line message the play would give.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, TypeAlias, TypedDict, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.client import Client, WorkflowHandle
from temporalio.common import Priority
from temporalio.service import RPCError, RPCStatusCode

from playline.calls.estimate_tally import Estimate
from playline.contract import PlayRunResult, RunOptions
from playline.errors import InvalidPlayInput, format_validation_errors
from playline.sheet_links import sheet_link
from playline.workflows.play import PlayWorkflow
from playline.workflows.priority import temporal_priority
from playline.workflows.status import play_static

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "PlayHandle",
    "estimate_play",
    "execute_play",
    "get_play_handle",
    "start_play",
]

#: The task queue ``playline worker`` polls by default.
DEFAULT_TASK_QUEUE = "playline"

InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT", bound=BaseModel | None)

#: A started play: Temporal's handle, typed with the play and its result.
PlayHandle: TypeAlias = WorkflowHandle[PlayWorkflow[InputT, OutputT], PlayRunResult[OutputT]]


def new_workflow_id(play_name: str) -> str:
    """A run's default id, here and in ``playline run``: ``PLAY-YYYYmmdd-HHMMSS-xxxxxx``."""
    return f"{play_name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


@contextlib.contextmanager
def not_found_as(error: Exception) -> Iterator[None]:
    """Raise ``error`` for Temporal's "not found" inside the block (the run or schedule
    asked about is gone, or never was), so the caller gets one line, not a gRPC status;
    any other RPC error passes as it is."""
    try:
        yield
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise error from None
        raise


class PlayStartOptions(TypedDict):
    """What a play run is started with besides its input and id: what the Temporal UI
    shows of it, and the priority its own tasks are dispatched with."""

    static_summary: str
    static_details: str
    priority: Priority


def play_start_options(
    play_name: str,
    input: Mapping[str, Any],
    options: RunOptions,
    workflow_id: str,
    *,
    sheets_url: str | None = None,
) -> PlayStartOptions:
    """How a play run started here or by ``playline run`` presents itself: a summary
    and details naming the play, its input file and its mode (linking to its sheet
    when the sheet view's base URL is known), and Temporal's priority of the options'
    fairness key, weight and class. The key defaults to the workflow id, the one the
    play names its dataset runs and chunks by when unset, so all its tasks share it."""
    sheet = sheet_link(sheets_url, workflow_id) if sheets_url else None
    summary, details = play_static(play_name, input, options, sheet=sheet)
    return PlayStartOptions(
        static_summary=summary,
        static_details=details,
        priority=temporal_priority(options, workflow_id),
    )


def _validated(play: type[PlayWorkflow[InputT, Any]], input: InputT | dict[str, Any]) -> Any:
    try:
        return play.input_model.model_validate(
            input.model_dump(mode="json") if isinstance(input, BaseModel) else input
        )
    except ValidationError as err:
        problems = format_validation_errors(err.errors())
        raise InvalidPlayInput(f"invalid input for play {play.play_name!r}: {problems}") from None


async def start_play(
    client: Client,
    play: type[PlayWorkflow[InputT, OutputT]],
    input: InputT,
    *,
    options: RunOptions | None = None,
    id: str | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
    sheets_url: str | None = None,
    **start_options: Any,
) -> PlayHandle[InputT, OutputT]:
    """Start ``play`` with ``input``; a handle whose ``result()`` is ``PlayRunResult[Output]``.

    Args:
        client: a client carrying ``PlaylinePlugin``.
        play: the play, as ``@play`` returned it (its workflow class).
        input: the play's input model.
        options: how the run goes (``RunOptions``; defaults to the defaults).
        id: the workflow id; default ``PLAY-timestamp-random``.
        task_queue: the queue the workers poll (default ``playline``).
        sheets_url: the sheet view's base URL (``Settings.sheets_url``): the run's
            details in the Temporal UI link to its sheet there.
        start_options: passed to ``Client.start_workflow`` (``execution_timeout``,
            ``id_conflict_policy``, ``search_attributes``...). ``static_summary`` and
            ``static_details`` default to the play, its input file and its mode, as
            the Temporal UI shows them; ``priority`` to Temporal's priority of the
            options' fairness key (the workflow id when unset), weight and class.
    """
    checked = _validated(play, input)
    options = options or RunOptions()
    workflow_id = id or new_workflow_id(play.play_name)
    shown = checked.model_dump(mode="json")
    defaults = play_start_options(
        play.play_name, shown, options, workflow_id, sheets_url=sheets_url
    )
    for name, value in defaults.items():
        start_options.setdefault(name, value)
    handle: PlayHandle[InputT, OutputT] = await client.start_workflow(
        play.run,
        args=[checked, options],
        id=workflow_id,
        task_queue=task_queue,
        **start_options,
    )
    return handle


async def execute_play(
    client: Client,
    play: type[PlayWorkflow[InputT, OutputT]],
    input: InputT,
    *,
    options: RunOptions | None = None,
    id: str | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
    **start_options: Any,
) -> PlayRunResult[OutputT]:
    """Start ``play`` and wait for its result (see :func:`start_play`)."""
    handle = await start_play(
        client, play, input, options=options, id=id, task_queue=task_queue, **start_options
    )
    return await handle.result()


def get_play_handle(
    client: Client,
    play: type[PlayWorkflow[InputT, OutputT]],
    workflow_id: str,
    *,
    run_id: str | None = None,
) -> PlayHandle[InputT, OutputT]:
    """The typed handle of a play started earlier (by any client, the CLI or the UI)."""
    return client.get_workflow_handle_for(play.run, workflow_id, run_id=run_id)


def estimate_options(options: RunOptions | None = None) -> RunOptions:
    """``options`` (default: the defaults) for an estimate of the same run: the same mode
    and fixtures, no budget (an estimate pays nothing, so it reserves nothing)."""
    return (options or RunOptions()).model_copy(
        update={
            "estimate": True,
            "max_credits": None,
            "max_credits_by_provider": {},
            "max_spend": None,
            "budget": None,
            "budget_run": None,
        }
    )


def new_estimate_id(play_name: str) -> str:
    """``estimate-PLAY-xxxxxxxxxx``, the id an estimate gets unless given one."""
    return f"estimate-{play_name}-{uuid.uuid4().hex[:10]}"


async def start_estimate(
    client: Client,
    play: type[PlayWorkflow[Any, Any]] | str,
    input: BaseModel | dict[str, Any],
    *,
    options: RunOptions | None = None,
    id: str | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
) -> WorkflowHandle[Any, PlayRunResult]:
    """Start an estimate of ``play`` (its class, or its name when only the workers know
    it); its result's ``stats.estimate`` is the tally (see :func:`estimate_play`)."""
    options = estimate_options(options)
    payload: Any
    if isinstance(play, str):
        name = play
        payload = input.model_dump(mode="json") if isinstance(input, BaseModel) else input
        shown = payload
    else:
        name = play.play_name
        payload = _validated(play, input)
        shown = payload.model_dump(mode="json")
    summary, details = play_static(name, shown, options)
    workflow_id = id or new_estimate_id(name)
    return await client.start_workflow(
        name,
        args=[payload, options],
        id=workflow_id,
        task_queue=task_queue,
        result_type=PlayRunResult,
        static_summary=f"estimate: {summary}",
        static_details=details,
        priority=temporal_priority(options, workflow_id),
    )


async def estimate_play(
    client: Client,
    play: type[PlayWorkflow[InputT, Any]] | str,
    input: InputT | dict[str, Any],
    *,
    options: RunOptions | None = None,
    id: str | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
) -> Estimate:
    """What running ``play`` on ``input`` would cost, without calling any provider.

    The estimate is a run of the play (workflow id ``estimate-PLAY-...`` unless ``id``
    is given, visible in the Temporal UI) on the workers, so it reads their receipt
    store: per column, tool and provider, the calls the run would make, those fresh
    receipts answer for free, and the credits of the rest, in the worst case and as
    the receipts' history expects. ``options`` are the run's (integration mode,
    fixtures); the estimate flag is set here.
    """
    handle = await start_estimate(
        client, play, input, options=options, id=id, task_queue=task_queue
    )
    result = await handle.result()
    return Estimate.from_tally(
        result.stats.estimate,
        play=result.play,
        workflow_id=handle.id,
        prices=result.stats.prices,
    )
