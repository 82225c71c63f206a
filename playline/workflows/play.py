"""``@play``: declare a play; each play becomes its own Temporal workflow type.

```python
@play(name="enrich_leads")
async def enrich_leads(ctx: PlayContext, input: EnrichLeadsInput) -> EnrichLeadsOutput:
    leads = await ctx.csv("leads", input.csv_path, required_columns=["email"])
    ...
```

The decorator returns a workflow class that stands in the module under the
function's name, which is what lets Temporal's sandbox re-import it. The workflow
takes ``(input, options: RunOptions | None)`` and returns a ``PlayRunResult``: the
play's own (small) output plus the run's accounting.
"""

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from playline.contract import PlayRunResult, PlayState, RunOptions
    from playline.errors import InvalidPlayInput, format_validation_errors
    from playline.workflows.context import PlayContext
    from playline.workflows.failures import as_failure

InputT = TypeVar("InputT", bound=BaseModel)
PlayFn = Callable[[PlayContext, Any], Awaitable[BaseModel | None]]

_PLAYS: dict[str, type] = {}


class PlayWorkflow:
    """Base of every generated play workflow: runs the play function with a context."""

    play_name: str = ""
    play_fn: PlayFn
    input_model: type[BaseModel]

    def __init__(self) -> None:
        self._ctx: PlayContext | None = None

    async def _execute(self, raw_input: Any, options: RunOptions | None) -> PlayRunResult:
        options = options or RunOptions()
        try:
            play_input = self.input_model.model_validate(raw_input if raw_input is not None else {})
        except ValidationError as err:
            problems = format_validation_errors(err.errors())
            raise ApplicationError(
                f"invalid input for play {self.play_name!r}: {problems}",
                type="InvalidPlayInput",
                non_retryable=True,
            ) from None
        ctx = self._ctx = PlayContext(self.play_name, options)
        if options.integration_mode == "fixture":
            ctx.log(
                "Fixture mode: provider pacing explicitly enforced for production-parity testing."
                if options.enforce_fixture_pacing
                else "Fixture mode: provider pacing bypassed because no provider request is "
                "dispatched."
            )
        ctx.state.phase = "running"
        try:
            output = await type(self).play_fn(ctx, play_input)
        except (ActivityError, ChildWorkflowError) as err:
            # The play's failure says what went wrong (the root cause's type and
            # message), not "Activity task failed".
            ctx.state.phase = "failed"
            raise as_failure(err) from err
        ctx.state.phase = "completed"
        return PlayRunResult(
            play=self.play_name,
            output=output.model_dump(mode="json") if output is not None else None,
            datasets=[d.model_copy(update={"rows": None}) for d in ctx.datasets],
            stats=ctx.stats,
            integration_mode=options.integration_mode,
        )

    def _state(self) -> PlayState:
        if self._ctx is None:
            return PlayState(play=self.play_name)
        return self._ctx.state


def play(
    name: str | None = None, *, input_model: type[BaseModel] | None = None
) -> Callable[[PlayFn], type[PlayWorkflow]]:
    """Declare a play: ``name`` is its workflow type (default: the function's name).

    The input model is the annotation of the function's second parameter unless
    ``input_model`` is given.
    """

    def decorate(fn: PlayFn) -> type[PlayWorkflow]:
        play_name = name or fn.__name__
        model = input_model or _input_model_of(fn)

        async def run(self: PlayWorkflow, input: Any, options: RunOptions | None = None) -> Any:
            return await self._execute(input, options)

        def state(self: PlayWorkflow) -> PlayState:
            return self._state()

        # Temporal wants module-level names; the class stands in the module under
        # the function's name, so give its methods matching qualified names.
        run.__qualname__ = f"{fn.__qualname__}.run"
        state.__qualname__ = f"{fn.__qualname__}.state"
        run.__module__ = state.__module__ = fn.__module__
        # The input is decoded as plain JSON and validated by ``_execute``: a typed
        # parameter would turn a bad input into a workflow *task* failure, retried
        # forever, instead of a failed play whose message says what is wrong.
        run.__annotations__ = {
            "input": Any,
            "options": RunOptions | None,
            "return": PlayRunResult,
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
                "__qualname__": fn.__qualname__,
                "__module__": fn.__module__,
                "__doc__": fn.__doc__,
                "__playline_play__": play_name,
            },
        )
        defined = workflow.defn(name=play_name)(Play)
        if not workflow.unsafe.in_sandbox():
            _PLAYS[play_name] = defined
        return defined

    return decorate


def _input_model_of(fn: PlayFn) -> type[BaseModel]:
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


def registered_plays() -> dict[str, type]:
    """Every play declared so far in this process, by workflow type name."""
    return dict(_PLAYS)
