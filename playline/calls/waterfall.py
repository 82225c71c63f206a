"""Running a waterfall: try each step's tool in order until one gives an accepted value.

Every step is an ordinary tool call (``call``: the row's ``rc.tool``), so it goes
through receipts and the governor like any other: a rerun answers each step from
its receipt and costs nothing, and a worker killed mid-waterfall repeats no paid
step (the steps before the kill are completed receipts; the one in flight is
settled by the receipt rules). Steps are tried one after another, never in
parallel: a later step is only paid for when the earlier ones missed.

What became of each step is one of :data:`~playline.calls.waterfall_spec.STEP_OUTCOMES`:

``hit``               a present value, accepted and (if declared) validated: the answer
``no_match``          the tool answered without the value
``rejected``          a value the accept rule refused (the reason says which rule)
``invalid``           a value the validation step refused (the verifier's verdict)
``unavailable``       the provider cannot take calls now (quota spent, blocked): with
                      ``on_unavailable = "skip"`` the next step is tried, with
                      ``"wait"`` the row parks and the whole waterfall is re-run after
                      the reset (the steps before are receipt hits, free)
``pending``           not an outcome: a step on an asynchronous (job) tool whose job
                      runs raises ``JobPending`` whatever ``on_unavailable`` says. The
                      job is submitted and will be billed, so the row parks and the
                      waterfall re-runs when the job is looked at again: that step then
                      answers from its job, and the next step is paid only on a miss
``error``             the call failed after its retries, or was ambiguous (may have
                      been charged, never re-sent): typed in the reason
``skipped_budget``    the step could cost more than the row's ``max_credits`` left
``skipped_condition`` the step's ``when`` said no for this row
``skipped_input``     the step's input leaves a required field of its tool blank
                      (missing, null, empty or whitespace-only; the reason names the
                      fields): nothing was claimed or sent, it cost nothing, and the
                      next step (whose input may be present) is tried
``unpaid``            only in an estimate: the run would pay for the step's answer,
                      so it gives the value (and ends the waterfall) with a chance, by
                      its tool's and the verifier's past answers

An estimate runs this same loop on its own call path
(:mod:`~playline.calls.estimate`): a step its receipts answer is exact, one the run
would pay for is weighed by chances. There the worst case counts every step that may
run: a ``when`` it cannot judge (an earlier step is only a chance, or it read an
unknown value) is taken as true, and a code step's ``input`` function that fails on
such values makes a dependent call whose input is unknown.

Errors that are about the chunk, not the step (a lost lease, a failed store write,
an unknown tool, a missing API key) stop the waterfall as they stop any call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from playline.calls.billing import is_present
from playline.calls.catalog import Catalog
from playline.calls.estimate import Unknown, UnpaidResult, watching_unknowns
from playline.calls.runner import CALL_REACH, ReceiptUse, ToolResult
from playline.calls.waterfall_spec import (
    AcceptSpec,
    StepOutcomeName,
    StepSpec,
    ValidateSpec,
    WaterfallSpec,
)
from playline.errors import (
    BlankInput,
    CallAmbiguous,
    FixtureMissing,
    InvalidPlayInput,
    JobPending,
    ProviderError,
    ProviderQuotaExhausted,
)

__all__ = ["Step", "StepResult", "WaterfallResult", "run_waterfall", "waterfall_of"]

#: ``input`` of a code step: a mapping, or a function of the row and the steps so far.
StepInput = Mapping[str, Any] | Callable[[Mapping[str, Any], list["StepResult"]], Mapping[str, Any]]
#: ``accept`` of a code step: a rule, or a function returning why a result is refused.
AcceptRule = AcceptSpec | Callable[[ToolResult], str | None]


class CallTool(Protocol):
    """``rc.tool``: one receipted, paced tool call."""

    def __call__(self, tool_id: str, input: Mapping[str, Any], /) -> Awaitable[ToolResult]: ...


@dataclass(frozen=True)
class Step:
    """A waterfall step written in code (a catalog writes :class:`StepSpec`).

    Args:
        tool: the catalog's tool id.
        input: the tool's input, or a function ``(row, earlier steps) -> input``;
            default: the waterfall's input restricted to the tool's input fields.
        accept: this step's accept rule (default: the waterfall's), or a function
            returning the reason a result is refused (``None``: accepted).
        when: ``(row, earlier steps) -> bool``; False skips the step.
    """

    tool: str
    input: StepInput | None = None
    accept: AcceptRule | None = None
    when: Callable[[Mapping[str, Any], list[StepResult]], bool] | None = None


@dataclass(frozen=True)
class StepResult:
    """What became of one step: its outcome, why, what it cost and how it was answered."""

    tool: str
    provider: str
    outcome: StepOutcomeName
    reason: str | None = None
    credits: float = 0.0
    receipt: ReceiptUse | None = None
    value: Any = None
    result: ToolResult | None = field(default=None, repr=False)
    #: ``unpaid`` (an estimate's): the chance the step gives the value and the chance
    #: it ends the waterfall; ``None`` for an outcome in hand
    odds: tuple[float, float] | None = field(default=None, repr=False)

    @property
    def found(self) -> float:
        """The chance this step gave the value (1 for a hit, 0 for any other outcome)."""
        return self.odds[0] if self.odds is not None else float(self.outcome == "hit")

    @property
    def stops(self) -> float:
        """The chance this step ended the waterfall."""
        return self.odds[1] if self.odds is not None else float(self.outcome == "hit")

    def provenance(self) -> dict[str, Any]:
        """The step as a cell's provenance records it (no value: that is the cell's)."""
        return {
            "tool": self.tool,
            "provider": self.provider,
            "outcome": self.outcome,
            "reason": self.reason,
            "credits": self.credits,
            "receipt": self.receipt,
        }


@dataclass(frozen=True)
class WaterfallResult:
    """A waterfall's answer: the value, the step that gave it, and every step's outcome."""

    name: str | None
    value: Any
    step: str | None
    steps: list[StepResult]
    #: the answering step's tool result (``None`` when no step answered)
    result: ToolResult | None = field(default=None, repr=False)

    @property
    def credits(self) -> float:
        """What every step (and validation) charged in this call."""
        return sum(step.credits for step in self.steps)

    @property
    def miss(self) -> str | None:
        """Why no value was found (``None`` when one was)."""
        if self.step is not None:
            return None
        if not self.steps:
            return "no step ran"
        return "; ".join(
            f"{s.tool}: {s.outcome}" + (f" ({s.reason})" if s.reason else "") for s in self.steps
        )

    def get(self, name: str, default: Any = None) -> Any:
        """A value of the answering step's result through its getters."""
        return default if self.result is None else self.result.get(name, default)


def _steps_of(spec: WaterfallSpec) -> list[Step]:
    return [_from_spec(step) for step in spec.steps]


def _from_spec(step: StepSpec) -> Step:
    renamed = None if step.input is None else _Renamed(step.input)
    return Step(step.tool, input=renamed, accept=step.accept)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Renamed:
    """A catalog step's ``input``: ``{tool field: waterfall input field}``."""

    mapping: Mapping[str, str]


async def run_waterfall(
    call: CallTool,
    catalog: Catalog,
    spec: WaterfallSpec,
    input: Mapping[str, Any],
    row: Mapping[str, Any],
    *,
    name: str | None = None,
    steps: list[Step] | None = None,
) -> WaterfallResult:
    """Run ``spec`` (its code ``steps`` if given) for one row; see the module docstring.

    Estimated, a step's answer may be unpaid (``unpaid``: it gives the value and ends
    the waterfall only with a chance), so each later step is tried with the chance
    (``reach``, its calls expected at that share of their price: ``CALL_REACH``) that
    every step before it missed, and the value is an ``Unknown`` holding the chance
    some step gives it. In a run every answer is in hand and ``reach`` stays 1.
    """
    done: list[StepResult] = []
    spent = 0.0
    reach = 1.0  # the chance the run tries this step
    found = 0.0  # the chance an earlier step gave the value
    for step in steps if steps is not None else _steps_of(spec):
        tool = catalog.tool(step.tool)
        sure = reach >= 1.0 and all(d.odds is None for d in done)
        if step.when is not None and not _when(step, row, done, sure):
            done.append(StepResult(tool.id, tool.provider, "skipped_condition"))
            continue
        worst = tool.max_credits + _validation_worst(catalog, spec)
        if spec.max_credits is not None and spent + worst > spec.max_credits + 1e-9:
            reason = f"may cost {worst:g}, {max(spec.max_credits - spent, 0):g} left"
            done.append(StepResult(tool.id, tool.provider, "skipped_budget", reason))
            continue
        token = CALL_REACH.set(reach)
        try:
            outcome = await _try_step(call, catalog, spec, step, input, row, done, sure)
        finally:
            CALL_REACH.reset(token)
        spent += outcome.credits
        done.append(outcome)
        if outcome.outcome == "hit":
            if reach >= 1.0:
                return WaterfallResult(name, outcome.value, tool.id, done, outcome.result)
            found += reach
            break  # an estimate's: no later step can run
        found += reach * outcome.found
        reach *= 1.0 - outcome.stops
    if found > 0.0:  # an estimate's: some step may give the value
        return WaterfallResult(name, Unknown(min(found, 1.0)), None, done)
    return WaterfallResult(name, None, None, done)


def _when(step: Step, row: Mapping[str, Any], done: list[StepResult], sure: bool) -> bool:
    """The step's ``when``; taken as true (the worst case) where an estimate cannot tell
    what it says in the run: an earlier step is only a chance, or it read an unknown."""
    assert step.when is not None
    if not sure:
        return True
    with watching_unknowns() as met:
        verdict = step.when(row, list(done))
    return bool(verdict) or met.any


def _validation_worst(catalog: Catalog, spec: WaterfallSpec) -> float:
    check = spec.validate_with
    return 0.0 if check is None else catalog.tool(check.tool).max_credits


def _step_input(
    step: Step,
    input: Mapping[str, Any],
    row: Mapping[str, Any],
    done: list[StepResult],
    declared: Mapping[str, str],
) -> Mapping[str, Any]:
    given = step.input
    if given is None:
        return {k: v for k, v in input.items() if k in declared} if declared else dict(input)
    if isinstance(given, _Renamed):
        return {tool_field: input.get(source) for tool_field, source in given.mapping.items()}
    if callable(given):
        return given(row, list(done))
    return given


async def _try_step(
    call: CallTool,
    catalog: Catalog,
    spec: WaterfallSpec,
    step: Step,
    input: Mapping[str, Any],
    row: Mapping[str, Any],
    done: list[StepResult],
    sure: bool = True,
) -> StepResult:
    tool = catalog.tool(step.tool)
    step_input = _input_of(step, tool.input, input, row, done, sure)
    try:
        result = await call(tool.id, step_input)
    except BlankInput as err:
        return StepResult(tool.id, tool.provider, "skipped_input", _blank(err))
    except JobPending:
        raise  # submitted (or queued): the row parks, never skips a step it pays for
    except ProviderQuotaExhausted as err:
        if spec.on_unavailable == "wait":
            raise
        return StepResult(tool.id, tool.provider, "unavailable", _unavailable(err))
    except CallAmbiguous as err:
        return StepResult(tool.id, tool.provider, "error", f"CallAmbiguous: {err}")
    except (ProviderError, FixtureMissing) as err:
        return StepResult(tool.id, tool.provider, "error", type(err).__name__)
    rule = step.accept if step.accept is not None else spec.accept
    if isinstance(result, UnpaidResult):
        return await _unpaid_step(call, spec, rule, result)
    value = result.get(spec.value)
    if not is_present(value):
        return StepResult(tool.id, tool.provider, "no_match", None, result.credits, result.receipt)
    refused = _refusal(rule, result)
    if refused is not None:
        return StepResult(
            tool.id, tool.provider, "rejected", refused, result.credits, result.receipt, value
        )
    credits = result.credits
    if spec.validate_with is not None:
        verdict, cost, odds = await _validate(call, spec.validate_with, value)
        credits += cost
        if odds is not None:  # an estimate's unpaid verdict: valid with a chance
            return StepResult(
                tool.id, tool.provider, "unpaid", None, credits, result.receipt, value, result, odds
            )
        if verdict is not None:
            return StepResult(
                tool.id, tool.provider, "invalid", verdict, credits, result.receipt, value
            )
    return StepResult(tool.id, tool.provider, "hit", None, credits, result.receipt, value, result)


def _input_of(
    step: Step,
    declared: Mapping[str, str],
    input: Mapping[str, Any],
    row: Mapping[str, Any],
    done: list[StepResult],
    sure: bool,
) -> Mapping[str, Any]:
    """The step's input. Estimated, a function of the earlier steps that fails where an
    earlier step is only a chance, or on an unknown value, gives an input that is not
    known (a dependent call); in a run its error stops the waterfall."""
    with watching_unknowns() as met:
        try:
            return _step_input(step, input, row, done, declared)
        except Exception:
            if sure and not met.any:
                raise
    return {name: Unknown() for name in declared} or {"input": Unknown()}


async def _unpaid_step(
    call: CallTool, spec: WaterfallSpec, rule: AcceptRule, result: UnpaidResult
) -> StepResult:
    """An estimate's step whose answer the run would pay for: the chance its tool's past
    answers hold an accepted value (and the verifier's past verdicts accept it) is the
    chance it gives the value; a tool (or verifier) with too little history is taken
    never to end the waterfall (the worst case for the steps after it)."""
    history = result.history
    assert history is not None
    found = result.scale * history.share(
        ("accepted", spec.value, repr(rule)),
        lambda answer: is_present(answer.get(spec.value)) and _refusal(rule, answer) is None,
    )
    stops = found if history.enough else 0.0
    check = spec.validate_with
    if check is not None and found > 0.0:
        # The verifier runs only on a found value: a dependent call, its input unknown.
        verdict, _, odds = await _validate(call, check, Unknown(found))
        valid, settles = odds if odds is not None else (float(verdict is None),) * 2
        found, stops = found * valid, stops * settles
    tool = result.tool
    return StepResult(
        tool.id, tool.provider, "unpaid", None, 0.0, result.receipt, None, result, (found, stops)
    )


def _blank(err: BlankInput) -> str:
    """A blank step's reason: the fields, never the row's values."""
    return "blank: " + ", ".join(err.fields)


def _unavailable(err: ProviderQuotaExhausted) -> str:
    return f"{err.provider} unavailable until {err.resume_at:.0f}"


def _refusal(rule: AcceptRule, result: ToolResult) -> str | None:
    """Why ``result`` is refused by ``rule``, or ``None``."""
    if callable(rule) and not isinstance(rule, AcceptSpec):
        return rule(result)
    for name, lowest in rule.min.items():
        got = result.get(name)
        if isinstance(got, bool) or not isinstance(got, int | float):
            return f"{name} missing"
        if got < lowest:
            return f"{name} {got:g} < {lowest:g}"
    for name, allowed in rule.status_in.items():
        got = result.get(name)
        if got not in allowed:
            return f"{name} {got!r} not in {allowed}"
    return None


async def _validate(
    call: CallTool, check: ValidateSpec, value: Any
) -> tuple[str | None, float, tuple[float, float] | None]:
    """The verifier's refusal (``None``: valid) and what the verification cost; for an
    estimate's unpaid verdict, the chance it accepts the value (by the verifier's past
    verdicts) and that chance again where the verifier's history is long enough to
    stop the waterfall on it (else 0)."""
    try:
        verdict = await call(check.tool, {check.input: value})
    except BlankInput as err:
        # Not verifiable (nothing sent, free): unverified is not accepted.
        return f"{check.tool} skipped_input ({_blank(err)})", 0.0, None
    except JobPending:
        raise  # a verifier on a job: the row parks until its answer is read
    except (ProviderError, CallAmbiguous, FixtureMissing) as err:
        # Unverified is not accepted: the next step may find a value that verifies.
        return f"{check.tool} failed: {type(err).__name__}", 0.0, None
    if isinstance(verdict, UnpaidResult):
        assert verdict.history is not None
        valid = verdict.history.share(
            ("valid", check.field, repr(check.accept)),
            lambda answer: answer.get(check.field) in check.accept,
        )
        return None, 0.0, (valid, valid if verdict.history.enough else 0.0)
    status = verdict.get(check.field)
    if status in check.accept:
        return None, verdict.credits, None
    return f"{check.field} {status}", verdict.credits, None


def waterfall_of(
    catalog: Catalog,
    name: str | None,
    steps: Sequence[str | Step] | None,
    *,
    value: str | None,
    accept: AcceptSpec | None = None,
    validate: ValidateSpec | None = None,
    on_unavailable: str = "skip",
    max_credits: float | None = None,
) -> tuple[WaterfallSpec, list[Step] | None]:
    """What ``rc.waterfall`` asks for: the catalog's waterfall ``name``, or ``steps``
    written in code reading ``value`` as a spec (for the rules) with their code steps;
    a one-line error else."""
    if steps is None:
        if name is None:
            raise InvalidPlayInput("rc.waterfall needs a catalog waterfall's name or steps")
        return catalog.waterfall(name), None
    if value is None:
        raise InvalidPlayInput("rc.waterfall(steps=...) needs value=: the getter to read")
    code_steps = [Step(s) if isinstance(s, str) else s for s in steps]
    spec = WaterfallSpec.model_validate(
        {
            "steps": [{"tool": s.tool} for s in code_steps],
            "value": value,
            "accept": accept or AcceptSpec(),
            "validate": validate,
            "on_unavailable": on_unavailable,
            "max_credits": max_credits,
        }
    )
    return spec, code_steps
