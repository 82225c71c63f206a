"""The estimate's arithmetic: Unknown values, tool histories, counting, waterfalls, tallies.

Pure logic: the receipt store is a small in-memory reader (what an estimate reads of a
store, nothing more); the end-to-end tests run it against the real stores and server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import pytest

from playline import resolver
from playline.activities.chunk import RowCall
from playline.activities.estimate import ChunkEstimate, met_unpaid
from playline.calls.catalog import Catalog
from playline.calls.estimate import Estimator, ToolHistory, Unknown, counting_for, unknown_p
from playline.calls.estimate_tally import Estimate, EstimateTally
from playline.calls.runner import CALL_REACH, ToolResult
from playline.calls.waterfall import Step, WaterfallResult, run_waterfall
from playline.calls.waterfall_spec import WaterfallSpec
from playline.contract import ChunkInput, ColumnSpec, RunOptions, merge_spend
from playline.stores.receipts import Receipt, receipt_key
from playline.stores.sheet import RunRow

SCOPE = "scope"
CATALOG = Catalog.model_validate(
    {
        "providers": {name: {"base_url": "http://127.0.0.1:1"} for name in ("p1", "p2", "v")},
        "tools": {
            "finder": {
                "provider": "p1",
                "path": "/find",
                "input": {"name": "str"},
                "getters": {"email": "email", "score": "score"},
                "billing": {"rule": "per_hit", "credits": 1, "hit": "email"},
            },
            "dear": {
                "provider": "p2",
                "path": "/dear",
                "input": {"name": "str"},
                "getters": {"email": "email"},
                "credits": 2.0,
            },
            "verify": {
                "provider": "v",
                "path": "/verify",
                "input": {"email": "str"},
                "getters": {"status": "status"},
                "credits": 0.5,
            },
        },
        "waterfalls": {
            "email": {
                "steps": ["finder", "dear"],
                "value": "email",
                "validate": {"tool": "verify", "input": "email", "field": "status"},
            },
            "unchecked": {"steps": ["finder", "dear"], "value": "email"},
        },
    }
)


class Reader:
    """What an estimate reads of a receipt store: ``get`` (counted) and ``sample``."""

    def __init__(self) -> None:
        self.receipts: dict[str, Receipt] = {}
        self.samples: dict[str, list[tuple[Any, float | None]]] = {}
        self.gets: list[list[str]] = []

    def complete(
        self, tool: str, payload: dict[str, Any], result: Any, *, at: float = 100.0
    ) -> str:
        key = receipt_key(tool, "1", payload, SCOPE)
        self.receipts[key] = Receipt(
            key, tool, "completed", result, None, None, None, None, at, 1, 1.0
        )
        return key

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        self.gets.append(list(keys))
        return {k: self.receipts[k] for k in keys if k in self.receipts}

    async def sample(self, tool_id: str, limit: int = 1000) -> list[tuple[Any, float | None]]:
        return self.samples.get(tool_id, [])[:limit]


class Counting(Estimator):
    """An estimate's call path, called here as a column's resolver (or a waterfall's
    step, reached with chance ``reach``) would call it."""

    async def call(
        self,
        tool_id: str,
        tool_input: Mapping[str, Any],
        *,
        column: str = "",
        reach: float = 1.0,
        force: bool = False,
        stale_after_seconds: float | None = None,
    ) -> ToolResult:
        token = CALL_REACH.set(reach)
        try:
            with counting_for(column):
                return await self.runner.call(
                    tool_id, tool_input, force=force, stale_after_seconds=stale_after_seconds
                )
        finally:
            CALL_REACH.reset(token)


def runner(reader: Reader, *, now: float = 1000.0) -> Counting:
    return Counting(CATALOG, reader, lambda tool: SCOPE, clock=lambda: now)


async def estimate_waterfall(
    counting: Estimator,
    spec: WaterfallSpec,
    input: Mapping[str, Any],
    row: Mapping[str, Any],
    *,
    column: str,
    name: str | None = None,
    steps: list[Step] | None = None,
) -> WaterfallResult:
    """The run's waterfall loop on an estimate's call path, counted under ``column``."""
    with counting_for(column):
        return await run_waterfall(
            counting.runner.call, counting.catalog, spec, input, row, name=name, steps=steps
        )


def line(tally: EstimateTally, column: str, tool: str) -> dict[str, Any]:
    (found,) = [figures for provider, figures in tally.as_dict()["lines"][column][tool].items()]
    return found


# -- Unknown ---------------------------------------------------------------------


def test_an_unknown_is_truthy_prints_as_unknown_and_refuses_string_methods() -> None:
    value = Unknown(0.4)
    assert value and bool(value) is True
    assert str(value) == "<unknown>" and f"{value}" == "<unknown>"
    assert value["name"] is value and value.get("x") is value
    with pytest.raises(AttributeError):
        value.lower()  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        value + 1  # type: ignore[operator]


def test_unknown_p_is_the_smallest_chance_anywhere_in_an_input() -> None:
    assert unknown_p({"a": "x", "b": 1}) is None
    assert unknown_p({"a": Unknown(0.7), "b": [1, {"c": Unknown(0.2)}]}) == 0.2
    assert unknown_p(Unknown()) == 1.0


# -- history ---------------------------------------------------------------------


def test_with_too_few_receipts_a_tool_is_priced_at_its_worst_case() -> None:
    tool = CATALOG.tool("dear")
    history = ToolHistory(tool, [({"email": "a@x"}, 2.0)] * 19)
    assert not history.enough and history.basis == "worst case"
    assert history.price == 2.0 and history.p("email") == 1.0


def test_with_enough_receipts_the_price_is_the_mean_charge_and_p_the_share_found() -> None:
    tool = CATALOG.tool("finder")
    samples = [({"email": "a@x"}, 1.0)] * 5 + [({"email": ""}, 0.0)] * 15
    history = ToolHistory(tool, samples)
    assert history.enough and history.basis == "receipts"
    assert history.price == pytest.approx(0.25)
    assert history.p("email") == pytest.approx(0.25)
    assert history.p("score") == 0.0


# -- counting ----------------------------------------------------------------------


async def test_a_fresh_receipt_answers_for_free_and_identical_calls_count_once() -> None:
    reader = Reader()
    reader.complete("finder", {"name": "ada"}, {"email": "ada@x"})
    counting = runner(reader)
    results = await asyncio.gather(
        *(counting.call("finder", {"name": name}, column="c") for name in ["ada", "ada", "bob"])
    )
    assert results[0].get("email") == "ada@x" and results[0].receipt == "reused"
    assert isinstance(results[2].get("email"), Unknown)
    assert len(reader.gets) == 1  # one read for the calls of one event-loop tick
    figures = line(counting.tally, "c", "finder")
    assert (figures["calls"], figures["cached"], figures["to_pay"]) == (2, 1, 1)
    assert figures["worst_credits"] == 1.0 and figures["basis"] == "worst case"


async def test_a_stale_or_forced_receipt_is_a_call_to_pay() -> None:
    reader = Reader()
    reader.complete("finder", {"name": "ada"}, {"email": "ada@x"}, at=100.0)
    counting = runner(reader, now=1000.0)
    await counting.call("finder", {"name": "ada"}, column="stale", stale_after_seconds=60)
    fresh = runner(reader, now=1000.0)
    await fresh.call("finder", {"name": "ada"}, column="forced", force=True)
    await fresh.call("finder", {"name": "ada"}, column="young", stale_after_seconds=10_000)
    assert line(counting.tally, "stale", "finder")["to_pay"] == 1
    assert line(fresh.tally, "forced", "finder")["to_pay"] == 1
    assert "young" not in fresh.tally.as_dict()["lines"]  # counted once, as forced


async def test_a_dependent_call_with_unknown_input_is_not_looked_up_and_costs_p_times_price() -> (
    None
):
    reader = Reader()
    reader.samples["verify"] = [({"status": "valid"}, 0.5)] * 20
    counting = runner(reader)
    answer = await counting.call("verify", {"email": Unknown(0.3)}, column="v")
    assert reader.gets == []
    assert isinstance(answer.get("status"), Unknown)
    assert answer.get("status").p == pytest.approx(0.3)
    figures = line(counting.tally, "v", "verify")
    assert (figures["to_pay"], figures["unknown_input"]) == (0, 1)
    assert figures["worst_credits"] == 0.5
    assert figures["expected_credits"] == pytest.approx(0.3 * 0.5)


async def test_a_call_met_again_more_likely_raises_its_expected_figure_once() -> None:
    reader = Reader()
    counting = runner(reader)
    await counting.call("dear", {"name": "ada"}, column="c", reach=0.25)
    await counting.call("dear", {"name": "ada"}, column="c", reach=1.0)
    await counting.call("dear", {"name": "ada"}, column="c", reach=0.5)
    figures = line(counting.tally, "c", "dear")
    assert figures["to_pay"] == 1 and figures["worst_credits"] == 2.0
    assert figures["expected_credits"] == pytest.approx(2.0)


# -- waterfalls --------------------------------------------------------------------


async def test_without_history_every_step_and_validation_counts_at_the_worst_case() -> None:
    counting = runner(Reader())
    result = await estimate_waterfall(
        counting, CATALOG.waterfall("email"), {"name": "ada"}, {}, column="w", name="email"
    )
    assert isinstance(result.value, Unknown)
    tally = counting.tally
    assert line(tally, "w", "finder")["to_pay"] == 1
    assert line(tally, "w", "dear")["to_pay"] == 1
    assert line(tally, "w", "verify")["unknown_input"] == 2
    total = Estimate.from_tally(tally.as_dict(), play="p").total
    assert total.worst_credits == pytest.approx(1 + 2 + 2 * 0.5)
    assert total.expected_credits == pytest.approx(total.worst_credits)


async def test_expected_waterfall_credits_weigh_each_step_by_the_chance_it_runs() -> None:
    reader = Reader()
    # finder: 40 % found at 1 credit each; 75 % of what verify saw was valid.
    reader.samples["finder"] = [({"email": "a@x"}, 1.0)] * 8 + [({}, 0.0)] * 12
    reader.samples["dear"] = [({"email": "b@x"}, 2.0)] * 10 + [({}, 2.0)] * 10
    reader.samples["verify"] = [({"status": "valid"}, 0.5)] * 15 + [({"status": "bad"}, 0.5)] * 5
    counting = runner(reader)
    result = await estimate_waterfall(
        counting, CATALOG.waterfall("email"), {"name": "ada"}, {}, column="w", name="email"
    )
    stops_first = 0.4 * 0.75
    reach_second = 1 - stops_first
    expected = (
        1 * 0.4  # finder's mean charge
        + 0.4 * 0.5  # verifying what it found
        + reach_second * 2.0  # dear, when finder gave nothing valid
        + reach_second * 0.5 * 0.5  # verifying what dear found
    )
    total = Estimate.from_tally(counting.tally.as_dict(), play="p").total
    assert total.expected_credits == pytest.approx(expected)
    assert total.worst_credits == pytest.approx(1 + 2 + 2 * 0.5)
    assert isinstance(result.value, Unknown)
    assert result.value.p == pytest.approx(stops_first + reach_second * 0.5 * 0.75)


async def test_a_waterfall_its_receipts_answer_is_exact_and_free() -> None:
    reader = Reader()
    reader.complete("finder", {"name": "ada"}, {"email": "ada@x"})
    reader.complete("verify", {"email": "ada@x"}, {"status": "valid"})
    counting = runner(reader)
    result = await estimate_waterfall(
        counting, CATALOG.waterfall("email"), {"name": "ada"}, {}, column="w", name="email"
    )
    assert result.value == "ada@x" and result.step == "finder"
    total = Estimate.from_tally(counting.tally.as_dict(), play="p").total
    assert (total.cached, total.to_pay, total.worst_credits) == (2, 0, 0.0)


async def test_a_receipt_miss_passes_on_to_the_next_step_as_surely_as_it_was_reached() -> None:
    reader = Reader()
    reader.complete("finder", {"name": "ada"}, {"email": ""})
    counting = runner(reader)
    result = await estimate_waterfall(
        counting, CATALOG.waterfall("unchecked"), {"name": "ada"}, {}, column="w"
    )
    assert isinstance(result.value, Unknown)
    figures = line(counting.tally, "w", "dear")
    assert figures["to_pay"] == 1 and figures["expected_credits"] == pytest.approx(2.0)


# -- tallies -----------------------------------------------------------------------


def test_chunk_tallies_add_up_through_merge_spend_into_an_estimate() -> None:
    first, second = EstimateTally(), EstimateTally()
    first.rows, second.rows = 3, 4
    first.cached("c", "finder", "p1")
    first.to_pay("c", "finder", "p1", worst=1, expected=0.5, basis="receipts")
    second.to_pay("c", "finder", "p1", worst=1, expected=0.25, basis="receipts")
    second.to_pay("d", "dear", "p2", worst=2, expected=2, basis="worst case", unknown_input=True)
    merged = merge_spend(first.as_dict(), second.as_dict())
    estimate = Estimate.from_tally(merged, play="p")
    assert estimate.rows == 7
    (c, d) = estimate.lines
    assert (c.calls, c.cached, c.to_pay, c.worst_credits) == (3, 1, 2, 2.0)
    assert c.expected_credits == pytest.approx(0.75)
    assert (d.unknown_input, d.basis) == (1, "worst case")
    assert estimate.by_provider["p2"].worst_credits == 2.0
    assert estimate.total.calls == 4 and estimate.total.worst_credits == 4.0


# -- rows --------------------------------------------------------------------------


@resolver(name="t_estimate_lowered", tools=["finder", "dear"])
async def _lowered(row: Mapping[str, Any], rc: Any) -> Any:
    found = await rc.tool("finder", {"name": row["name"]})
    return found.get("email").lower()  # an Unknown has no string methods


@resolver(name="t_estimate_broken", tools=["dear"])
async def _broken(row: Mapping[str, Any], rc: Any) -> Any:
    raise ValueError("a bug, whatever the answers")


async def _rows(columns: list[ColumnSpec], reader: Reader) -> Estimator:
    counting = runner(reader)
    chunk = ChunkEstimate(
        ChunkInput(
            run_ref="r",
            start=0,
            end=1,
            columns=columns,
            on_row_error="isolate",
            options=RunOptions(),
        ),
        counting,
    )
    await chunk._row(RunRow(0, "k", {"name": "ada"}, "pending", None))
    return counting


async def test_a_resolver_stumbling_on_an_unknown_counts_its_uncalled_tools_in_the_worst_case() -> (
    None
):
    counting = await _rows([ColumnSpec(name="e", resolver="t_estimate_lowered")], Reader())
    assert line(counting.tally, "e", "finder")["to_pay"] == 1
    assert line(counting.tally, "e", "dear")["unknown_input"] == 1
    assert counting.tally.rows == 1 and counting.tally.rows_failed == 0


async def test_a_resolver_failing_with_every_answer_known_fails_the_row_as_the_run_would() -> None:
    counting = await _rows(
        [
            ColumnSpec(name="b", resolver="t_estimate_broken"),
            ColumnSpec(name="e", resolver="t_estimate_lowered"),
        ],
        Reader(),
    )
    assert counting.tally.rows_failed == 1
    assert counting.tally.as_dict()["lines"] == {}  # the later column never runs


async def test_the_row_context_records_the_tools_a_column_called() -> None:
    rc = RowCall("k", runner(Reader()).runner, row=MappingProxyType({}))
    with counting_for("c"):
        await rc.tool("finder", {"name": "ada"})
    made = rc.next_column()
    assert made.asked == {"finder"} and met_unpaid(made)
    assert rc.column.asked == set() and met_unpaid(rc.column) is False


# -- what an estimate says and skips ----------------------------------------------


async def test_an_estimates_export_writes_nothing_and_says_so() -> None:
    from playline.contract import ChunkStats, DatasetRef, DatasetResult
    from playline.workflows.dataset import DatasetHandle

    ref = DatasetRef(id="leads~estimate", count=3, columns=["a"])
    result = DatasetResult(
        ref=ref, run_ref="r", stats=ChunkStats(), total=3, admitted=3, duplicates=0, seen_before=0
    )
    said: list[str] = []
    handle = DatasetHandle(ref, result, skip_writes=said.append)
    assert await handle.export("/nowhere/out.csv") == 0
    assert said == ["estimate: export of leads~estimate to /nowhere/out.csv skipped"]


def test_confirm_over_refuses_in_one_line_only_past_the_worst_case() -> None:
    from playline.cli.estimate import credits_text, refusal

    tally = EstimateTally()
    tally.to_pay("c", "dear", "p2", worst=1234567.5, expected=1000.25, basis="receipts")
    found = Estimate.from_tally(tally.as_dict(), play="p")
    assert refusal(found, 1234567.5) is None
    assert refusal(found, 100) == (
        "estimate: worst case 1234567.5 credits (expected 1000.25) is over --confirm-over "
        "100; add --yes to run anyway"
    )
    assert credits_text(0.0) == "0" and credits_text(2.0) == "2" and credits_text(0.125) == "0.12"


# -- fallbacks: the ways an estimate does not take (issue 28, G9) -------------------


@resolver(name="t_estimate_if_not", tools=["finder", "dear"])
async def _if_not(row: Mapping[str, Any], rc: Any) -> Any:
    found = await rc.tool("finder", {"name": row["name"]})
    if not found.get("email"):
        found = await rc.tool("dear", {"name": row["name"]})
    return found.get("email")


@resolver(name="t_estimate_or", tools=["finder", "dear"])
async def _or(row: Mapping[str, Any], rc: Any) -> Any:
    a = await rc.tool("finder", {"name": row["name"]})
    return a.get("email") or (await rc.tool("dear", {"name": row["name"]})).get("email")


@resolver(name="t_estimate_equals", tools=["finder", "dear"])
async def _equals(row: Mapping[str, Any], rc: Any) -> Any:
    found = await rc.tool("finder", {"name": row["name"]})
    if found.get("score") == "valid":  # only a verified value is worth the dear call
        return (await rc.tool("dear", {"name": row["name"]})).get("email")
    return found.get("email")


@resolver(name="t_estimate_in_set", tools=["finder", "dear"])
async def _in_set(row: Mapping[str, Any], rc: Any) -> Any:
    found = await rc.tool("finder", {"name": row["name"]})
    if found.get("score") in {"valid", "risky"}:
        return (await rc.tool("dear", {"name": row["name"]})).get("email")
    return found.get("email")


@resolver(name="t_estimate_found", tools=["finder"])
async def _found(row: Mapping[str, Any], rc: Any) -> Any:
    return (await rc.tool("finder", {"name": row["name"]})).get("email")


@resolver(name="t_estimate_cell_is_none", tools=["dear"])
async def _cell_is_none(row: Mapping[str, Any], rc: Any) -> Any:
    if row["e"] is None:  # an identity test: nothing on the value itself can see it
        return (await rc.tool("dear", {"name": row["name"]})).get("email")
    return row["e"]


async def _per_row(columns: list[ColumnSpec], reader: Reader, names: list[str]) -> Estimate:
    counting = runner(reader)
    chunk = ChunkEstimate(
        ChunkInput(
            run_ref="r",
            start=0,
            end=len(names),
            columns=columns,
            on_row_error="isolate",
            options=RunOptions(),
        ),
        counting,
    )
    for i, name in enumerate(names):
        await chunk._row(RunRow(i, f"k{i}", {"name": name}, "pending", None))
    return Estimate.from_tally(counting.tally.as_dict(), play="p")


@pytest.mark.parametrize(
    "columns",
    [
        [ColumnSpec(name="e", resolver="t_estimate_if_not")],
        [ColumnSpec(name="e", resolver="t_estimate_or")],
        [ColumnSpec(name="e", resolver="t_estimate_equals")],
        [ColumnSpec(name="e", resolver="t_estimate_in_set")],
        [
            ColumnSpec(name="e", resolver="t_estimate_found"),
            ColumnSpec(name="f", resolver="t_estimate_cell_is_none"),
        ],
    ],
    ids=["if-not", "or", "equals", "in-set", "later-column-is-none"],
)
async def test_a_fallback_on_an_unpaid_answer_is_in_the_worst_case(
    columns: list[ColumnSpec],
) -> None:
    """finder (1 credit per hit), then dear (2) on the way the estimate does not take:
    the run may pay both in every row, so the worst case is 3 credits a row."""
    estimate = await _per_row(columns, Reader(), ["ada", "bob"])
    assert estimate.rows == 2 and estimate.rows_failed == 0
    assert estimate.total.worst_credits == pytest.approx(2 * 3.0)
    (dear,) = [x for x in estimate.lines if x.tool == "dear"]
    assert (dear.calls, dear.unknown_input, dear.worst_credits) == (2, 2, 4.0)
    # No receipts tell how often finder misses: the fallback is expected at its worst.
    assert dear.expected_credits == pytest.approx(4.0)


async def test_a_fallback_is_expected_at_the_first_calls_miss_rate_when_receipts_tell_it() -> None:
    reader = Reader()
    reader.samples["finder"] = [({"email": "a@x"}, 1.0)] * 8 + [({}, 0.0)] * 12  # 40 % found
    estimate = await _per_row([ColumnSpec(name="e", resolver="t_estimate_if_not")], reader, ["ada"])
    (dear,) = [x for x in estimate.lines if x.tool == "dear"]
    assert dear.worst_credits == 2.0
    assert dear.expected_credits == pytest.approx(0.6 * 2.0)  # finder misses 60 %
    assert estimate.total.worst_credits == pytest.approx(3.0)


async def test_a_fallback_its_receipts_rule_out_is_not_counted() -> None:
    """Every answer known (a receipt holds finder's email): the estimate is exact."""
    reader = Reader()
    reader.complete("finder", {"name": "ada"}, {"email": "ada@x"})
    estimate = await _per_row([ColumnSpec(name="e", resolver="t_estimate_if_not")], reader, ["ada"])
    assert [x.tool for x in estimate.lines] == ["finder"]
    assert (estimate.total.cached, estimate.total.worst_credits) == (1, 0.0)


async def test_a_known_miss_takes_the_fallback_and_counts_it_once() -> None:
    reader = Reader()
    reader.complete("finder", {"name": "ada"}, {"email": ""})
    estimate = await _per_row([ColumnSpec(name="e", resolver="t_estimate_or")], reader, ["ada"])
    (dear,) = [x for x in estimate.lines if x.tool == "dear"]
    assert (dear.calls, dear.to_pay, dear.unknown_input) == (1, 1, 0)
    assert estimate.total.worst_credits == pytest.approx(2.0)


def test_branches_on_an_unknown_are_recorded_with_the_chance_of_the_other_way() -> None:
    from playline.calls.estimate import watching_unknowns

    guessed, measured = Unknown(), Unknown(0.25, measured=True)
    with watching_unknowns() as met:
        assert bool(measured) is True
    assert met.read and met.other_way == [0.75]
    with watching_unknowns() as met:
        assert (measured == "valid") is False and measured != "valid"
        assert (measured in {"valid"}) is False and ("x" in measured) is False
    assert met.other_way == [0.25] * 4
    assert met.fallback_chance() == pytest.approx(1 - 0.75**4)
    with watching_unknowns() as met:
        assert guessed.get("x") is guessed
    assert met.read and met.other_way == [] and met.fallback_chance() == 1.0
    with watching_unknowns() as met:
        assert (guessed is None) is False  # an identity test: nothing sees it
    assert not met.any
    with watching_unknowns() as met:
        assert guessed
    assert met.fallback_chance() == 1.0  # a guessed p: the other way at worst
    with pytest.raises(TypeError):
        list(Unknown())  # not an endless run of itself
    assert guessed == guessed and guessed != Unknown()  # equal to itself only
