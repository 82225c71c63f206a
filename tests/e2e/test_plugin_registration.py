"""A worker or replayer given plays by the caller still takes ``PlaylinePlugin``.

The SDK refuses two workflows of one name, so the plugin adds only the plays (and
``playline.DatasetRun``) the caller did not pass: ``Worker(client,
workflows=[my_play])`` on a client carrying the plugin runs plays end to end, and
``Replayer(workflows=[my_play], plugins=[PlaylinePlugin()])`` replays recorded
histories.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Replayer, Worker

import playline
from playline.config import Settings
from playline.demo.enrich_leads import enrich_leads
from playline.plugin import PlaylinePlugin
from playline.replay import load_history
from playline.workflows.dataset_run import DatasetRunWorkflow
from tests.conftest import REPO, new_id
from tests.plays import ScalarInput, ToolColumnInput, lead, t_scalar, t_tool_column, write_csv

HISTORIES = REPO / "tests" / "histories"


async def test_a_worker_given_plays_of_its_own_runs_them_and_the_plugin_adds_the_rest(
    temporal_address: str, provider, task_queue: str, home: Path, tmp_path: Path
) -> None:
    settings = Settings.from_env(home=home, data_dirs=(tmp_path,))
    client = await Client.connect(temporal_address, plugins=[PlaylinePlugin(settings=settings)])
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(4)])
    worker = Worker(client, task_queue=task_queue, workflows=[t_tool_column, DatasetRunWorkflow])
    async with worker:
        given = await playline.execute_play(
            client,
            t_tool_column,
            ToolColumnInput(csv_path=str(csv_path)),
            id=new_id("own-plays"),
            task_queue=task_queue,
        )
        added = await playline.execute_play(
            client,
            t_scalar,
            ScalarInput(domain="co1.example"),
            id=new_id("added-play"),
            task_queue=task_queue,
        )
    assert given.output is not None and given.output.rows == 4
    assert added.output is not None and added.output.step == {"sum": 5}


async def test_a_replayer_given_the_play_replays_recorded_histories_with_the_plugin() -> None:
    replayer = Replayer(workflows=[enrich_leads, DatasetRunWorkflow], plugins=[PlaylinePlugin()])
    for name in ("enrich_leads.json", "dataset_run.json"):
        result = await replayer.replay_workflow(
            load_history(HISTORIES / name), raise_on_replay_failure=False
        )
        assert result.replay_failure is None, (name, result.replay_failure)
