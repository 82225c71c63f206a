"""The waterfall's rules, over a fake tool call: order, stop at the first accepted value,
each step's outcome, validation, budget, conditions and unavailable providers.

End to end (real Temporal, real HTTP, the provider's ledger) in
``tests/e2e/test_waterfalls.py``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from playline.calls.catalog import Catalog
from playline.calls.provenance import ColumnCalls, cell_provenance, tally
from playline.calls.runner import ToolResult
from playline.calls.waterfall import Step, run_waterfall, waterfall_of
from playline.calls.waterfall_spec import AcceptSpec, ValidateSpec, WaterfallSpec
from playline.contract import ChunkStats
from playline.errors import ProviderQuotaExhausted, ProviderTransientError
from playline.spend import spend_lines

CATALOG = Catalog.model_validate(
    {
        "providers": {
            "pa": {"base_url": "http://127.0.0.1:1"},
            "pb": {"base_url": "http://127.0.0.1:1"},
            "pv": {"base_url": "http://127.0.0.1:1"},
        },
        "tools": {
            "a": {
                "provider": "pa",
                "path": "/a",
                "input": {"name": "str"},
                "getters": {"email": "email", "confidence": "score"},
                "billing": {"rule": "per_hit", "credits": 1, "hit": "email"},
            },
            "b": {
                "provider": "pb",
                "path": "/b",
                "input": {"name": "str", "domain": "str?"},
                "getters": {"email": "mail"},
                "credits": 2,
            },
            "v": {"provider": "pv", "path": "/v", "input": {"email": "str"}, "credits": 0.5},
        },
        "waterfalls": {"work": {"steps": ["a", "b"], "value": "email"}},
    }
)


class FakeCalls:
    """Answers each tool from a table and records what was called with what."""

    def __init__(self, answers: Mapping[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.made: list[ToolResult] = []

    async def __call__(self, tool_id: str, input: Mapping[str, Any]) -> ToolResult:
        self.calls.append((tool_id, dict(input)))
        answer = self.answers[tool_id]
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            answer = answer(input)
        tool = CATALOG.tool(tool_id)
        charge = tool.charge(answer)
        result = ToolResult(tool, answer, False, "paid", charge.credits, "rule", time.time())
        self.made.append(result)
        return result


async def _run(calls: FakeCalls, spec: WaterfallSpec, steps: Any = None) -> Any:
    return await run_waterfall(
        calls, CATALOG, spec, {"name": "ada", "domain": "x.io"}, {}, name="w", steps=steps
    )


async def test_the_first_accepted_value_wins_and_later_steps_are_never_called() -> None:
    calls = FakeCalls({"a": {"email": "ada@x.io", "score": 90}, "b": {"mail": "no@x.io"}})
    result = await _run(calls, CATALOG.waterfall("work"))
    assert (result.value, result.step) == ("ada@x.io", "a")
    assert [c[0] for c in calls.calls] == ["a"]
    assert [s.outcome for s in result.steps] == ["hit"]
    assert result.credits == 1 and result.miss is None


async def test_a_miss_moves_on_and_each_step_says_what_it_cost() -> None:
    calls = FakeCalls({"a": {"email": None}, "b": {"mail": "ada@x.io"}})
    result = await _run(calls, CATALOG.waterfall("work"))
    assert (result.value, result.step) == ("ada@x.io", "b")
    assert [(s.tool, s.outcome, s.credits) for s in result.steps] == [
        ("a", "no_match", 0.0),
        ("b", "hit", 2.0),
    ]
    # Each step got the waterfall's input restricted to the fields the tool declares.
    assert calls.calls == [("a", {"name": "ada"}), ("b", {"name": "ada", "domain": "x.io"})]


async def test_no_step_found_a_value_and_the_miss_says_why() -> None:
    calls = FakeCalls(
        {"a": {"email": ""}, "b": ProviderTransientError("b: 500", tool_id="b", status=500)}
    )
    result = await _run(calls, CATALOG.waterfall("work"))
    assert result.value is None and result.step is None
    assert result.miss == "a: no_match; b: error (ProviderTransientError)"


async def test_the_accept_rule_rejects_with_its_reason() -> None:
    spec, steps = waterfall_of(
        CATALOG, None, ["a", "b"], value="email", accept=AcceptSpec(min={"confidence": 50})
    )
    calls = FakeCalls({"a": {"email": "lo@x.io", "score": 20}, "b": {"mail": "ok@x.io"}})
    result = await _run(calls, spec, steps)
    assert result.steps[0].outcome == "rejected"
    assert result.steps[0].reason == "confidence 20 < 50"
    # b has no confidence getter at all: the same rule refuses it, saying so.
    assert result.steps[1].outcome == "rejected" and result.steps[1].reason == "confidence missing"


async def test_a_found_but_invalid_value_moves_on_and_the_verification_is_counted() -> None:
    verdicts = {"bad@x.io": "invalid", "good@x.io": "valid"}
    spec, steps = waterfall_of(
        CATALOG, None, ["a", "b"], value="email", validate=ValidateSpec(tool="v")
    )
    calls = FakeCalls(
        {
            "a": {"email": "bad@x.io"},
            "b": {"mail": "good@x.io"},
            "v": lambda i: {"status": verdicts[i["email"]]},
        }
    )
    result = await _run(calls, spec, steps)
    assert [(s.outcome, s.reason, s.credits) for s in result.steps] == [
        ("invalid", "status invalid", 1.5),
        ("hit", None, 2.5),
    ]
    assert result.value == "good@x.io"


async def test_unavailable_providers_are_skipped_or_waited_for_by_policy() -> None:
    blocked = ProviderQuotaExhausted("pa", time.time() + 60, tool_id="a")
    calls = FakeCalls({"a": blocked, "b": {"mail": "ada@x.io"}})
    result = await _run(calls, CATALOG.waterfall("work"))
    assert [s.outcome for s in result.steps] == ["unavailable", "hit"]
    spec, steps = waterfall_of(CATALOG, None, ["a", "b"], value="email", on_unavailable="wait")
    with pytest.raises(ProviderQuotaExhausted):
        await _run(FakeCalls({"a": blocked, "b": {"mail": "x"}}), spec, steps)


async def test_a_step_over_the_rows_budget_or_its_condition_is_skipped_unpaid() -> None:
    spec, steps = waterfall_of(
        CATALOG,
        None,
        ["a", Step("b", when=lambda row, earlier: False)],
        value="email",
        max_credits=0.5,
    )
    calls = FakeCalls({"a": {"email": "x"}, "b": {"mail": "y"}})
    result = await _run(calls, spec, steps)
    assert [s.outcome for s in result.steps] == ["skipped_budget", "skipped_condition"]
    assert calls.calls == []


async def test_a_code_step_input_can_use_the_earlier_steps() -> None:
    seen: list[Any] = []

    def later(row: Mapping[str, Any], earlier: list[Any]) -> dict[str, Any]:
        seen.append([s.outcome for s in earlier])
        return {"name": "from-code"}

    spec, steps = waterfall_of(CATALOG, None, ["a", Step("b", input=later)], value="email")
    calls = FakeCalls({"a": {"email": None}, "b": {"mail": "z@x.io"}})
    await _run(calls, spec, steps)
    assert seen == [["no_match"]] and calls.calls[1] == ("b", {"name": "from-code"})


async def test_provenance_and_tally_of_a_waterfall_cell() -> None:
    calls = FakeCalls({"a": {"email": None}, "b": {"mail": "ada@x.io"}})
    result = await _run(calls, CATALOG.waterfall("work"))
    cell = cell_provenance(ColumnCalls(calls.made, [result]), result.value)
    assert cell["tool"] == "b" and cell["provider"] == "pb" and cell["receipt"] == "paid"
    assert cell["credits"] == 2.0 and cell["by_provider"] == {"pb": 2.0}
    assert [s["outcome"] for s in cell["steps"]] == ["no_match", "hit"]
    missed = await _run(
        FakeCalls({"a": {"email": None}, "b": {"mail": None}}), CATALOG.waterfall("work")
    )
    empty = cell_provenance(ColumnCalls([], [missed]), None)
    assert empty["miss"] == "a: no_match; b: no_match" and empty["tool"] is None
    spend = tally([{"work_email": cell}, {"work_email": empty}]).as_dict()
    assert spend["by_provider"] == {"pb": 2.0} and spend["steps"] == {
        "work_email": {"b": 1, "none": 1}
    }
    lines = spend_lines(spend)
    assert lines[-2] == "work_email: b 50 %, none 50 %; 1.00 credits/row"
    assert lines[-1] == (
        "work_email by step: a hit 0 % of 2, 0 credits, no hit; b hit 50 % of 2, 4.00 credits/hit"
    )


async def test_chunk_stats_add_their_spend_as_one_tally_would() -> None:
    calls = FakeCalls({"a": {"email": None}, "b": {"mail": "ada@x.io"}})
    hit = await _run(calls, CATALOG.waterfall("work"))
    cell = cell_provenance(ColumnCalls(calls.made, [hit]), hit.value)
    one, two = {"work_email": cell}, {"work_email": cell, "other": cell}
    merged = ChunkStats(spend=tally([one]).as_dict())
    merged.add(ChunkStats(spend=tally([two]).as_dict()))
    merged.add(ChunkStats())
    assert merged.spend == tally([one, two]).as_dict()
