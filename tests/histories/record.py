"""Re-record the histories replayed by tests/test_replay.py.

Run it after changing workflow code on purpose (and say so in the commit):

    python tests/histories/record.py

It starts a dev server and the provider server, runs the example play over 12
leads and stores the play's and its dataset run's histories as JSON here.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import sys
import tempfile
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from playline.cli.devserver import temporal_binary  # noqa: E402
from playline.config import Settings  # noqa: E402
from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.demo import LEADS_CSV  # noqa: E402
from playline.provider_server.process import ProviderServerProcess  # noqa: E402
from playline.worker import build_worker, connect, import_plays  # noqa: E402


async def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="playline-record-"))
    leads = tmp / "leads12.csv"
    rows = list(csv.reader(LEADS_CSV.open()))[:13]
    csv.writer(leads.open("w", newline="")).writerows(rows)
    with ProviderServerProcess(port=0) as provider:
        os.environ["PLAYLINE_PROVIDER_URL"] = provider.base_url
        os.environ.setdefault("ACME_API_KEY", "record-acme")
        os.environ.setdefault("FIRMO_API_KEY", "record-firmo")
        env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary())
        try:
            address = env.client.service_client.config.target_host
            import_plays([])
            worker_client = await connect(address, settings=Settings.from_env(home=tmp / "home"))
            client = await connect(address)
            async with build_worker(worker_client, task_queue="record"):
                handle = await client.start_workflow(
                    "enrich_leads",
                    args=[{"csv_path": str(leads)}, RunOptions(chunk_size=4)],
                    id="record-enrich-leads",
                    task_queue="record",
                    result_type=PlayRunResult,
                )
                await handle.result()
            for workflow_id, name in (
                ("record-enrich-leads", "enrich_leads.json"),
                ("record-enrich-leads/dataset/enriched_leads", "dataset_run.json"),
            ):
                history = await client.get_workflow_handle(workflow_id).fetch_history()
                document = {"workflow_id": workflow_id, "history": history.to_json_dict()}
                (HERE / name).write_text(json.dumps(document, indent=1) + "\n")
                print(f"wrote {HERE / name} ({len(history.events)} events)")
        finally:
            await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
