"""The reconciliation's comparison rule (``playline.reconcile.compare``), without a store.

What the balance moved by is set against what the run's receipts say it paid; a
positive gap is looked for among the calls sent without an answer, a negative one among
the answers the catalog's rule priced; a read that failed or never happened is said so
and is never a match.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from playline.calls.balance_spec import BalanceSpec
from playline.contract import ChunkStats, PlayState
from playline.reconcile.compare import (
    Reconciliation,
    balance_spent,
    reconcile_provider,
    reconciliation,
)
from playline.stores.balances import BalanceReading
from playline.stores.receipts import RunCall
from playline.workflows.status import play_current_details


def reading(phase: str, value: float | None, kind: str = "remaining", error: str | None = None):  # type: ignore[no-untyped-def]
    return BalanceReading("run-1", "r1", phase, "hunter", kind, value, error, 1.0)


def paid(key: str, credits: float, source: str = "rule", tool: str = "finder") -> RunCall:
    return RunCall(key, tool, "completed", credits, source, f"run-1/r1/ds#{key}", "run-1/ds/1#1")


def ambiguous(key: str, tool: str = "finder") -> RunCall:
    return RunCall(key, tool, "ambiguous", 0.0, None, None, "run-1/dataset/ds/7#1")


def test_a_remaining_balance_goes_down_a_used_counter_up() -> None:
    assert balance_spent(reading("before", 100), reading("after", 93)) == 7
    assert balance_spent(reading("before", 4, "used"), reading("after", 11, "used")) == 7
    assert balance_spent(reading("before", 100), None) is None
    assert balance_spent(reading("before", None, error="503"), reading("after", 90)) is None


def test_a_run_whose_balance_moved_by_what_it_paid_reconciles() -> None:
    calls = [paid("a", 1), paid("b", 2, "provider"), paid("c", 0)]
    result = reconcile_provider("hunter", calls, reading("before", 50), reading("after", 47))
    assert result.verdict == "reconciled"
    assert result.difference == 0
    assert (result.playline, result.reported) == (3, 2)
    assert (result.reported_answers, result.rule_answers) == (1, 2)
    assert result.calls == ()


def test_a_charge_playline_never_saw_names_the_call_sent_without_an_answer() -> None:
    calls = [paid("a", 1), ambiguous("lost")]
    result = reconcile_provider("hunter", calls, reading("before", 50), reading("after", 48))
    assert result.verdict == "difference"
    assert result.difference == 1
    [named] = result.calls
    assert "finder receipt lost" in named and "run-1/dataset/ds/7#1" in named
    assert "1 credits more" in result.note


def test_playline_counting_more_than_the_provider_took_names_the_rule_priced_answers() -> None:
    calls = [paid("a", 1, "provider"), paid("b", 2)]
    result = reconcile_provider("hunter", calls, reading("before", 50), reading("after", 49))
    assert result.verdict == "difference"
    assert result.difference == -2
    [named] = result.calls
    assert "finder receipt b (row run-1/r1/ds#b): 2 credits by the catalog's rule" in named


def test_a_gap_no_call_explains_says_so() -> None:
    result = reconcile_provider(
        "hunter", [paid("a", 1)], reading("before", 50), reading("after", 40)
    )
    assert result.verdict == "difference" and result.calls == ()
    assert "no call of the run explains it" in result.note


def test_a_failed_or_missing_read_is_never_a_match() -> None:
    failed = reconcile_provider(
        "hunter", [paid("a", 1)], reading("before", 50), reading("after", None, error="503")
    )
    assert failed.verdict == "unread" and "the after read failed: 503" in failed.note
    missing = reconcile_provider("hunter", [paid("a", 1)], None, None)
    assert missing.verdict == "no balance" and missing.difference is None
    going = reconcile_provider("hunter", [paid("a", 1)], reading("before", 50), None)
    assert going.verdict == "no balance" and "not after it yet" in going.note
    assert Reconciliation("run-1", (failed, missing)).ok  # nothing differs: nothing to name


def test_float_sums_within_the_tolerance_reconcile() -> None:
    calls = [paid(str(i), 0.1) for i in range(3)]  # 0.30000000000000004
    result = reconcile_provider("hunter", calls, reading("before", 1.0), reading("after", 0.7))
    assert result.verdict == "reconciled"


def test_the_run_groups_calls_by_provider_and_lists_providers_read_but_not_called() -> None:
    calls = [paid("a", 1, tool="finder"), paid("b", 0.5, tool="verifier")]
    other = BalanceReading("run-1", "r1", "before", "idle", "remaining", 10.0, None, 1.0)
    other_after = BalanceReading("run-1", "r1", "after", "idle", "remaining", 10.0, None, 2.0)
    report = reconciliation(
        "run-1",
        calls,
        {"finder": "hunter", "verifier": "zerobounce"},
        [reading("before", 50), reading("after", 49), other, other_after],
        cells={"hunter": 1.0},
    )
    by_name = {p.provider: p for p in report.providers}
    assert sorted(by_name) == ["hunter", "idle", "zerobounce"]
    assert by_name["hunter"].verdict == "reconciled" and by_name["hunter"].cells == 1.0
    assert by_name["idle"].verdict == "reconciled" and by_name["idle"].playline == 0
    assert by_name["zerobounce"].verdict == "no balance"
    assert report.ok
    document = report.as_dict()
    assert document["providers"]["hunter"]["balance_before"]["value"] == 50
    assert report.lines()[0] == "reconciliation of run-1: every balance read matches"
    assert report.markdown()[0].startswith("| provider | playline | reported")


def test_the_lines_and_the_markdown_name_the_calls_behind_a_difference() -> None:
    report = reconciliation(
        "run-1",
        [paid("a", 1), ambiguous("lost")],
        {"finder": "hunter"},
        [reading("before", 50), reading("after", 48)],
    )
    assert not report.ok
    text = "\n".join(report.lines())
    assert "A BALANCE DOES NOT MATCH" in text and "receipt lost" in text
    assert any("receipt lost" in line for line in report.markdown())


@pytest.mark.parametrize("kind", ["remaining", "used"])
def test_a_reading_kind_is_taken_from_the_after_reading(kind: str) -> None:
    before, after = (50.0, 48.0) if kind == "remaining" else (2.0, 4.0)
    spent = balance_spent(reading("before", before, kind), reading("after", after, kind))
    assert spent == 2.0


def test_the_play_details_show_the_reconciliation_once_the_run_has_one() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    state = PlayState(play="p", status="completed")
    assert "reconciliation" not in play_current_details(state, ChunkStats(), now)
    state.reconciliation = ["| provider | playline |", "|---|---:|", "| hunter | 3 |"]
    details = play_current_details(state, ChunkStats(), now)
    assert "**reconciliation with the providers' balances**" in details
    assert details.endswith("| hunter | 3 |")


def test_a_balance_spec_names_exactly_one_figure_on_a_path() -> None:
    assert BalanceSpec(path="/v2/account", used="data.used").kind == "used"
    assert BalanceSpec(path="/credits", remaining="balance").field == "balance"
    for bad in (
        {"path": "/credits"},
        {"path": "/credits", "remaining": "a", "used": "b"},
        {"path": "credits", "remaining": "a"},
    ):
        with pytest.raises(ValueError):
            BalanceSpec.model_validate(bad)


def test_a_run_with_no_balance_read_says_so_rather_than_that_it_matches() -> None:
    report = reconciliation("run-1", [paid("a", 1)], {"finder": "acme"}, [])
    assert report.ok and not report.balances_read
    assert report.lines()[0] == (
        "reconciliation of run-1: no balance was read (no provider it called declares one)"
    )
