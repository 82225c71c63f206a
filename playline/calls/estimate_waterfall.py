"""Estimating a waterfall: every step that may run, each weighted by the chance it runs.

A waterfall (:mod:`playline.calls.waterfall`) tries its steps in order until one gives
an accepted (and, if declared, validated) value. Estimated, each step is one call of
the :class:`~playline.calls.estimate.EstimatingRunner`, counted under its own tool:

* the **worst case** counts every step and every validation that may run;
* the **expected** figure weights each step by the chance the run reaches it:
  ``P(reach next) = P(reach) x (1 - P(step accepted))``, where ``P(step accepted)`` is
  the share of the tool's past answers that hold the value and pass the accept rule,
  times the share of the verifier's past verdicts that are accepted; the validation
  is a dependent call (its input is the step's unpaid value), expected at
  ``P(reach) x P(value accepted)`` times its price; a step whose tool (or verifier)
  has too few receipts for a history is taken never to stop the waterfall, so the
  steps after it are expected in full (the worst case), and its value is taken to be
  found (the worst case for the calls that depend on it);
* a step a fresh receipt answers is exact: accepted (and validated) it stops the
  waterfall, free; refused, the next step is reached as surely as this one was.

Code steps' ``when`` conditions are taken as true (the worst case); a step whose
``input`` function fails is counted as a dependent call whose input is unknown; a step
whose input leaves a required field blank is skipped free, as the run skips it
(``skipped_input``), and the next step is reached as surely as it would have been. A
step dearer than the waterfall's ``max_credits`` on its own is skipped, as the run
skips it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from playline.calls.billing import is_present
from playline.calls.catalog import ToolSpec
from playline.calls.estimate import EstimatingRunner, Unknown, UnpaidResult
from playline.calls.runner import ToolResult
from playline.calls.waterfall import (
    Step,
    WaterfallResult,
    _refusal,
    _step_input,
    _steps_of,
    _validation_worst,
)
from playline.calls.waterfall_spec import WaterfallSpec
from playline.errors import BlankInput

__all__ = ["estimate_waterfall"]


async def estimate_waterfall(
    runner: EstimatingRunner,
    spec: WaterfallSpec,
    input: Mapping[str, Any],
    row: Mapping[str, Any],
    *,
    column: str,
    name: str | None = None,
    steps: list[Step] | None = None,
) -> WaterfallResult:
    """Count ``spec``'s steps for one row (see the module docstring). The value is the
    real one when receipts answer the waterfall for sure, else an ``Unknown`` whose ``p``
    is the chance some step gives one (``None``: no step can)."""
    reach = 1.0  # the chance the run tries this step
    found = 0.0  # the chance an earlier step gave the value
    validation_worst = _validation_worst(runner.catalog, spec)
    for step in steps if steps is not None else _steps_of(spec):
        tool = runner.catalog.tool(step.tool)
        if spec.max_credits is not None and (
            tool.max_credits + validation_worst > spec.max_credits + 1e-9
        ):
            continue  # skipped_budget in every row
        try:
            result = await runner.call(
                tool.id, _input_of(step, tool, input, row), column=column, reach=reach
            )
        except BlankInput:
            continue  # skipped_input: never sent, free; the next step is reached as surely
        chance = await _chance_accepted(runner, spec, step, result, column=column, reach=reach)
        if chance.exact and chance.stops >= 1.0:
            if reach >= 1.0:  # receipts answer the whole waterfall
                return WaterfallResult(name, result.get(spec.value), tool.id, [], result)
            found += reach
            break  # no later step can run
        found += reach * chance.found
        reach *= 1.0 - chance.stops
    return WaterfallResult(name, Unknown(min(found, 1.0)) if found > 0.0 else None, None, [])


def _input_of(
    step: Step, tool: ToolSpec, input: Mapping[str, Any], row: Mapping[str, Any]
) -> Mapping[str, Any]:
    """The step's input; a function of the earlier steps that fails on estimated ones
    gives an input that is not known."""
    try:
        return _step_input(step, input, row, [], tool.input)
    except Exception:
        return {name: Unknown() for name in tool.input} or {"input": Unknown()}


@dataclass(frozen=True, slots=True)
class _Chance:
    """What one step's answer does: the chance it gives the value (``found``; for the
    calls that depend on it), the chance it ends the waterfall (``stops``; a step
    whose tool or verifier has too little history is taken never to stop it, the
    worst case for the steps after it) and whether both are known (``exact``)."""

    found: float
    stops: float
    exact: bool = False


async def _chance_accepted(
    runner: EstimatingRunner,
    spec: WaterfallSpec,
    step: Step,
    result: ToolResult,
    *,
    column: str,
    reach: float,
) -> _Chance:
    """How likely this step's answer is accepted and validated."""
    rule = step.accept if step.accept is not None else spec.accept
    check = spec.validate_with
    if isinstance(result, UnpaidResult):
        assert result.history is not None
        found = result.scale * result.history.share(
            ("accepted", spec.value, repr(rule)),
            lambda answer: is_present(answer.get(spec.value)) and _refusal(rule, answer) is None,
        )
        stops = found if result.history.enough else 0.0
        if check is None or found <= 0.0:
            return _Chance(found, stops)
        value: Any = Unknown(found)  # the verifier runs only on a found value
    else:
        value = result.get(spec.value)
        if not is_present(value) or _refusal(rule, result) is not None:
            return _Chance(0.0, 0.0, exact=True)
        if check is None:
            return _Chance(1.0, 1.0, exact=True)
        found = stops = 1.0
    try:
        verdict = await runner.call(check.tool, {check.input: value}, column=column, reach=reach)
    except BlankInput:  # not verifiable, not sent: the step is invalid, the next one runs
        return _Chance(0.0, 0.0, exact=not isinstance(result, UnpaidResult))
    if isinstance(verdict, UnpaidResult):
        assert verdict.history is not None
        valid = verdict.history.share(
            ("valid", check.field, repr(check.accept)),
            lambda answer: answer.get(check.field) in check.accept,
        )
        return _Chance(found * valid, stops * valid if verdict.history.enough else 0.0)
    valid = 1.0 if verdict.get(check.field) in check.accept else 0.0
    exact = not isinstance(result, UnpaidResult)
    return _Chance(found * valid, stops * valid, exact=exact)
