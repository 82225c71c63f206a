"""``playline.testing`` as a user meets it: a project of their own, tested with pytest.

A small project (a plays module, a ``conftest.py`` enabling ``playline.testing``, a
test module) is written to a temporary directory and pytest runs it in a separate
process, as the user's CI would: its session starts its own dev server, its test
runs the play on the fixture's worker, records the history and replays it.
pytest-asyncio runs in strict mode there, the stricter of its two modes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLAYS = """
from pydantic import BaseModel

from playline import PlayContext, play, resolver


class CountInput(BaseModel):
    words: list[str]


class CountOutput(BaseModel):
    letters: int


@resolver
def count_letters(words: list[str]) -> int:
    return sum(len(w) for w in words)


@play(name="user_count_letters")
async def user_count_letters(ctx: PlayContext, input: CountInput) -> CountOutput:
    letters = await ctx.step("count", count_letters, input.words)
    return CountOutput(letters=letters)
"""

CONFTEST = """
pytest_plugins = ["playline.testing"]
"""

TESTS = """
import json

import pytest

from my_plays import CountInput, CountOutput, user_count_letters
from playline.testing import PlaylineEnv, assert_replays


@pytest.mark.asyncio
async def test_the_play_runs_and_its_history_replays(playline_env: PlaylineEnv, tmp_path) -> None:
    handle = await playline_env.start(user_count_letters, CountInput(words=["ab", "cde"]))
    result = await handle.result()
    assert isinstance(result.output, CountOutput)
    assert result.output.letters == 5
    assert result.play == "user_count_letters"

    history = await handle.fetch_history()
    (tmp_path / "count.json").write_text(json.dumps(history.to_json_dict()))
    [outcome] = await assert_replays(tmp_path)
    assert outcome.workflow_type == "user_count_letters"


@pytest.mark.asyncio
async def test_each_test_gets_its_own_queue_and_home(playline_env: PlaylineEnv, tmp_path) -> None:
    assert playline_env.task_queue.startswith("playline-test-")
    assert playline_env.settings.home == tmp_path / "playline"
    result = await playline_env.execute(user_count_letters, CountInput(words=[]))
    assert result.output is not None and result.output.letters == 0
"""

INI = """
[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
"""


def test_a_users_project_tests_its_plays_with_the_playline_fixtures(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name, text in {
        "my_plays.py": PLAYS,
        "conftest.py": CONFTEST,
        "test_my_plays.py": TESTS,
        "pytest.ini": INI,
    }.items():
        (project / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout
