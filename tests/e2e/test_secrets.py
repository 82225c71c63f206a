"""An API key never leaks, even through a provider that echoes it back.

The provider server accepts only a key the worker does not have and quotes the key it
received in every 401 body (a badly behaved provider). A play runs over the CLI with
``--out``; then the worker's key is searched for in everything playline wrote: both
plays' workflow histories (the play and its dataset run), the store files, the worker's
log (at INFO), the exported CSV, and the command's own output.
"""

from __future__ import annotations

import asyncio
import os
import sys

from temporalio.client import Client

from tests.conftest import REPO, TEST_KEYS, start_worker_process
from tests.plays import lead, write_csv

KEY = TEST_KEYS["ACME_API_KEY"]


async def history_text(client: Client, workflow_id: str) -> str:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return history.to_json()


async def test_an_echoed_key_reaches_no_error_history_store_log_export_or_output(
    client, provider, temporal_address, task_queue, tmp_path
) -> None:
    provider.configure(api_keys={"acme": "the-only-key-acme-takes"}, echo_key_in_errors=True)
    home = tmp_path / "home"
    log = tmp_path / "worker.log"
    csv_path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(4)])
    worker = start_worker_process(temporal_address, task_queue, home, log, verbose=True)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "playline",
            "-v",
            "run",
            "t_tool_column",
            "--csv",
            str(csv_path),
            "--out",
            str(tmp_path / "out.csv"),
            "--id",
            "leaky-run",
            "--address",
            temporal_address,
            "--task-queue",
            task_queue,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        worker.terminate()
        worker.wait(timeout=20)
    output = out.decode() + err.decode()
    # Every row failed (the provider refused the key): the run exits 3, its line scrubbed.
    assert proc.returncode == 3, output[-3000:]
    # The provider did echo it: the rows failed with its 401, whose body was scrubbed.
    assert provider.ledger()["unauthorized"] == 4
    exported = (tmp_path / "out.csv").read_text()
    assert "rejected the request with 401" in exported and "[redacted]" in exported

    places = {
        "CLI output": output,
        "export": exported,
        "worker log": log.read_text(),
        "play history": await history_text(client, "leaky-run"),
        "dataset run history": await history_text(client, "leaky-run/dataset/t_rows"),
    }
    for store in sorted(home.rglob("*.db*")):
        places[f"store file {store.name}"] = store.read_bytes().decode("latin-1")
    assert len(places) >= 7  # the two stores' files are there to be searched
    for where, text in places.items():
        assert KEY not in text, f"the API key leaked into the {where}"
    assert "playline" in places["worker log"]  # the log was written, not empty
