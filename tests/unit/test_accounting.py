"""The accounts' arithmetic, their trip through heartbeats and results, and their tables.

Pure logic: counts, the plain form a heartbeat carries to the next attempt, the sum of
chunk results, and the text the CLI and the Temporal UI show. The figures themselves
are checked against the provider's ledger in ``tests/e2e/test_accounting.py``.
"""

from __future__ import annotations

import io
from dataclasses import asdict
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from playline.activities.chunk import carried_calls, stats_from
from playline.calls.accounting import ProviderCounts, accounts_as_dict, accounts_from
from playline.calls.attempt import CallStats
from playline.cli import render
from playline.config import Settings
from playline.contract import ChunkStats, DatasetRunState, PlayRunResult
from playline.spend import account_lines, account_markdown
from playline.workflows.status import dataset_current_details


def counted() -> CallStats:
    """An attempt's stats after a few calls to two providers."""
    stats = CallStats(made=3, credits=2.5)
    acme = stats.account("acme")
    acme.sent(replayed=False)
    acme.sent(replayed=True)  # a charged answer lost, re-sent, replayed
    acme.charge(2.0)
    acme.charge(0.0)  # a free miss: answered, not a charge
    acme.reused(1.0)
    acme.reused(None, follower=True)  # a bulk member another owner finished
    firmo = stats.account("firmo")
    firmo.sent(replayed=False)
    firmo.charge(0.5)
    firmo.shared += 2
    return stats


def test_each_term_counts_what_it_says() -> None:
    acme = counted().by_provider["acme"]
    assert (acme.requests, acme.replays, acme.charged, acme.credits) == (2, 1, 1, 2.0)
    assert (acme.hits, acme.followers, acme.shared, acme.saved) == (1, 1, 0, 1.0)
    assert counted().account("verifly") == ProviderCounts()


def test_a_heartbeat_carries_the_accounts_to_the_next_attempt() -> None:
    stats = counted()
    carried = carried_calls({"rows_done": 4, "calls": asdict(stats)})
    assert carried == stats
    assert isinstance(carried.by_provider["acme"], ProviderCounts)
    # The next attempt counts on from them.
    carried.account("acme").sent(replayed=False)
    assert carried.by_provider["acme"].requests == 3


@pytest.mark.parametrize(
    ("details", "made", "accounts"),
    [
        (None, 0, {}),
        ({"calls": {"made": 2}}, 2, {}),  # a heartbeat from before the accounts
        ({"calls": {"made": 2, "by_provider": "garbage"}}, 2, {}),
        (
            {"calls": {"made": 2, "by_provider": {"acme": {"requests": "x", "charged": 1}}}},
            2,
            {"acme": ProviderCounts(charged=1)},
        ),
    ],
)
def test_a_heartbeat_without_usable_accounts_keeps_what_it_can(
    details: Any, made: int, accounts: dict[str, ProviderCounts]
) -> None:
    carried = carried_calls(details)
    assert (carried.made, carried.by_provider) == (made, accounts)


def test_accounts_from_keeps_known_numbers_only() -> None:
    parsed = accounts_from({"acme": {"requests": 3.0, "saved": 1, "extra": 9, "hits": True}})
    assert parsed == {"acme": ProviderCounts(requests=3, saved=1.0)}
    assert accounts_from(["acme"]) == {}


def test_chunk_results_add_up_the_accounts_provider_by_provider() -> None:
    one = stats_from(SimpleNamespace(stats=counted()), ChunkStats())  # type: ignore[arg-type]
    assert one.accounts == accounts_as_dict(counted().by_provider)
    other = ChunkStats(accounts={"acme": {"requests": 5, "credits": 0.25}, "verifly": {"hits": 1}})
    total = ChunkStats()
    total.add(one)
    total.add(other)
    assert total.accounts["acme"]["requests"] == 7
    assert total.accounts["acme"]["credits"] == 2.25
    assert total.accounts["firmo"] == one.accounts["firmo"]
    assert total.accounts["verifly"] == {"hits": 1}
    # Through the contract's JSON, as a chunk result travels.
    assert ChunkStats.model_validate_json(total.model_dump_json()).accounts == total.accounts


ACCOUNTS = {
    "firmo": {"requests": 12, "charged": 10, "credits": 5.0, "shared": 30, "saved": 1.5},
    "acme": {"requests": 102, "charged": 100, "replays": 2, "credits": 150.0, "hits": 4},
}


def test_the_text_table_has_one_aligned_row_per_provider() -> None:
    lines = account_lines(ACCOUNTS)
    assert lines == [
        "provider  requests  charged  replays  receipt hits  shared  followers  credits  saved",
        "acme           102      100        2             4       0          0      150      0",
        "firmo           12       10        0             0      30          0        5    1.5",
    ]
    assert account_lines({}) == []


def test_the_ui_accounts_are_one_list_item_per_provider_after_the_details_list() -> None:
    accounts = account_markdown(ACCOUNTS)
    # A list, not a table: the UI renders tables without cell padding (headings ran
    # together) and cuts a wide one off; a list item wraps.
    assert not any("|" in line for line in accounts)
    assert accounts == [
        "**accounts with the providers**",
        "",
        "- **acme**: 102 requests · 100 charged · 2 replays · 4 receipt hits · 150 credits",
        "- **firmo**: 12 requests · 10 charged · 30 shared · 5 credits · 1.5 saved",
    ]
    state = DatasetRunState(
        dataset="leads",
        rows_total=10,
        rows_done=10,
        chunks_in_flight=0,
        status="completed",
        stats=ChunkStats(accounts=ACCOUNTS),
    )
    text = dataset_current_details(state, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    # After the list, set apart by a blank line, so Markdown starts a new block.
    assert text.endswith("- updated 03:04:05 UTC\n\n" + "\n".join(accounts))


def test_the_ui_accounts_keep_the_ledger_terms_at_zero_and_escape_names() -> None:
    accounts = account_markdown({"data_co-2": {"requests": 1234567}})
    # Exact figures (not 1.23457e+06); requests, charged and credits even at 0.
    assert accounts[-1] == r"- **data\_co\-2**: 1234567 requests · 0 charged · 0 credits"
    assert account_markdown({}) == []


def test_the_run_summary_prints_the_accounts(monkeypatch: pytest.MonkeyPatch) -> None:
    printed = io.StringIO()
    monkeypatch.setattr(render, "out", lambda: Console(file=printed, width=200))
    result = PlayRunResult(play="p", stats=ChunkStats(rows_ok=1, accounts=ACCOUNTS))
    render.print_summary(result, Settings(), "wf", None)
    text = printed.getvalue()
    assert "  accounts by provider:\n" in text
    for line in account_lines(ACCOUNTS):
        assert f"    {line}\n" in text
    printed.truncate(0)
    render.print_summary(PlayRunResult(play="p"), Settings(), "wf", None)
    assert "accounts by provider" not in printed.getvalue()
    assert "sheet:" not in printed.getvalue()


def test_the_summary_links_to_the_runs_sheet_when_the_view_is_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    printed = io.StringIO()
    monkeypatch.setattr(render, "out", lambda: Console(file=printed, width=200))
    settings = Settings(sheets_url="http://127.0.0.1:8234/")
    render.print_summary(PlayRunResult(play="p"), settings, "wf 1", None)
    lines = printed.getvalue().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  Temporal UI: "))
    assert lines[at + 1] == "  sheet: http://127.0.0.1:8234/sheet?id=wf+1"
