"""``@play``: declare a play; each play becomes its own Temporal workflow type.

```python
@play(name="enrich_leads", required_columns=["email"])
async def enrich_leads(ctx: PlayContext, input: EnrichLeadsInput) -> EnrichLeadsOutput:
    leads = await ctx.csv("leads", input.csv_path)  # checked for "email"
    ...
```

``required_columns`` declares what the play's CSV (its input's ``csv_path``) must
have, where a client can read it before it runs the play: ``playline run --csv`` checks
the file's header on the user's machine and refuses it before any upload, and the
workers publish each play's declaration with its name (``playline plays list``).
Inside the play ``ctx.csv`` checks the same columns when it loads that file.

The decorator returns a workflow class that stands in the module under the
function's name, which is what lets Temporal's sandbox re-import it. The workflow
takes ``(input, options: RunOptions | None)`` and returns a ``PlayRunResult``: the
play's own (small) output plus the run's accounting.

For type checkers the class is a ``PlayWorkflow[Input, Output]`` whose ``run`` takes
the play's input model and returns ``PlayRunResult[Output]``, so
``playline.start_play(client, enrich_leads, EnrichLeadsInput(...))`` and
``client.execute_workflow(enrich_leads.run, ...)`` are checked end to end. At run
time the workflow still decodes its input as plain JSON and validates it itself
(see ``play``), and clients decode the result with the play's output model.
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, get_args, get_type_hints

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from playline.activities.balances import (
        BalanceActivities,
        BalancesRead,
        ReadBalancesInput,
    )
    from playline.activities.budgets import (
        BudgetActivities,
        EndRunBudgetsInput,
        RunBudgetsEnded,
    )
    from playline.activities.visibility import VisibilityActivities
    from playline.contract import (
        AdjustBudgetInput,
        BudgetChange,
        BudgetReport,
        ChunkStats,
        ControlState,
        DatasetRunState,
        PlayRunResult,
        PlayState,
        RunOptions,
    )
    from playline.errors import (
        InvalidPlayInput,
        PlaylineError,
        format_validation_errors,
        root_cause,
    )
    from playline.workflows.context import PlayContext
    from playline.workflows.controls import PlayControls
    from playline.workflows.dataset_run import PROGRESS_SIGNAL
    from playline.workflows.failures import as_failure
    from playline.workflows.priority import play_fairness_key, temporal_priority
    from playline.workflows.status import play_static

InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT", bound=BaseModel | None)
PlayFn = Callable[[PlayContext, Any], Awaitable[BaseModel | None]]
#: The longest a firing waits for its estimate before it runs without one.
ESTIMATE_FIRST_TIMEOUT = timedelta(hours=1)
#: Runs recorded before a run's reservations were settled when it ends replay without it.
BUDGET_RUN_END_PATCH = "budget-run-end"
#: Runs recorded before ``--add`` was turned into a ``set`` replay with the old command.
BUDGET_ADD_ONCE_PATCH = "budget-add-once"
#: Runs recorded before a run's balances were read (before and after) replay without it.
BALANCE_READINGS_PATCH = "balance-readings"


class PlayWorkflow(Generic[InputT, OutputT]):
    """Base of every generated play workflow: runs the play function with a context.

    Attributes:
        play_name: the workflow type.
        input_model: the play's input model.
        output_type: what the play returns: its output model, ``None`` for a play
            that returns nothing, ``Any`` when the function is not annotated.
    """

    play_name: str = ""
    play_fn: PlayFn
    #: the columns the play's CSV (its input's ``csv_path``) must have
    required_columns: tuple[str, ...] = ()
    input_model: type[BaseModel]
    output_type: Any = Any

    if TYPE_CHECKING:
        # Generated per play by ``play``; declared here for type checkers only.
        async def run(
            self, input: InputT, options: RunOptions | None = None
        ) -> PlayRunResult[OutputT]: ...

        def state(self) -> PlayState: ...

    def __init__(self) -> None:
        self._ctx: PlayContext | None = None
        self._controls = PlayControls(self.play_name)
        self._options: RunOptions | None = None
        #: budget updates one at a time: each ``--add`` reads the cap it raises
        self._budget_lock = asyncio.Lock()
        #: the run read its providers' balances before its first call: read them after
        self._balances_read = False

    async def _execute(self, raw_input: Any, options: RunOptions | None) -> PlayRunResult:
        options = options or RunOptions()
        if options.budgeted and options.budget_run is None:
            # The run's caps live in the store under this run's id: every dataset run,
            # scalar call and child play of it reserves against the same ones.
            options = options.model_copy(update={"budget_run": workflow.info().run_id})
        if options.fairness_key is None:
            # "The play run itself" made explicit, before anything copies the options:
            # every dataset run, chunk and child play then names the same key, to the
            # governor and to Temporal. A payload change only (no command), so runs
            # recorded before it replay unchanged.
            key = play_fairness_key(workflow.info().workflow_id)
            options = options.model_copy(update={"fairness_key": key})
        self._options = options
        # Runs recorded before the play kept itself visible (search attributes, memo)
        # replay without those commands.
        visible = workflow.patched("play-visibility")
        registered = await self._registered_search_attributes() if visible else []
        ctx = self._ctx = PlayContext(
            self.play_name,
            options,
            self._controls,
            search_attributes=registered,
            memo=visible,
            before_calls=self._balances_before if self._reads_balances(options) else None,
        )
        try:
            play_input = self.input_model.model_validate(raw_input if raw_input is not None else {})
        except ValidationError as err:
            problems = format_validation_errors(err.errors())
            message = f"invalid input for play {self.play_name!r}: {problems}"
            ctx.end("failed", message)
            raise ApplicationError(message, type="InvalidPlayInput", non_retryable=True) from None
        # A payload default only (what ``ctx.csv`` checks when not told): no command.
        ctx.declare_input_csv(getattr(play_input, "csv_path", None), self.required_columns)
        if not registered and visible:
            ctx.log(
                "playline's search attributes are not registered in this namespace: the "
                "play is not searchable by them (register them with `playline setup`)"
            )
        if options.integration_mode == "fixture":
            ctx.log(
                "Fixture mode: provider pacing explicitly enforced for production-parity testing."
                if options.enforce_fixture_pacing
                else "Fixture mode: provider pacing bypassed because no provider request is "
                "dispatched."
            )
        ctx.state.phase = "running"
        ctx.publish()
        try:
            if options.estimate_first and not options.estimate:
                await self._estimate_first(ctx, raw_input, options)
            output = await self._play(ctx, play_input, options)
        except (ActivityError, ChildWorkflowError) as err:
            if is_cancelled_exception(err) and workflow.cancellation_reason() is not None:
                await self._wrap_up(ctx, options, "cancelled")
                ctx.end("cancelled")
                raise
            # The play's failure says what went wrong (the root cause's type and
            # message), not "Activity task failed".
            failure = as_failure(err)
            await self._wrap_up(ctx, options, "failed")
            ctx.end("failed", failure.message)
            raise failure from err
        except asyncio.CancelledError:
            await self._wrap_up(ctx, options, "cancelled")
            if workflow.cancellation_reason() is not None:
                ctx.end("cancelled")
            raise
        except (FailureError, PlaylineError) as err:
            await self._wrap_up(ctx, options, "failed")
            ctx.end("failed", str(getattr(root_cause(err), "message", err)))
            raise
        await self._wrap_up(ctx, options, "completed")
        ctx.end("completed")
        return PlayRunResult(
            play=self.play_name,
            output=output.model_dump(mode="json") if output is not None else None,
            datasets=[d.model_copy(update={"rows": None}) for d in ctx.datasets],
            stats=ctx.stats,
            integration_mode=options.integration_mode,
            budget_exhausted=ctx.stats.rows_skipped_budget > 0,
        )

    async def _wrap_up(self, ctx: PlayContext, options: RunOptions, outcome: str) -> None:
        """What a run does however it ends: settle its budgets, then (when it read its
        providers' balances before its first call) read them again, for its
        reconciliation."""
        await self._end_budgets(ctx, options, outcome)
        if self._balances_read:
            await self._read_balances(ctx, "after")

    def _reads_balances(self, options: RunOptions) -> bool:
        """Whether this run reads its providers' balances: a live run that is not an
        estimate (nothing is paid otherwise). The patch is asked only then, at the run's
        first call, so histories recorded before it replay without it."""
        return not options.estimate and options.integration_mode == "live"

    async def _balances_before(self) -> None:
        """``PlayContext``'s hook before the run's first call: read the balances."""
        if workflow.patched(BALANCE_READINGS_PATCH) and self._ctx is not None:
            self._balances_read = await self._read_balances(self._ctx, "before")

    async def _read_balances(self, ctx: PlayContext, phase: Literal["before", "after"]) -> bool:
        """Each provider's balance ``phase`` the run (see :mod:`playline.reconcile`);
        after it, the reconciliation goes in the UI's details. A read that fails is
        logged: the run goes on, and its reconciliation says the balance is unread.
        Whether any provider has a balance to read (none: no reading after the run)."""
        info = workflow.info()
        try:
            read: BalancesRead = await workflow.execute_activity_method(
                BalanceActivities.read_balances,
                ReadBalancesInput(run=info.workflow_id, run_id=info.run_id, phase=phase),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"read the providers' balances {phase} the run",
            )
        except ActivityError as err:
            cancelled = is_cancelled_exception(err) and workflow.cancellation_reason() is not None
            if phase == "before" and cancelled:
                raise  # the play was cancelled while reading: no call goes out
            ctx.log(f"balances not read {phase} the run ({as_failure(err).message})")
            return phase == "before"  # read after all the same: the reconciliation says
        if read.reconciliation:
            ctx.state.reconciliation = read.reconciliation
            ctx.publish()
        return bool(read.balances)

    async def _end_budgets(self, ctx: PlayContext, options: RunOptions, outcome: str) -> None:
        """A run's reservations are settled or released when the run ends, however it
        ends: the play that owns the run's budgets (not a child play drawing on them)
        settles or releases what its rows and calls left open. Terminated runs run no
        code: ``playline budgets release --run ID``. A failure here is logged and does
        not change how the play ended."""
        if (
            not options.budgeted
            or options.budget_run != workflow.info().run_id
            or not workflow.patched(BUDGET_RUN_END_PATCH)
        ):
            return
        try:
            ended: RunBudgetsEnded = await workflow.execute_activity_method(
                BudgetActivities.end_run_budgets,
                EndRunBudgetsInput(run=options.budget_run, outcome=outcome),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=10),
                summary=f"settle the run's budget reservations ({outcome})",
            )
        except ActivityError as err:
            ctx.log(
                f"the run's budget reservations were not settled ({as_failure(err).message}); "
                f"`playline budgets release --run {options.budget_run}` frees them"
            )
            return
        if ended.settled or ended.kept_worst or ended.released:
            ctx.log(ended.summary)

    async def _estimate_first(self, ctx: PlayContext, raw_input: Any, options: RunOptions) -> None:
        """Record what is due (``state.due``) before paying for anything: the same play
        estimated as a child workflow (scheduled firings set ``estimate_first``).

        No ``workflow.patched`` guard: runs recorded before this existed never had
        ``estimate_first`` set (the field is new), so their replay never gets here. An
        estimate that fails is logged and the play runs anyway: a firing must not be
        lost to its preview. Its cancellation (the play's) still cancels the play.
        """
        # As ``playline.client.estimate_options`` (not importable here: it imports this).
        est_options = options.model_copy(
            update={
                "estimate": True,
                "estimate_first": False,
                "max_credits": None,
                "max_credits_by_provider": {},
                "max_spend": None,
                "budget": None,
                "budget_run": None,
            }
        )
        child_id = f"{workflow.info().workflow_id}-estimate"
        shown = raw_input if isinstance(raw_input, dict) else {}
        summary, details = play_static(self.play_name, shown, est_options)
        ctx.state.phase = "estimating what is due"
        ctx.publish()
        try:
            result: PlayRunResult = await workflow.execute_child_workflow(
                self.play_name,
                args=[raw_input, est_options],
                id=child_id,
                result_type=PlayRunResult,
                static_summary=f"estimate first: {summary}",
                static_details=details,
                # An estimate sends nothing and waits on no provider: one stuck (a
                # workflow task failing over and over) must not hold the firing for ever.
                execution_timeout=ESTIMATE_FIRST_TIMEOUT,
                priority=temporal_priority(est_options, workflow.info().workflow_id),
            )
        except ChildWorkflowError as err:
            if is_cancelled_exception(err) and workflow.cancellation_reason() is not None:
                raise
            ctx.log(f"estimate first failed ({as_failure(err).message}); running the play anyway")
        except WorkflowAlreadyStartedError:  # an estimate of this id still runs: go on
            ctx.log(f"estimate first skipped ({child_id} is already running); running the play")
        else:
            _record_due(ctx, result.stats, child_id)
        ctx.state.phase = "running"
        ctx.publish()

    async def _play(self, ctx: PlayContext, play_input: Any, options: RunOptions) -> Any:
        """Run the play's own code; in an estimate, code that stumbles on what an
        estimate does not do (a skipped step's ``None``, an answer not paid for) ends
        the play with what was counted, instead of failing its workflow task for ever."""
        if not options.estimate:
            return await type(self).play_fn(ctx, play_input)
        try:
            return await type(self).play_fn(ctx, play_input)
        except (
            ActivityError,
            ChildWorkflowError,
            FailureError,
            PlaylineError,
            asyncio.CancelledError,
        ):
            raise
        except Exception as err:
            ctx.log(f"estimate: the play's code stopped ({type(err).__name__}); counted so far")
            return None

    async def _registered_search_attributes(self) -> list[str]:
        """Which of playline's search attributes the namespace has (a local activity)."""
        try:
            return await workflow.execute_local_activity_method(
                VisibilityActivities.registered_search_attributes,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="which playline search attributes this namespace has",
            )
        except ActivityError as err:
            workflow.logger.warning("%s: search attributes unknown: %s", self.play_name, err)
            return []

    def _state(self) -> PlayState:
        if self._ctx is None:
            return PlayState(play=self.play_name)
        return self._ctx.state

    # -- controls (updates validated before they enter history) ------------------

    def _control_state(self) -> ControlState:
        state = self._state()
        return ControlState(
            status=state.status,
            paused=self._controls.dispatch.paused,
            window=self._controls.dispatch.window,
            dataset=state.current_dataset if state.current_child_id else None,
        )

    async def _controlled(self, **changes: Any) -> ControlState:
        await self._controls.apply(**changes)
        if self._ctx is not None:
            self._ctx.publish()
        return self._control_state()

    @workflow.update(name="pause")
    async def pause(self) -> ControlState:
        """Stop starting chunks (and tool calls); those in flight finish and are recorded."""
        return await self._controlled(paused=True)

    @pause.validator
    def _validate_pause(self) -> None:
        self._controls.check_pause()

    @workflow.update(name="resume")
    async def resume(self) -> ControlState:
        """Start chunks again after ``pause``."""
        return await self._controlled(paused=False)

    @resume.validator
    def _validate_resume(self) -> None:
        self._controls.check_resume()

    @workflow.update(name="set_window")
    async def set_window(self, window: int) -> ControlState:
        """Keep at most ``window`` chunks in flight (1 to 64), instead of the governor's width."""
        return await self._controlled(window=window)

    @set_window.validator
    def _validate_set_window(self, window: int) -> None:
        self._controls.check_window(window)

    @workflow.update(name="budget")
    async def budget(self, change: BudgetChange) -> BudgetReport:
        """Raise or set the run's credit cap (or a provider's, or its money cap), or retry
        after a named budget was raised: rows held for budget run again."""
        options = self._options
        assert options is not None and options.budget_run is not None  # the validator
        cap: float | None
        if change.provider is not None:
            cap = options.max_credits_by_provider[change.provider]
        elif change.spend:
            cap = options.max_spend
        else:
            cap = None if change.retry else options.max_credits
        adjust = AdjustBudgetInput(
            run=options.budget_run,
            provider=change.provider,
            named=options.budget if change.retry else None,
            add=change.add,
            set_to=change.set,
            create_with=cap,
            spend=change.spend,
        )
        what = "money cap of the run" if change.spend else "of the run"
        summary = "budget " + (change.provider or options.budget or what)
        async with self._budget_lock:
            if change.add is not None and workflow.patched(BUDGET_ADD_ONCE_PATCH):
                # ``--add N`` applied once however often the activity is retried: the
                # cap is read first and set to what it was plus N.
                read: BudgetReport = await workflow.execute_activity_method(
                    BudgetActivities.adjust_budget,
                    adjust.model_copy(update={"add": None}),
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary=summary + " (read)",
                )
                adjust = adjust.model_copy(update={"add": None, "set_to": read.limit + change.add})
            report: BudgetReport = await workflow.execute_activity_method(
                BudgetActivities.adjust_budget,
                adjust,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary=summary,
            )
        await self._controlled(budget_epoch=self._controls.dispatch.budget_epoch + 1)
        return report

    @budget.validator
    def _validate_budget(self, change: BudgetChange) -> None:
        self._controls.check_budget(change, self._options)

    @workflow.signal(name=PROGRESS_SIGNAL)
    def _progress(self, report: DatasetRunState) -> None:
        """The dataset run in flight reports its progress (spaced out by the run)."""
        if self._ctx is not None:
            self._ctx.on_progress(report)


def _record_due(ctx: PlayContext, stats: ChunkStats, estimate_id: str) -> None:
    """``state.due`` and one log line from the estimate's stats."""
    calls, worst = _due_calls(stats.estimate)
    ctx.state.due = {
        "cells_due": stats.cells_due,
        "cells_fresh": stats.cells_fresh,
        "calls": calls,
        "worst_case": worst,
        "estimate_id": estimate_id,
    }
    if calls:
        ctx.log(
            f"due: {stats.cells_due} cells ({stats.cells_fresh} fresh), {calls} paid calls, "
            f"worst case {worst:g} credits"
        )
    else:
        ctx.log(f"nothing is due: no call would be paid ({stats.cells_fresh} cells fresh)")


def _due_calls(tally: dict[str, Any]) -> tuple[int, float]:
    """Paid calls and their worst-case credits in an estimate's tally (``ChunkStats.
    estimate``: ``{"lines": {column: {tool: {provider: figures}}}}``), read as
    ``playline.calls.estimate_tally.Estimate`` adds them up (workflows may not import
    ``playline.calls``)."""
    calls, worst = 0, 0.0
    for tools in (tally.get("lines") or {}).values():
        for providers in tools.values():
            for figures in providers.values():
                calls += int(figures.get("to_pay", 0)) + int(figures.get("unknown_input", 0))
                worst += float(figures.get("worst_credits", 0.0))
    return calls, round(worst, 6)


_PLAYS: dict[str, type[PlayWorkflow[Any, Any]]] = {}


def play(
    name: str | None = None,
    *,
    input_model: type[BaseModel] | None = None,
    required_columns: Sequence[str] = (),
) -> Callable[
    [Callable[[PlayContext, InputT], Awaitable[OutputT]]], type[PlayWorkflow[InputT, OutputT]]
]:
    """Declare a play: ``name`` is its workflow type (default: the function's name).

    The input model is the annotation of the function's second parameter unless
    ``input_model`` is given; the output is its return annotation (a pydantic
    model, or ``None``). ``required_columns`` are the columns the play's CSV (its
    input's ``csv_path``) must have: declared here, a client checks a file before it
    uploads it (``playline run --csv``), and ``ctx.csv`` checks them when it loads
    that file without a ``required_columns`` of its own.
    """

    def decorate(
        fn: Callable[[PlayContext, InputT], Awaitable[OutputT]],
    ) -> type[PlayWorkflow[InputT, OutputT]]:
        play_name = name or fn.__name__
        model = input_model or _input_model_of(fn)
        output = _output_type_of(fn)
        columns = _declared_columns(play_name, model, required_columns)

        async def run(
            self: PlayWorkflow[Any, Any], input: Any, options: RunOptions | None = None
        ) -> Any:
            return await self._execute(input, options)

        def state(self: PlayWorkflow[Any, Any]) -> PlayState:
            return self._state()

        # Temporal wants module-level names; the class stands in the module under
        # the function's name, so give its methods matching qualified names.
        run.__qualname__ = f"{fn.__qualname__}.run"
        state.__qualname__ = f"{fn.__qualname__}.state"
        run.__module__ = state.__module__ = fn.__module__
        # The input is decoded as plain JSON and validated by ``_execute``: a typed
        # parameter would turn a bad input into a workflow *task* failure, retried
        # forever, instead of a failed play whose message says what is wrong.
        # The result is declared with the play's output model outside the sandbox
        # (where clients take result types from), the plain one inside it (where
        # parametrizing per workflow run would only make throwaway classes).
        in_sandbox = workflow.unsafe.in_sandbox()
        run.__annotations__ = {
            "input": Any,
            "options": RunOptions | None,
            "return": PlayRunResult if in_sandbox else PlayRunResult[output],  # type: ignore[valid-type]
        }
        state.__annotations__ = {"return": PlayState}
        Play = type(
            fn.__name__,
            (PlayWorkflow,),
            {
                "run": workflow.run(run),
                "state": workflow.query(name="state")(state),
                "play_name": play_name,
                "play_fn": staticmethod(fn),
                "input_model": model,
                "output_type": output,
                "required_columns": columns,
                "__qualname__": fn.__qualname__,
                "__module__": fn.__module__,
                "__doc__": fn.__doc__,
                "__playline_play__": play_name,
            },
        )
        defined: type[PlayWorkflow[InputT, OutputT]] = workflow.defn(name=play_name)(Play)
        if not in_sandbox:
            _PLAYS[play_name] = defined
        return defined

    return decorate


def _declared_columns(
    play_name: str, model: type[BaseModel], required_columns: Sequence[str]
) -> tuple[str, ...]:
    """``required_columns`` checked as the play is declared: names (not one string,
    whose letters would each be a column), and an input with a ``csv_path`` to apply
    them to."""
    if isinstance(required_columns, str):
        raise InvalidPlayInput(
            f"play {play_name}: required_columns is a list of names, not one string "
            f"(required_columns=[{required_columns!r}])"
        )
    columns = tuple(required_columns)
    if any(not isinstance(c, str) or not c.strip() for c in columns):
        raise InvalidPlayInput(f"play {play_name}: required_columns must be non-blank names")
    if columns and "csv_path" not in model.model_fields:
        raise InvalidPlayInput(
            f"play {play_name}: required_columns are the columns of the input's csv_path, "
            f"and {model.__name__} has no csv_path field; pass required_columns to "
            "ctx.csv(...) instead"
        )
    return columns


def _input_model_of(fn: Callable[..., Any]) -> type[BaseModel]:
    hints = get_type_hints(fn)
    params = [p for p in fn.__code__.co_varnames[: fn.__code__.co_argcount]]
    if len(params) != 2:
        raise InvalidPlayInput(f"play {fn.__name__} must take (ctx, input)")
    model = hints.get(params[1])
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise InvalidPlayInput(
            f"play {fn.__name__}: annotate its input parameter with a pydantic model"
        )
    return model


def _output_type_of(fn: Callable[..., Any]) -> Any:
    """The play's output model from its return annotation (``Model``, ``Model | None``),
    ``None`` for ``-> None``, and ``Any`` when that says nothing more precise."""
    output = get_type_hints(fn).get("return", Any)
    if output is None or output is type(None):
        return None
    models = [a for a in get_args(output) if a is not type(None)] or [output]
    if len(models) == 1 and isinstance(models[0], type) and issubclass(models[0], BaseModel):
        return models[0]
    return Any


def registered_plays() -> dict[str, type[PlayWorkflow[Any, Any]]]:
    """Every play declared so far in this process, by workflow type name."""
    return dict(_PLAYS)
