"""``playline budgets set|list|get`` as a user runs it: a real subprocess, a real store.

The workers' store is created first (as a worker's start does); the commands then
define budgets in it, and what they print agrees with what the store holds and with
what runs reserved against it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from playline.config import Settings
from playline.stores.backends import open_stores
from playline.stores.budget_ids import NamedBudgetId
from playline.stores.budgets import BudgetLine, period_id
from tests.conftest import REPO


async def playline(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``python -m playline ARGS`` against the SQLite store under ``home``."""
    env = {k: v for k, v in os.environ.items() if k != "PLAYLINE_STORE_URL"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "playline",
        *args,
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def test_set_list_and_get_named_budgets(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    async with await open_stores(settings, create=True):
        pass  # the workers' store, as a worker's start creates it

    made = await playline("budgets", "set", "growth", "--per-day", "500", home=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "growth: 500 credits per day" in made.stdout
    assert (
        await playline("budgets", "set", "ops", "--per-month", "12.5", home=tmp_path)
    ).returncode == 0

    # A run draws on it (as a worker would) ...
    async with await open_stores(settings, create=False) as stores:
        ref = NamedBudgetId("growth").key
        assert await stores.budgets.reserve("call-1", 30, [BudgetLine(ref)]) is None
        assert await stores.budgets.reserve("call-2", 20, [BudgetLine(ref)]) is None
        await stores.budgets.settle("call-1", 7, [ref])

    # ... and the commands show it.
    before = period_id("growth", "day", time.time())
    listed = await playline("budgets", "list", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "NAME", "PERIOD", "LIMIT", "SPENT", "RESERVED", "REMAINING", "CURRENT"
    ]  # fmt: skip
    assert lines[1].split()[:6] == ["growth", "day", "500", "7", "20", "473"]
    # the current UTC day (the run, at most, crossed midnight since)
    assert before <= lines[1].split()[6] <= period_id("growth", "day", time.time())
    assert lines[2].split()[:6] == ["ops", "month", "12.5", "0", "0", "12.5"]

    got = await playline("budgets", "get", "growth", "--json", home=tmp_path)
    assert got.returncode == 0, got.stderr
    document = json.loads(got.stdout)
    assert document["name"] == "growth" and document["period"] == "day"
    assert (document["limit"], document["spent"], document["reserved"]) == (500, 7, 20)
    assert document["current_period"].startswith("named:growth@")

    # Setting it again changes the limit of the period in progress.
    assert (
        await playline("budgets", "set", "growth", "--per-day", "40", home=tmp_path)
    ).returncode == 0
    shown = await playline("budgets", "get", "growth", home=tmp_path)
    assert "7 spent, 20 reserved, 13 of 40 left" in shown.stdout


async def test_bad_command_lines_fail_in_one_line_with_exit_2(tmp_path: Path) -> None:
    async with await open_stores(Settings(home=tmp_path), create=True):
        pass
    for args, needle in (
        (["set", "growth"], "exactly one of --per-day N and --per-month N"),
        (["set", "growth", "--per-day", "5", "--per-month", "9"], "exactly one"),
        (["set", "growth", "--per-day", "0"], "--per-day must be a number of credits > 0"),
        (["set", "growth", "--per-month", "lots"], "--per-month must be a number"),
        (["set", "growth", "--per-day", "nan"], "> 0"),
        (["set", "no spaces", "--per-day", "5"], "is not allowed"),
    ):
        result = await playline("budgets", *args, home=tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.strip().count("\n") == 0 and needle in result.stderr, result.stderr
        assert "Traceback" not in result.stderr

    unknown = await playline("budgets", "get", "nobody", home=tmp_path)
    assert unknown.returncode == 1
    assert unknown.stderr.strip().count("\n") == 0
    assert "playline budgets set nobody" in unknown.stderr
    empty = await playline("budgets", "list", home=tmp_path)
    assert empty.returncode == 0 and "no named budgets yet" in empty.stdout


async def test_without_the_workers_store_it_says_where_it_looked(tmp_path: Path) -> None:
    result = await playline("budgets", "set", "growth", "--per-day", "5", home=tmp_path / "none")

    assert result.returncode == 1
    assert "no playline store at" in result.stderr
    assert not (tmp_path / "none" / "budgets.db").exists()


async def test_release_frees_what_an_ended_run_left_reserved(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    async with await open_stores(settings, create=True) as stores:
        await stores.budgets.define("ops", period="month", limit=20)
        ref = NamedBudgetId("ops").key
        assert await stores.budgets.reserve("row:ref#1", 20, [BudgetLine(ref)], run="p9") is None

    freed = await playline("budgets", "release", "--run", "p9", home=tmp_path)
    assert freed.returncode == 0, freed.stderr
    lines = freed.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run p9: released 0"), lines
    assert "settled 1 at what they used (0)" in lines[0]
    async with await open_stores(settings, create=False) as stores:
        state = await stores.budgets.state(NamedBudgetId("ops").key)
    assert state is not None and (state.spent, state.reserved) == (0, 0)
