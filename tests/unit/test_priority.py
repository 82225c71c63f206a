"""Temporal's priority of a play's work comes from its run options (key, weight, class),
and the fairness flags of ``playline run|demo|schedule create`` set those options or
refuse a bad value in one line (no Temporal here: the address is one nothing listens
on, so reaching it would fail the test with another message)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from temporalio.common import Priority

from playline.cli import build_parser, main
from playline.cli.devserver import FAIRNESS_DYNAMIC_CONFIG, fairness_flags, temporal_binary
from playline.cli.starting import run_options
from playline.contract import RunOptions
from playline.workflows.priority import (
    MAX_TEMPORAL_FAIRNESS_KEY_BYTES,
    play_fairness_key,
    temporal_fairness_key,
    temporal_priority,
)

NOWHERE = ("--address", "127.0.0.1:9", "--task-queue", "tq-unit")


# -- the helper ------------------------------------------------------------------


def test_a_run_without_a_key_counts_for_the_default_key_at_the_default_class() -> None:
    assert temporal_priority(RunOptions(), "enrich-20261205-1") == Priority(
        priority_key=3, fairness_key="enrich-20261205-1", fairness_weight=1.0
    )


def test_the_options_key_weight_and_class_are_temporals() -> None:
    options = RunOptions(fairness_key="team-a", fairness_weight=2.5, priority=1)
    assert temporal_priority(options, "ignored") == Priority(
        priority_key=1, fairness_key="team-a", fairness_weight=2.5
    )


def test_a_key_longer_than_temporal_takes_is_shortened_the_same_way_every_time() -> None:
    long_a, long_b = "a" * 100, "a" * 99 + "b"
    short_a = temporal_fairness_key(long_a)
    assert len(short_a.encode()) <= MAX_TEMPORAL_FAIRNESS_KEY_BYTES
    assert short_a == temporal_fairness_key(long_a) != temporal_fairness_key(long_b)
    assert short_a.startswith("a" * 40)
    assert temporal_fairness_key("a" * 64) == "a" * 64
    multibyte = temporal_fairness_key("é" * 40)  # 80 bytes: cut on a character boundary
    assert len(multibyte.encode()) <= MAX_TEMPORAL_FAIRNESS_KEY_BYTES
    long = RunOptions(fairness_key="k" * 128)
    key = temporal_priority(long, "x").fairness_key
    assert key is not None and len(key) <= MAX_TEMPORAL_FAIRNESS_KEY_BYTES


@pytest.mark.parametrize(
    "workflow_id",
    ["enrich_leads-20261205-040000-abcdef", "sched-2026-12-05T04:00:00Z", "a/dataset/b"],
)
def test_a_workflow_id_that_is_a_valid_key_is_the_key(workflow_id: str) -> None:
    assert play_fairness_key(workflow_id) == workflow_id


@pytest.mark.parametrize("workflow_id", ["my run #1", "ü" * 10, "x" * 300, "a b", "a_b"])
def test_any_other_workflow_id_becomes_a_valid_key_of_its_own(workflow_id: str) -> None:
    key = play_fairness_key(workflow_id)
    # The play's children decode its options again: the key must pass RunOptions.
    assert RunOptions(fairness_key=key).fairness_key == key
    assert key == play_fairness_key(workflow_id)
    assert play_fairness_key("a b") != play_fairness_key("a_b")


# -- the flags -------------------------------------------------------------------


@pytest.mark.parametrize("command", [["run", "p"], ["demo"]])
def test_the_flags_set_the_run_options(command: list[str]) -> None:
    args = build_parser().parse_args(
        [*command, "--fairness-key", "team-a", "--weight", "2", "--priority", "1"]
    )
    options = run_options(args)
    assert (options.fairness_key, options.fairness_weight, options.priority) == ("team-a", 2, 1)


def test_without_the_flags_the_run_is_its_own_key_at_class_3() -> None:
    options = run_options(build_parser().parse_args(["run", "p"]))
    assert (options.fairness_key, options.fairness_weight, options.priority) == (None, 1.0, 3)


def test_schedule_create_takes_the_flags_too() -> None:
    args = build_parser().parse_args(
        [
            *("schedule", "create", "weekly", "--play", "p", "--every", "7d"),
            *("--priority", "5", "--weight", "0.5", "--fairness-key", "customer:42"),
        ]
    )
    options = run_options(args)
    assert (options.fairness_key, options.fairness_weight, options.priority) == (
        "customer:42",
        0.5,
        5,
    )


BAD = [
    (["--priority", "0"], "--priority must be 1 (first) to 5 (last), not '0'"),
    (["--priority", "6"], "--priority must be 1 (first) to 5 (last), not '6'"),
    (["--priority", "high"], "--priority must be 1 (first) to 5 (last), not 'high'"),
    (["--priority", "2.5"], "--priority must be 1 (first) to 5 (last)"),
    (["--weight", "0"], "--weight must be a number above 0 and at most 1000, not '0'"),
    (["--weight", "-1"], "--weight must be a number above 0 and at most 1000"),
    (["--weight", "1001"], "--weight must be a number above 0 and at most 1000"),
    (["--weight", "nan"], "--weight must be a number above 0 and at most 1000"),
    (["--weight", "lots"], "--weight must be a number above 0 and at most 1000, not 'lots'"),
    (["--fairness-key", "team a"], "--fairness-key 'team a': use 1 to 128 letters"),
    (["--fairness-key", "k" * 129], "use 1 to 128 letters, digits and _ . : @ / -"),
]


@pytest.mark.parametrize(("flags", "says"), BAD)
def test_bad_run_flags_are_one_line_and_exit_1(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "p", *NOWHERE, *flags]) == 1
    err = capsys.readouterr().err
    assert says in err, err
    assert err.startswith("error:") and err.count("\n") == 1, err


@pytest.mark.parametrize(("flags", "says"), BAD[:1] + BAD[4:5] + BAD[9:10])
def test_bad_schedule_flags_are_one_line_and_exit_1(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["schedule", "create", "weekly", "--play", "p", "--every", "7d", *NOWHERE, *flags]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert says in err, err
    assert err.startswith("error:") and err.count("\n") == 1, err


# -- fairness on the dev server --------------------------------------------------


def test_the_dev_server_is_started_with_fairness_on() -> None:
    assert fairness_flags(temporal_binary()) == [
        "--dynamic-config-value",
        "matching.useNewMatcher=true",
        "--dynamic-config-value",
        "matching.enableFairness=true",
    ]
    assert set(FAIRNESS_DYNAMIC_CONFIG) == {"matching.useNewMatcher", "matching.enableFairness"}


def test_a_temporal_binary_without_dynamic_config_starts_without_it(tmp_path: Path) -> None:
    old = tmp_path / "temporal"
    old.write_text("#!/bin/sh\necho 'Usage: temporal server start-dev [flags]'\n")
    old.chmod(old.stat().st_mode | stat.S_IXUSR)
    assert fairness_flags(str(old)) == []
    assert fairness_flags(str(tmp_path / "missing")) == []
