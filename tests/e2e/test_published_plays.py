"""Each worker publishes the plays it registered on its task queue, so clients know
what the workers have, not only what they could import themselves."""

from __future__ import annotations

import asyncio
import json
import time

from playline.published_plays import read_published_plays
from playline.workflows.registry import registry_id
from tests.e2e.test_cli import playline


async def test_the_workers_plays_are_published_and_listed(
    client, worker, temporal_address: str, task_queue: str, home
) -> None:
    common = ("--address", temporal_address, "--task-queue", task_queue)
    async with worker():
        deadline = time.monotonic() + 60
        published = None
        while published is None and time.monotonic() < deadline:
            published = await read_published_plays(client, task_queue)
            await asyncio.sleep(0.2)
        assert published is not None
        assert {"enrich_leads", "t_tool_column", "t_scalar"} <= set(published.plays)
        assert "playline.DatasetRun" not in published.plays
        assert "playline.Plays" not in published.plays
        [identity] = published.live
        assert published.plays["t_tool_column"] == [identity]

        # `plays list` run from a process that imports none of them: the workers' plays.
        listing = await playline("plays", "list", "--json", *common, home=home)
        assert listing.returncode == 0, listing.stderr
        document = json.loads(listing.stdout)
        assert document["task_queue"] == task_queue
        plays = {p["play"]: p["workers"] for p in document["workers"]["plays"]}
        assert plays["t_tool_column"] == [identity]
        text = await playline("plays", "list", *common, home=home)
        assert f"registered by the workers on task queue {task_queue}" in text.stdout
        assert "t_tool_column" in text.stdout

    # The registry is one small workflow per task queue, on the queue's own workers.
    description = await client.get_workflow_handle(registry_id(task_queue)).describe()
    assert description.workflow_type == "playline.Plays"
    assert description.task_queue == task_queue
