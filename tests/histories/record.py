"""Re-record the histories replayed by tests/test_replay.py.

Run it after changing workflow code on purpose (and say so in the commit):

    python tests/histories/record.py             # enrich_leads.json, dataset_run.json
    python tests/histories/record.py --suffix _v3 --controls

It starts a dev server (with playline's search attributes) and the provider server,
runs the example play over 12 leads and stores the play's and its dataset run's
histories as JSON here. ``--controls`` also pauses the play as it starts, narrows its
window and resumes it, so the history holds the updates and the control signal.
"""

from __future__ import annotations

import argparse
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
from playline.search_attributes import ALL_KEYS  # noqa: E402
from playline.worker import build_worker, connect, import_plays  # noqa: E402


async def main(suffix: str, controls: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="playline-record-"))
    leads = tmp / "leads12.csv"
    rows = list(csv.reader(LEADS_CSV.open()))[:13]
    csv.writer(leads.open("w", newline="")).writerows(rows)
    with ProviderServerProcess(port=0) as provider:
        os.environ["PLAYLINE_PROVIDER_URL"] = provider.base_url
        os.environ["PLAYLINE_DATA_DIRS"] = str(tmp)  # the worker may read the leads there
        os.environ.setdefault("ACME_API_KEY", "record-acme")
        os.environ.setdefault("FIRMO_API_KEY", "record-firmo")
        for waterfall_provider in ("MAILFOX", "PROSPECTR", "VERIFLY"):
            os.environ.setdefault(f"{waterfall_provider}_API_KEY", f"record-{waterfall_provider}")
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(), search_attributes=list(ALL_KEYS)
        )
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
                if controls:
                    await handle.execute_update("pause")
                    await handle.execute_update("set_window", 1)
                    await asyncio.sleep(1)
                    await handle.execute_update("resume")
                await handle.result()
            for workflow_id, name in (
                ("record-enrich-leads", f"enrich_leads{suffix}.json"),
                ("record-enrich-leads/dataset/enriched_leads", f"dataset_run{suffix}.json"),
            ):
                history = await client.get_workflow_handle(workflow_id).fetch_history()
                document = {"workflow_id": workflow_id, "history": history.to_json_dict()}
                (HERE / name).write_text(json.dumps(document, indent=1) + "\n")
                print(f"wrote {HERE / name} ({len(history.events)} events)")
        finally:
            await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suffix", default="", help="file name suffix, e.g. _v3")
    parser.add_argument("--controls", action="store_true", help="pause, narrow, resume")
    cli = parser.parse_args()
    asyncio.run(main(cli.suffix, cli.controls))
