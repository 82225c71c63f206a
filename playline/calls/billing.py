"""How a tool bills, and what one answer cost.

Real providers do not charge a constant per request: Findymail and Hunter charge
only when they find an email, FullEnrich a price per field found, Dropcontact takes a
credit and gives it back on a miss, Apollo's bulk match charges only the members it
matched, Prospeo marks re-enrichments it does not bill, and some report the charge
in a header or a body field. A tool's ``billing`` in the catalog says which; this
module turns an answer into the credits it cost and says where the figure came from:

* ``"provider"``: the provider reported the charge (``charged_header`` or
  ``charged_field``), which wins over any rule;
* ``"rule"``: computed from the catalog's rule.

For a bulk tool the rule applies to each member's result; a reported figure is the
request's total and is spread over the members in proportion to what the rule says
each cost (evenly when the rule says nothing), so the members add up to it.

The rules (``credits`` defaults to the tool's ``credits``):

===================  ===========================================================
``per_request``      ``credits`` for every answer (the default)
``per_hit``          ``credits`` when the ``hit`` value is present, else 0
``refund_on_miss``   ``credits`` charged, refunded when ``hit`` is absent: the
                     same net figure as ``per_hit``, named as the provider bills
``per_field``        the sum of ``fields[name]`` over the values present
===================  ===========================================================

``free_if`` names a value that, when truthy, makes the answer free (Prospeo's
``free_enrichment``). A value is *present* unless it is ``None``, ``""``, ``[]``
or ``{}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from playline.freshness import is_present
from playline.spec_model import SpecModel

__all__ = [
    "BillingRule",
    "BillingSpec",
    "Charge",
    "CreditsSource",
    "bulk_charges",
    "is_present",
    "parse_reported",
    "single_charge",
]

BillingRule = Literal["per_request", "per_hit", "refund_on_miss", "per_field"]
#: Where a receipt's credit figure came from.
CreditsSource = Literal["provider", "rule"]

#: Reads a named value from a result through the tool's getters (``ToolSpec.get``).
Getter = Callable[[Any, str], Any]


class BillingSpec(SpecModel):
    """A tool's billing rule, and where its provider reports the charge (if it does)."""

    rule: BillingRule = "per_request"
    """"per_request": `credits` for every answer; "per_hit": `credits` when the `hit` value is
    present, else 0; "refund_on_miss": charged, refunded when `hit` is absent (the same net figure
    as per_hit); "per_field": the sum of `fields` over the values present"""
    credits: Annotated[float | None, Field(ge=0)] = None
    """the price of a request (per_request) or a hit; unset: the tool's `credits`"""
    hit: str | None = None
    """the value (a getter name or a dotted path) whose presence makes an answer a hit (needed by
    per_hit and refund_on_miss)"""
    fields: dict[str, float] = {}
    """per_field only: the price of each value (getter name or dotted path) present in an answer"""
    free_if: str | None = None
    """a value that, when truthy, means the provider did not bill this answer"""
    charged_header: str | None = None
    """a response header holding the credits the provider charged for the request; a reported figure
    wins over the rule"""
    charged_field: str | None = None
    """a field of the response body (dotted path) holding the credits charged (the header wins when
    both are given)"""

    @model_validator(mode="after")
    def _check_rule(self) -> BillingSpec:
        if self.rule in ("per_hit", "refund_on_miss") and not self.hit:
            raise ValueError(f"billing rule {self.rule!r} needs 'hit': the value that makes a hit")
        if self.rule == "per_field":
            if not self.fields:
                raise ValueError("billing rule 'per_field' needs 'fields': a price per value")
            if any(price < 0 for price in self.fields.values()):
                raise ValueError("billing 'fields' prices must be 0 or more")
        elif self.fields:
            raise ValueError(
                f"billing 'fields' only applies to rule 'per_field', not {self.rule!r}"
            )
        return self

    def price(self, tool_credits: float) -> float:
        """The price of a request or a hit under this rule."""
        return tool_credits if self.credits is None else self.credits

    def worst_case(self, tool_credits: float) -> float:
        """The most one answer (or bulk member) can cost under the rule."""
        if self.rule == "per_field":
            return float(sum(self.fields.values()))
        return self.price(tool_credits)


@dataclass(frozen=True, slots=True)
class Charge:
    """What one answer cost, and where the figure came from."""

    credits: float
    source: CreditsSource = "rule"


def rule_credits(spec: BillingSpec, tool_credits: float, result: Any, get: Getter) -> float:
    """What the catalog's rule says one result (or one bulk member's) cost."""
    if spec.free_if is not None and get(result, spec.free_if):
        return 0.0
    if spec.rule == "per_request":
        return spec.price(tool_credits)
    if spec.rule == "per_field":
        return float(sum(p for name, p in spec.fields.items() if is_present(get(result, name))))
    assert spec.hit is not None
    return spec.price(tool_credits) if is_present(get(result, spec.hit)) else 0.0


def parse_reported(value: Any) -> float | None:
    """A reported charge as a number of credits, or ``None`` when it is not one."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _reported(spec: BillingSpec, response: Any, header: float | None, get: Getter) -> float | None:
    """The provider's own figure: the header wins, then the body field."""
    if header is not None:
        return header
    if spec.charged_field is not None:
        return parse_reported(get(response, spec.charged_field))
    return None


def single_charge(
    spec: BillingSpec, tool_credits: float, result: Any, header: float | None, get: Getter
) -> Charge:
    """The charge for a single call's answer."""
    reported = _reported(spec, result, header, get)
    if reported is not None:
        return Charge(reported, "provider")
    return Charge(rule_credits(spec, tool_credits, result, get), "rule")


def bulk_charges(
    spec: BillingSpec,
    tool_credits: float,
    response: Any,
    members: Sequence[Any],
    header: float | None,
    get: Getter,
) -> tuple[list[float], CreditsSource]:
    """Each member's share of a bulk request's charge, and where the figure came from.

    A reported total is spread over the members in proportion to the rule's figures
    (evenly if the rule says every member was free), the last member taking what
    rounding leaves, so the shares add up to the provider's figure exactly.
    """
    by_rule = [rule_credits(spec, tool_credits, member, get) for member in members]
    total = _reported(spec, response, header, get)
    if total is None or not members:
        return by_rule, "rule"
    weights = by_rule if sum(by_rule) > 0 else [1.0] * len(members)
    weight_sum = sum(weights)
    shares = [total * w / weight_sum for w in weights[:-1]]
    shares.append(total - sum(shares))
    return shares, "provider"
