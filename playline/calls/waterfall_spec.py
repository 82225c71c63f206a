"""What a waterfall is, as data: its steps, its accept rule, its validation, its policies.

A waterfall tries tools in order until one gives a value that is present, passes the
accept rule and (if a validation step is declared) is confirmed by a verifier. The
same spec comes from a catalog (``[waterfalls.NAME]``, so the order is configuration)
or from code (``rc.waterfall(steps=[...], ...)``); :mod:`playline.calls.waterfall`
runs it.

```toml
[waterfalls.work_email]
steps = ["mailfox_email", { tool = "prospectr_email", accept = { min = { score = 70 } } }]
value = "email"                                   # the getter every step's answer is read by
accept = { min = { confidence = 50 } }            # optional: thresholds and allowed statuses
validate = { tool = "verifly_verify", input = "email", field = "status", accept = ["valid"] }
on_unavailable = "skip"                           # or "wait": the row parks until it is back
max_credits = 5                                   # optional: a row's cap; dearer steps skipped
```
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, model_validator

from playline.spec_model import SpecModel

__all__ = [
    "STEP_OUTCOMES",
    "AcceptSpec",
    "StepOutcomeName",
    "StepSpec",
    "ValidateSpec",
    "WaterfallSpec",
]

#: What became of one waterfall step: one typed set shared by every tool (``unpaid``
#: only in an estimate: a step whose answer the run would pay for, weighed by chances).
StepOutcomeName = Literal[
    "hit",
    "no_match",
    "rejected",
    "invalid",
    "unavailable",
    "error",
    "skipped_budget",
    "skipped_condition",
    "skipped_input",
    "unpaid",
]
STEP_OUTCOMES: tuple[str, ...] = get_args(StepOutcomeName)


class AcceptSpec(SpecModel):
    """When a present value is good enough: every threshold met, every status allowed."""

    min: dict[str, float] = {}
    """`{getter = lowest acceptable number}`, e.g. `{confidence = 50}`; a missing or non-numeric
    value is refused"""
    status_in: dict[str, list[Any]] = {}
    """`{getter = [allowed values]}`, e.g. `{status = ["valid", "accept_all"]}`"""


class ValidateSpec(SpecModel):
    """A verifier called on each found value; a status outside ``accept`` is ``invalid``."""

    tool: str
    """the verifier tool (a `[tools.ID]` of the catalog)"""
    input: str = "email"
    """the verifier's input field that receives the value"""
    field: str = "status"
    """the getter of the verifier's answer holding its verdict"""
    accept: Annotated[list[Any], Field(min_length=1)] = ["valid"]
    """the verdicts that confirm the value; any other makes the step `invalid`"""


class StepSpec(SpecModel):
    """One step: a tool, how its input is built, and (optionally) its own accept rule."""

    tool: str
    """the step's tool (a `[tools.ID]` of the catalog)"""
    input: dict[str, str] | None = None
    """`{tool input field = waterfall input field}`; unset: the waterfall's input restricted to the
    fields the tool declares"""
    accept: AcceptSpec | None = None
    """this step's own accept rule, instead of the waterfall's `accept`"""


class WaterfallSpec(SpecModel):
    """A named waterfall of a catalog: tools tried in order until one gives an accepted value.

    See the module docstring for an example.
    """

    model_config = ConfigDict(populate_by_name=True)

    steps: Annotated[list[StepSpec], Field(min_length=1)]
    """the tools tried in order, each at most once: a tool id, or a table with the tool and its own
    `input` and `accept`"""
    value: str
    """the getter every step's answer is read by: the waterfall's value"""
    accept: AcceptSpec = AcceptSpec()
    """when a present value is good enough (every step without its own); the default accepts any
    present value"""
    validate_with: ValidateSpec | None = Field(default=None, alias="validate")
    """a verifier called on each accepted value; a verdict outside its `accept` makes the step
    `invalid` and the next step is tried"""
    on_unavailable: Literal["skip", "wait"] = "skip"
    """a step whose provider cannot take calls now (quota spent): "skip" tries the next step, "wait"
    parks the row until the provider is back"""
    max_credits: Annotated[float | None, Field(ge=0)] = None
    """a row's cap in credits: a step whose worst case would pass it is skipped
    (`skipped_budget`)"""

    @model_validator(mode="before")
    @classmethod
    def _steps_by_name(cls, data: Any) -> Any:
        """A step may be written as its tool id alone."""
        if isinstance(data, dict) and isinstance(data.get("steps"), list):
            steps = [{"tool": s} if isinstance(s, str) else s for s in data["steps"]]
            data = {**data, "steps": steps}
        return data

    @model_validator(mode="after")
    def _distinct_steps(self) -> WaterfallSpec:
        tools = [step.tool for step in self.steps]
        if len(set(tools)) != len(tools):
            raise ValueError(f"a waterfall names each tool once; steps were {tools}")
        return self

    def tools(self) -> list[str]:
        """Every tool the waterfall may call, the verifier included."""
        named = [step.tool for step in self.steps]
        return named + ([self.validate_with.tool] if self.validate_with is not None else [])
