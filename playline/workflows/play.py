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

For type checkers the class is a ``PlayWorkflow[Input, Output]`` whose ``run`` takes
the play's input model and returns ``PlayRunResult[Output]``, so
``playline.start_play(client, enrich_leads, EnrichLeadsInput(...))`` and
``client.execute_workflow(enrich_leads.run, ...)`` are checked end to end. At run
time the workflow still decodes its input as plain JSON and validates it itself
(see ``play``), and clients decode the result with the play's output model.
"""

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_args, get_type_hints

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from playline.contract import PlayRunResult, PlayState, RunOptions
    from playline.errors import InvalidPlayInput, format_validation_errors
    from playline.workflows.context import PlayContext
    from playline.workflows.failures import as_failure

InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT", bound=BaseModel | None)
PlayFn = Callable[[PlayContext, Any], Awaitable[BaseModel | None]]


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


_PLAYS: dict[str, type[PlayWorkflow[Any, Any]]] = {}


def play(
    name: str | None = None, *, input_model: type[BaseModel] | None = None
) -> Callable[
    [Callable[[PlayContext, InputT], Awaitable[OutputT]]], type[PlayWorkflow[InputT, OutputT]]
]:
    """Declare a play: ``name`` is its workflow type (default: the function's name).

    The input model is the annotation of the function's second parameter unless
    ``input_model`` is given; the output is its return annotation (a pydantic
    model, or ``None``).
    """

    def decorate(
        fn: Callable[[PlayContext, InputT], Awaitable[OutputT]],
    ) -> type[PlayWorkflow[InputT, OutputT]]:
        play_name = name or fn.__name__
        model = input_model or _input_model_of(fn)
        output = _output_type_of(fn)

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
