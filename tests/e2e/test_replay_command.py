"""Replay testing as a feature: a recorded play replays after a patched change, not after an
unpatched one, through ``playline.testing`` and through ``playline replay``.

The history is recorded here, on the real dev server, from ``tests.evolution.v1``;
the replays run the other versions of the same play (``patched``, ``unpatched``).
The command runs as a user runs it: a ``playline`` process importing ``--plays``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from playline.cli.devserver import temporal_binary
from playline.config import Settings
from playline.plugin import PlaylinePlugin
from playline.testing import assert_replays, replay_files
from tests.conftest import REPO, new_id
from tests.evolution import patched, unpatched, v1
from tests.evolution.steps import EvolvingInput


async def run_version(
    address: str, task_queue: str, home: Path, version: type, workflow_id: str
) -> None:
    """Run one version of ``t_evolving`` on a worker registering exactly that version."""
    client = await Client.connect(
        address, plugins=[PlaylinePlugin(plays=[version], settings=Settings.from_env(home=home))]
    )
    async with Worker(client, task_queue=task_queue):
        await client.execute_workflow(
            version.run, EvolvingInput(name="ada"), id=workflow_id, task_queue=task_queue
        )


@pytest.fixture
async def recorded(temporal_address, client, task_queue, home, tmp_path) -> tuple[str, Path]:
    """The v1 play's workflow id and its history as a JSON file, as `temporal` exports it."""
    workflow_id = new_id("evolving-v1")
    await run_version(temporal_address, task_queue, home, v1.t_evolving, workflow_id)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    path = tmp_path / "histories" / "evolving_v1.json"
    path.parent.mkdir()
    path.write_text(json.dumps(history.to_json_dict()))
    return workflow_id, path


def playline_replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "playline", "replay", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_an_old_history_replays_after_a_patched_change_and_not_after_an_unpatched_one(
    recorded,
) -> None:
    workflow_id, path = recorded
    [same] = await assert_replays(path, plays=[v1.t_evolving])
    [guarded] = await assert_replays(path.parent, plays=[patched.t_evolving])
    assert (same.verdict, guarded.verdict) == ("ok", "ok")
    assert guarded.workflow_type == "t_evolving" and guarded.source == str(path)

    [broken] = await replay_files(path, plays=[unpatched.t_evolving])
    assert broken.verdict == "nondeterministic"
    assert "TMPRL1100" in broken.message and "workflow.patched" in broken.message
    with pytest.raises(AssertionError, match=rf"(?s)1 of 1 recorded histories.*{workflow_id}"):
        await assert_replays(path, plays=[unpatched.t_evolving])


async def test_a_run_of_the_patched_version_replays_against_the_patched_code(
    temporal_address, client, task_queue, home, tmp_path
) -> None:
    workflow_id = new_id("evolving-patched")
    await run_version(temporal_address, task_queue, home, patched.t_evolving, workflow_id)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    path = tmp_path / "patched.json"
    path.write_text(json.dumps({"workflow_id": workflow_id, "history": history.to_json_dict()}))

    [outcome] = await assert_replays(path, plays=[patched.t_evolving])
    assert outcome.workflow_id == workflow_id
    # The new run took the new path; the old code cannot replay it.
    [old] = await replay_files(path, plays=[v1.t_evolving])
    assert old.verdict == "nondeterministic"


async def test_playline_replay_reports_each_workflow_and_fails_on_non_determinism(
    recorded,
) -> None:
    workflow_id, path = recorded
    ok = playline_replay("--file", str(path), "--plays", "tests.evolution.patched")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("OK") and workflow_id in ok.stdout
    assert "replayed 1 workflow(s): 1 ok" in ok.stderr

    bad = playline_replay("--dir", str(path.parent), "--plays", "tests.evolution.unpatched")
    assert bad.returncode == 1
    assert bad.stdout.startswith("NONDETERMINISTIC") and workflow_id in bad.stdout
    assert "TMPRL1100" in bad.stdout and "Traceback" not in bad.stdout + bad.stderr

    missing = playline_replay("--file", str(path))
    assert missing.returncode == 1
    assert "UNREGISTERED" in missing.stdout
    assert "'t_evolving' is not registered: import the module that declares it" in missing.stdout


async def test_playline_replay_fetches_histories_by_query_and_reads_temporal_exports(
    recorded, temporal_address, tmp_path
) -> None:
    workflow_id, _ = recorded
    by_query = playline_replay(
        "--query",
        f'WorkflowId="{workflow_id}"',
        "--address",
        temporal_address,
        "--plays",
        "tests.evolution.patched",
    )
    assert by_query.returncode == 0, by_query.stdout + by_query.stderr
    assert f"t_evolving  {workflow_id}" in by_query.stdout

    exported = tmp_path / "shown.json"
    with exported.open("w") as handle:
        subprocess.run(
            [
                temporal_binary(),
                "workflow",
                "show",
                "--address",
                temporal_address,
                "--workflow-id",
                workflow_id,
                "--output",
                "json",
            ],
            stdout=handle,
            check=True,
            timeout=60,
        )
    shown = playline_replay("--file", str(exported), "--plays", "tests.evolution.unpatched")
    assert shown.returncode == 1 and "NONDETERMINISTIC" in shown.stdout

    nothing = playline_replay(
        "--query", 'WorkflowId="no-such-workflow"', "--address", temporal_address
    )
    assert nothing.returncode == 1
    assert "no workflow matches the query" in nothing.stdout + nothing.stderr


def test_playline_replay_passes_on_the_repositorys_recorded_histories() -> None:
    done = playline_replay("--dir", "tests/histories")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("OK") == len(list((REPO / "tests" / "histories").glob("*.json")))
