"""Budget overshoot under random SIGKILLs: the provider's ledger against the cap, run by run.

    python bench/budget_overshoot.py [--runs 20] [--seed 16] [--pg URL]

Starts a Temporal dev server and the local provider server, then for each run: a fresh
PostgreSQL schema, two ``playline worker`` processes sharing only it and Temporal, the
demo play (``enrich_leads``, 240 leads) with a random ``max_credits`` between 15 and 400
and ``on_budget="stop"`` (so every run ends), and one SIGKILL of a random worker at a
random point of the spend (10-90 % of the cap; the killed worker is started again).
Each run reports the cap, what the provider's ledger charged, the overshoot
(``max(0, ledger - cap)``, which must be 0 every time), the rows done and skipped, and
whether anything was charged twice. Writes ``bench/out/budget_overshoot.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.demo_throughput import DEFAULT_PG, drop_schema, fresh_store  # noqa: E402
from bench.throughput import stop, wait_for_poller  # noqa: E402
from playline import demo  # noqa: E402
from playline.cli.devserver import temporal_binary  # noqa: E402
from playline.cli.stack import DEMO_KEYS  # noqa: E402
from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.provider_server.process import ProviderServerProcess  # noqa: E402
from playline.worker import connect  # noqa: E402


def start_worker(
    address: str, queue: str, home: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    log = home.with_suffix(".log")
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "playline",
            "worker",
            "--address",
            address,
            "--task-queue",
            queue,
            "--home",
            str(home),
        ],
        cwd=home,
        env={**os.environ, **DEMO_KEYS, **env},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


async def one_run(
    address: str, provider: ProviderServerProcess, store_url: str, tmp: Path, rng: random.Random
) -> dict[str, Any]:
    provider.reset()
    cap = float(rng.randint(15, 400))
    kill_at = cap * rng.uniform(0.1, 0.9)
    queue = f"budget-{uuid.uuid4().hex[:6]}"
    env = {"PLAYLINE_STORE_URL": store_url, "PLAYLINE_PROVIDER_URL": provider.base_url}
    homes = [tmp / f"{queue}-a", tmp / f"{queue}-b"]
    workers = [start_worker(address, queue, home, env) for home in homes]
    client = await connect(address)
    killed: str | None = None
    try:
        for worker in workers:
            await wait_for_poller(client, queue, worker)
        handle = await client.start_workflow(
            "enrich_leads",
            args=[{"csv_path": str(demo.LEADS_CSV)}, RunOptions(max_credits=cap, on_budget="stop")],
            id=f"{queue}-play",
            task_queue=queue,
            result_type=PlayRunResult,
        )
        result_task = asyncio.ensure_future(handle.result())
        while not result_task.done():
            if killed is None and float(provider.ledger()["credits"]) >= kill_at:
                victim = rng.randrange(2)
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(timeout=10)
                killed = f"worker {victim} at {provider.ledger()['credits']:g} credits"
                workers[victim] = start_worker(address, queue, homes[victim], env)
            await asyncio.sleep(0.05)
        result: PlayRunResult = await result_task
    finally:
        for worker in workers:
            if worker.poll() is None:
                stop(worker)
    ledger = await asyncio.to_thread(provider.wait_idle, 60)
    charged = float(ledger["credits"])
    return {
        "cap": cap,
        "ledger_credits": charged,
        "overshoot": max(0.0, charged - cap),
        "killed": killed,
        "rows_ok": result.stats.rows_ok,
        "rows_skipped_budget": result.stats.rows_skipped_budget,
        "double_charged": ledger["double_charged"],
    }


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="playline-budget-"))
    runs: list[dict[str, Any]] = []
    with ProviderServerProcess(port=0) as provider:
        provider.configure(latency_ms=[20, 60])
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(), dev_server_log_level="error"
        )
        try:
            address = env.client.service_client.config.target_host
            for n in range(args.runs):
                url, schema = await fresh_store("postgresql", tmp, args.pg)
                started = time.perf_counter()
                try:
                    run = await one_run(address, provider, url, tmp, rng)
                finally:
                    if schema:
                        await drop_schema(args.pg, schema)
                run["seconds"] = round(time.perf_counter() - started, 1)
                runs.append(run)
                print(f"run {n + 1:2d}: {json.dumps(run)}", flush=True)
        finally:
            await env.shutdown()
    summary = {
        "runs": len(runs),
        "kills": sum(1 for r in runs if r["killed"]),
        "max_overshoot": max(r["overshoot"] for r in runs),
        "runs_over_cap": sum(1 for r in runs if r["overshoot"] > 1e-9),
        "double_charged": sum(r["double_charged"] for r in runs),
        "min_headroom": min(r["cap"] - r["ledger_credits"] for r in runs),
        "detail": runs,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "detail"}, indent=2))
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "budget_overshoot.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--pg", default=DEFAULT_PG)
    asyncio.run(main(parser.parse_args()))
