"""``playline schedule`` and ``playline.create_schedule`` refuse bad input in one line,
before anything is uploaded or any server is asked (no Temporal here: the address is
one nothing listens on, so reaching it would fail the test with another message)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import ScheduleOverlapPolicy

from playline import create_schedule
from playline.cli import main
from playline.contract import RunOptions
from playline.errors import InvalidPlayInput, PlaylineError
from playline.schedules import (
    check_name,
    duration_text,
    overlap_policy,
    schedule_spec,
    scheduled_options,
)
from tests.plays import t_tool_column

NOWHERE = ("--address", "127.0.0.1:9", "--task-queue", "tq-unit")


def _create(*extra: str) -> list[str]:
    return ["schedule", "create", "weekly", "--play", "t_tool_column", *NOWHERE, *extra]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (_create("--input", "{}"), "give exactly one of --every"),
        (_create("--every", "7d", "--cron", "0 6 * * 1"), "not --every and --cron"),
        (_create("--every", "soon"), "--every: 'soon' is not a duration"),
        (_create("--every", "0s"), "--every must be at least 1 second"),
        (_create("--every", "7d", "--catchup-window", "later"), "--catchup-window: 'later'"),
        (_create("--every", "7d", "--input", "{nope"), "--input is not valid JSON"),
        (_create("--every", "7d", "--input", "[1]"), "--input must be a JSON object"),
        (_create("--every", "7d", "--csv", "/no/such.csv"), "--csv /no/such.csv: no such file"),
        (_create("--every", "7d", "--max-credits-for", "acme"), "--max-credits-for wants"),
        (_create("--every", "7d", "--max-credits", "-3"), "invalid run options"),
        (
            ["schedule", "create", "bad name", "--play", "p", "--every", "1d", *NOWHERE],
            "invalid schedule name 'bad name'",
        ),
    ],
)
def test_bad_create_flags_are_one_line_and_exit_1(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert says in err, err
    assert err.startswith("error:") and err.count("\n") == 1, err


def test_an_unknown_overlap_policy_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(_create("--every", "7d", "--overlap", "sometimes"))
    assert exited.value.code == 2
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


def test_specs_and_their_text() -> None:
    spec, text = schedule_spec(every="7d")
    assert [i.every for i in spec.intervals] == [timedelta(days=7)] and text == "every 7d"
    assert schedule_spec(every=timedelta(hours=12))[1] == "every 12h"
    assert schedule_spec(every=90)[1] == "every 90s"
    spec, text = schedule_spec(cron=" 0  6 * * 1 ")
    assert list(spec.cron_expressions) == ["0 6 * * 1"] and text == "cron 0 6 * * 1"
    for every, cron in ((None, None), ("1d", "0 6 * * 1"), (None, "  ")):
        with pytest.raises(PlaylineError, match="exactly one of every"):
            schedule_spec(every, cron)
    assert duration_text(600) == "10m" and duration_text(1.5) == "1.5s"


def test_overlap_names_and_names() -> None:
    assert overlap_policy("skip") is ScheduleOverlapPolicy.SKIP
    assert overlap_policy("buffer-one") is ScheduleOverlapPolicy.BUFFER_ONE
    with pytest.raises(PlaylineError, match="unknown overlap policy 'never'"):
        overlap_policy("never")
    assert check_name("leads.weekly-1") == "leads.weekly-1"
    for bad in ("", "-x", "a/b", "x" * 101):
        with pytest.raises(PlaylineError, match="invalid schedule name"):
            check_name(bad)


def test_a_firing_estimates_first_and_caps_each_firing() -> None:
    given = RunOptions(max_credits=50, budget_run="someone-elses")
    options = scheduled_options("weekly", given)
    assert options.estimate_first and options.schedule == "weekly"
    assert options.max_credits == 50 and options.budget_run is None
    assert not given.estimate_first  # the caller's options are left as they were


class _NoServer:
    """A client that fails the test if anything asks the server."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the server was asked ({name}) before the input was checked")


async def test_the_python_api_validates_the_input_of_a_play_class_first() -> None:
    client: Any = _NoServer()
    with pytest.raises(InvalidPlayInput, match="invalid input for play 't_tool_column'"):
        await create_schedule(client, "weekly", t_tool_column, {"nope": 1}, every="7d")
    with pytest.raises(PlaylineError, match="exactly one of every"):
        await create_schedule(client, "weekly", t_tool_column, {"csv_path": "x.csv"})
    with pytest.raises(PlaylineError, match="every: '7 days' is not a duration"):
        await create_schedule(client, "weekly", "any_play", {}, every="7 days")
    with pytest.raises(PlaylineError, match="catchup_window must be at least 1 second"):
        await create_schedule(client, "weekly", "any_play", {}, every="1d", catchup_window=0)


def test_a_store_csv_is_not_looked_for_on_this_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # store:... passes the local-file check and goes on to connect (which fails here).
    assert main(_create("--every", "7d", "--csv", "store:ds-1")) == 1
    err = capsys.readouterr().err
    assert "no such file" not in err and "127.0.0.1:9" in err, err


def test_what_is_due_is_read_from_an_estimate_tally_as_estimate_adds_it_up() -> None:
    from playline.calls.estimate_tally import Estimate, EstimateTally
    from playline.workflows.play import _due_calls

    tally = EstimateTally()
    tally.cached("email", "email_finder", "acme")
    tally.to_pay("email", "email_finder", "acme", worst=1.0, expected=1.0, basis="receipts")
    tally.to_pay(
        "title", "person_enrich", "acme", worst=2.5, expected=1, basis="worst case",
        unknown_input=True,
    )  # fmt: skip
    total = Estimate.from_tally(tally.as_dict(), play="p").total
    assert _due_calls(tally.as_dict()) == (total.to_pay + total.unknown_input, 3.5)
    assert _due_calls({}) == (0, 0.0)
