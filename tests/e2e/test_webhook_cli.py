"""``playline webhook`` as a user runs it: a real subprocess over the workers' SQLite store
and a real Temporal dev server.

A job is opened in the store as a worker would open it, with a tiny workflow as its
waiter (a ``jobs_ready`` signal completes it). A signed delivery posted to the receiver
lands in the store as the job's status and wakes the workflow; the same delivery again
changes nothing; a delivery whose waiter is gone is still taken. Bad input (a missing
catalog, a catalog without webhook tools, no store, a port in use) is one line and exit 1.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from playline.config import Settings
from playline.stores.backends import open_stores
from playline.stores.jobs import Job
from tests.conftest import REPO, new_id
from tests.webhooks import SECRET, SECRET_ENV, body_bytes, finished, open_job, signed, write_catalog

LISTENING = re.compile(r"webhook receiver on (http://127\.0\.0\.1:(\d+))")


@workflow.defn(name="WebhookTestWaiter")
class WaitsForJobs:
    """Stands for a dataset run waiting on jobs: done once told ``jobs_ready``."""

    def __init__(self) -> None:
        self.told = 0

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self.told > 0)
        return self.told

    @workflow.signal(name="jobs_ready")
    def jobs_ready(self) -> None:
        self.told += 1


def environment(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLAYLINE_STORE_URL", SECRET_ENV)}
    return {**env, "PYTHONPATH": str(REPO), "PLAYLINE_HOME": str(home), **extra}


async def playline(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m playline ARGS`` run to its end."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "playline",
        *args,
        cwd=REPO,
        env=environment(home, **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


@asynccontextmanager
async def receiver(*args: str, home: Path, **env: str) -> AsyncIterator[tuple[str, str]]:
    """``playline webhook --port 0 ARGS`` running; (its base URL, the line it printed)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "playline",
        "webhook",
        "--port",
        "0",
        *args,
        cwd=REPO,
        env=environment(home, **env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        found = LISTENING.search(line)
        assert found, f"the receiver did not start: {line}{(await proc.stderr.read()).decode()}"
        base = found.group(1)
        async with httpx.AsyncClient(base_url=base) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if (await http.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.returncode is None, "the receiver exited"
                assert time.monotonic() < deadline, "the receiver did not answer /healthz"
                await asyncio.sleep(0.1)
        yield base, line
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 15)


async def test_a_signed_delivery_stores_the_status_and_signals_the_waiting_run(
    temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    catalog = write_catalog(tmp_path / "catalog.toml")
    temporal = await Client.connect(temporal_address)
    workflow_id = new_id("webhook-waiter")
    async with Worker(
        temporal,
        task_queue=task_queue,
        workflows=[WaitsForJobs],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await temporal.start_workflow(
            WaitsForJobs.run, id=workflow_id, task_queue=task_queue
        )
        # The workers' store, and a job in it, as a worker's submit leaves them.
        async with await open_stores(Settings(home=home), create=True) as stores:
            job = await open_job(stores.jobs, waiters=(workflow_id,))

        async with (
            receiver(
                "--catalog",
                str(catalog),
                "--address",
                temporal_address,
                home=home,
                **{SECRET_ENV: SECRET},
            ) as (base, line),
            httpx.AsyncClient(base_url=base) as http,
        ):
            assert f"PLAYLINE_WEBHOOK_URL={base}" in line
            assert "lateco_enrich" in line
            raw = body_bytes(finished())
            url = f"/hooks/lateco/{job.token}"
            answer = await http.post(url, content=raw, headers=signed(raw))
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"ok": True}
            assert await asyncio.wait_for(handle.result(), 30) == 1

            stored = await stored_job(home, job.key)
            assert (stored.state, stored.status) == ("done", finished())

            again = await http.post(url, content=raw, headers=signed(raw))
            assert again.json() == {"duplicate": True}
            assert await stored_job(home, job.key) == stored

            # A new delivery once the run is gone: taken (the done job stays as it is),
            # the failed signal only logged.
            late = body_bytes({**finished(), "note": "sent twice by the provider"})
            answer = await http.post(url, content=late, headers=signed(late))
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"ok": True}
            assert await stored_job(home, job.key) == stored

            forged = await http.post(url, content=raw, headers=signed(raw, secret="guess"))
            assert forged.status_code == 401


async def stored_job(home: Path, key: str) -> Job:
    async with await open_stores(Settings(home=home), create=False) as stores:
        job = await stores.jobs.get(key)
    assert job is not None
    return job


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    return lines[0]


async def test_bad_input_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    catalog = write_catalog(tmp_path / "catalog.toml")

    missing = await playline("webhook", "--catalog", str(tmp_path / "none.toml"), home=home)
    assert "none.toml does not exist" in one_line_error(missing)

    demo = await playline("webhook", home=home, PLAYLINE_CATALOG="")
    assert "has no tool taking webhooks" in one_line_error(demo)

    no_store = await playline("webhook", "--catalog", str(catalog), home=home)
    assert f"no playline store at {home}" in one_line_error(no_store)

    async with await open_stores(Settings(home=home), create=True):
        pass
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = await playline("webhook", "--catalog", str(catalog), "--port", str(port), home=home)
    text = one_line_error(busy)
    assert f"cannot listen on http://127.0.0.1:{port}: the port is in use" in text
