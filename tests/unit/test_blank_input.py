"""Bad input costs nothing: a required tool input left blank is refused before anything.

The detection (``ToolSpec.validate_input``), the runner (nothing claimed or
dispatched), a waterfall (the step is ``skipped_input``, the next one runs), a cell's
provenance and the run's tally, and the estimate (counted free, as the run makes it).
End to end (real Temporal, the provider's ledger) in ``tests/e2e/test_blank_input.py``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from playline import resolver
from playline.activities.estimate import ChunkEstimate
from playline.calls.catalog import Catalog
from playline.calls.estimate import Unknown
from playline.calls.provenance import SKIPPED_INPUT, ColumnCalls, cell_provenance, tally
from playline.calls.runner import ToolResult
from playline.calls.waterfall import Step, run_waterfall, waterfall_of
from playline.contract import ChunkInput, ChunkStats, ColumnSpec, DatasetRunState, RunOptions
from playline.errors import BlankInput, InvalidToolInput, PlaylineError, non_retryable_types
from playline.stores.sheet import RunRow
from playline.workflows.status import dataset_current_details
from tests.unit.test_estimate import Reader, estimate_waterfall, line
from tests.unit.test_estimate import runner as estimating_runner
from tests.unit.test_runner import MemoryReceipts, make

CATALOG = Catalog.model_validate(
    {
        "providers": {name: {"base_url": "http://127.0.0.1:1"} for name in ("pa", "pb")},
        "tools": {
            "find": {
                "provider": "pa",
                "path": "/find",
                "input": {"first_name": "str", "domain": "str", "website": "str?"},
                "getters": {"email": "email"},
                "credits": 1.0,
            },
            "count": {"provider": "pa", "path": "/count", "input": {"n": "int", "tag": "str?"}},
            "linked": {
                "provider": "pb",
                "path": "/linked",
                "input": {"url": "str"},
                "getters": {"email": "email"},
                "credits": 2.0,
            },
            "free_form": {"provider": "pb", "path": "/any"},
        },
    }
)
FIND = CATALOG.tool("find")


# -- detection ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        {"first_name": "Ada", "domain": ""},
        {"first_name": "Ada", "domain": "   \t"},
        {"first_name": "Ada", "domain": None},
        {"first_name": "Ada"},  # a missing required key is blank too
    ],
)
def test_a_required_field_left_blank_is_refused_naming_the_tool_and_field(given: Any) -> None:
    with pytest.raises(BlankInput) as info:
        FIND.validate_input(given)
    err = info.value
    assert (err.tool_id, err.fields) == ("find", ("domain",))
    assert str(err) == (
        "tool 'find': required input 'domain' is blank; nothing was sent (skipped_input, free)"
    )
    assert "Ada" not in str(err)  # never the row's values


def test_every_blank_field_is_named_and_an_optional_one_may_be_blank() -> None:
    with pytest.raises(BlankInput) as info:
        FIND.validate_input({"first_name": " ", "domain": "", "website": ""})
    assert info.value.fields == ("first_name", "domain")
    assert "inputs 'first_name', 'domain' are blank" in str(info.value)
    # An optional field may be blank: sent as given, as before.
    assert FIND.validate_input({"first_name": "Ada", "domain": "x.io", "website": ""}) == {
        "first_name": "Ada",
        "domain": "x.io",
        "website": "",
    }


def test_a_valid_input_is_normalised_exactly_as_before() -> None:
    """Nothing is stripped or added: receipt keys of present inputs do not change."""
    given = {"first_name": " Ada ", "domain": "x.io", "website": None}
    assert FIND.validate_input(given) == {"first_name": " Ada ", "domain": "x.io"}
    assert CATALOG.tool("count").validate_input({"n": 0}) == {"n": 0}
    assert CATALOG.tool("free_form").validate_input({"anything": ""}) == {"anything": ""}


def test_a_blank_number_is_blank_and_a_zero_is_not() -> None:
    count = CATALOG.tool("count")
    for given in ({}, {"n": None}, {"n": ""}, {"n": "  "}):
        with pytest.raises(BlankInput):
            count.validate_input(given)
    assert count.validate_input({"n": 0, "tag": ""}) == {"n": 0, "tag": ""}


def test_a_bug_in_the_play_is_still_invalid_input_even_beside_a_blank() -> None:
    with pytest.raises(InvalidToolInput, match="domian"):
        FIND.validate_input({"first_name": "Ada", "domian": "x.io"})  # a typo
    with pytest.raises(InvalidToolInput, match="n: Input should be a valid integer"):
        CATALOG.tool("count").validate_input({"n": "many", "tag": None})
    with pytest.raises(InvalidToolInput, match="first_name"):
        FIND.validate_input({"first_name": 42, "domain": ""})  # a wrong type and a blank


def test_blank_input_is_a_row_matter_never_retried_and_not_a_play_bug() -> None:
    assert issubclass(BlankInput, PlaylineError)
    assert not issubclass(BlankInput, InvalidToolInput)
    assert not BlankInput.retryable and not BlankInput.chunk_fatal
    assert "BlankInput" in non_retryable_types()


# -- the runner: nothing claimed, nothing dispatched -----------------------------------


async def test_the_runner_refuses_a_blank_input_before_claiming_or_dispatching() -> None:
    receipts = MemoryReceipts()
    runner, dispatcher = make(receipts)
    with pytest.raises(BlankInput):
        await runner.call("find", {"q": "  "})
    assert receipts.claim_batches == [] and receipts.rows == {}
    assert dispatcher.settled == []
    stats = runner.stats
    assert (stats.made, stats.cached, stats.shared, stats.failed, stats.credits) == (0, 0, 0, 0, 0)
    assert runner.attempt.leases.keys() == []
    # The next call of the same runner is untouched by it.
    assert (await runner.call("find", {"q": "a"})).data == {"answer": "a"}


# -- waterfalls ------------------------------------------------------------------------


class ValidatingCalls:
    """``rc.tool`` as the runner behaves: the input validated first, then an answer."""

    def __init__(self, answers: Mapping[str, Any]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, tool_id: str, input: Mapping[str, Any]) -> ToolResult:
        tool = CATALOG.tool(tool_id)
        payload = tool.validate_input(input)
        self.sent.append((tool_id, payload))
        answer = self.answers[tool_id]
        return ToolResult(tool, answer, False, "paid", tool.credits, "rule", time.time())


async def test_a_blank_step_is_skipped_free_and_the_next_step_with_its_own_input_runs() -> None:
    calls = ValidatingCalls({"find": {"email": "a@x.io"}, "linked": {"email": "l@x.io"}})
    spec, steps = waterfall_of(
        CATALOG,
        None,
        [
            Step("find", input={"first_name": "Ada", "domain": ""}),
            Step("linked", input={"url": "https://in.example/ada"}),
        ],
        value="email",
    )
    result = await run_waterfall(calls, CATALOG, spec, {}, {}, name="w", steps=steps)
    assert calls.sent == [("linked", {"url": "https://in.example/ada"})]  # find never sent
    assert (result.value, result.step) == ("l@x.io", "linked")
    assert [(s.tool, s.outcome, s.reason, s.credits) for s in result.steps] == [
        ("find", "skipped_input", "blank: domain", 0.0),
        ("linked", "hit", None, 2.0),
    ]
    assert result.credits == 2.0


async def test_a_waterfall_whose_every_step_is_blank_leaves_a_skipped_input_cell() -> None:
    calls = ValidatingCalls({})
    spec, steps = waterfall_of(
        CATALOG,
        None,
        [Step("find", input={"first_name": "Ada"}), Step("linked", input={"url": None})],
        value="email",
    )
    result = await run_waterfall(calls, CATALOG, spec, {}, {}, steps=steps)
    assert calls.sent == [] and result.value is None
    assert [s.outcome for s in result.steps] == ["skipped_input", "skipped_input"]
    made = ColumnCalls(waterfalls=[result], blank=["find: domain", "linked: url"])
    cell = cell_provenance(made, None)
    assert cell["miss"] == SKIPPED_INPUT and cell["credits"] == 0.0
    assert cell["blank"] == "find: domain; linked: url"
    assert cell["steps"][0]["outcome"] == "skipped_input"
    # A skipped step is not a try: the hit rates count only steps that were called.
    spend = tally([{"email": cell}])
    assert spend.tried.get("email", {}) == {} and spend.skipped_input == 1


# -- a cell's provenance and the run's tally -------------------------------------------


def test_a_cell_whose_resolver_let_the_blank_through_is_skipped_input_and_free() -> None:
    cell = cell_provenance(ColumnCalls(blank=["find: domain"]), None, skipped_input=True)
    assert cell == {"tool": None, "credits": 0.0, "miss": "skipped_input", "blank": "find: domain"}
    # A resolver that caught it and called nothing else: the same outcome.
    assert cell_provenance(ColumnCalls(blank=["find: domain"]), None)["miss"] == SKIPPED_INPUT
    # One that caught it and asked another tool, which missed: that tool's miss.
    other = ToolResult(CATALOG.tool("linked"), {}, False, "paid", 2.0, "rule", 1.0)
    fallback = cell_provenance(ColumnCalls(calls=[other], blank=["find: domain"]), None)
    assert fallback["miss"] == "linked: no_match" and "blank" not in fallback
    spend = tally([{"a": cell, "b": fallback}, {"a": {"tool": None, "credits": 0, "miss": None}}])
    assert spend.skipped_input == 1 and spend.credits == 2.0
    assert "skipped_input" not in spend.as_dict()  # the spend dict keeps its shape


def test_the_stats_add_up_and_the_current_details_show_the_skipped_cells() -> None:
    total = ChunkStats()
    total.add(ChunkStats(cells_skipped_input=2))
    total.add(ChunkStats(cells_skipped_input=3))
    assert total.cells_skipped_input == 5
    assert ChunkStats.model_validate({}).cells_skipped_input == 0  # older payloads decode
    state = DatasetRunState(dataset="d", rows_total=9, rows_done=9, chunks_in_flight=0, stats=total)
    text = dataset_current_details(state, datetime.now(UTC))
    assert "- 5 cells skipped: a required input was blank" in text


# -- the estimate: counted free, as the run makes it -----------------------------------


async def test_an_estimated_blank_call_is_refused_and_counted_nowhere() -> None:
    reader = Reader()
    counting = estimating_runner(reader)
    with pytest.raises(BlankInput):
        await counting.call("finder", {"name": "  "}, column="e")
    assert counting.tally.as_dict()["lines"] == {} and reader.gets == []


async def test_an_estimated_waterfall_skips_a_blank_step_and_reaches_the_next_in_full() -> None:
    counting = estimating_runner(Reader())
    spec, steps = waterfall_of(
        CATALOG,
        None,
        [Step("finder", input={"name": ""}), Step("dear", input={"name": "ada"})],
        value="email",
    )
    found = await estimate_waterfall(counting, spec, {}, {}, column="e", steps=steps)
    assert isinstance(found.value, Unknown)
    assert counting.tally.as_dict()["lines"]["e"].keys() == {"dear"}
    assert line(counting.tally, "e", "dear")["to_pay"] == 1
    assert line(counting.tally, "e", "dear")["expected_credits"] == pytest.approx(2.0)


@resolver(name="t_blank_lookup", tools=["finder"])
async def _blank_lookup(row: Mapping[str, Any], rc: Any) -> Any:
    found = await rc.tool("finder", {"name": row["domain"]})  # blank in the row below
    return found.get("email")


@resolver(name="t_blank_other", tools=["dear"])
async def _blank_other(row: Mapping[str, Any], rc: Any) -> Any:
    found = await rc.tool("dear", {"name": row["name"]})
    return found.get("email")


async def test_an_estimated_row_goes_on_past_a_blank_column_as_the_run_does() -> None:
    """The column is empty (skipped_input), the row is not failed, and the later
    column's call is counted: the worst case covers what the run will pay."""
    counting = estimating_runner(Reader())
    chunk = ChunkEstimate(
        ChunkInput(
            run_ref="r",
            start=0,
            end=1,
            columns=[
                ColumnSpec(name="b", resolver="t_blank_lookup"),
                ColumnSpec(name="e", resolver="t_blank_other"),
            ],
            on_row_error="isolate",
            options=RunOptions(),
        ),
        counting,
    )
    await chunk._row(RunRow(0, "k", {"name": "ada", "domain": ""}, "pending", None))
    assert counting.tally.rows == 1 and counting.tally.rows_failed == 0
    assert counting.tally.as_dict()["lines"].keys() == {"e"}
    assert line(counting.tally, "e", "dear")["to_pay"] == 1
