"""Throughput and scale of playline against the naive Temporal design and the roofs.

Run from the repository root::

    python bench/throughput.py [--rows 20000] [--repeats 3] [--scale 10000,100000,1000000] [--json]

One run starts its own Temporal dev server (the ``temporal`` binary beside this
Python) and the local provider server (unpaced, 0-5 ms latency), generates the CSV
(distinct inputs, one ``email_finder`` call per row) and fixtures it needs under a
temporary directory, and measures, interleaved and repeated (medians with min-max):

``fixture``       playline, fixture mode (``bench_one_call`` from bench/plays.py)
``live``          playline against the provider server; limits that never bind
                  (bench/catalogs/unpaced.toml, ``idempotency = "key"``), so the
                  runtime's own cost shows
``live-none``     the same with ``idempotency = "none"`` (a provider that does not
                  de-duplicate keys): each call's receipt is marked sent before it goes
                  out, the price of never paying twice without the provider's help
``fixture-pg``    ``fixture`` with the stores in PostgreSQL (``--pg-url``, a fresh schema
                  a run) instead of SQLite files
``live-pg``       ``live`` likewise, so PostgreSQL's throughput shows beside SQLite's
``naive``         one activity per call under a window of 200 (bench/naive.py)
``roof-httpx``    asyncio + httpx, 200 in flight, no durability
``roof-aiohttp``  asyncio + aiohttp, 200 in flight, no durability

For each: rows/s (from start to result), worker CPU per row and Temporal server CPU
per row (``/proc/<pid>/stat`` deltas over the run; the roofs have no worker, their
own process is counted). Then the scale runs (``--scale``, fixture mode, one each):
rows/s, the worker's peak RSS, history events per 1,000 rows, the most events and
bytes of any one workflow run, and the largest payload in any history.

Every figure is printed as a table; ``--json`` prints one JSON object instead, with
the same-run ratios under ``fixture_vs_naive``, ``live_vs_naive``,
``live_vs_aiohttp_roof``, ``live_none_vs_live``, ``fixture_pg_vs_fixture`` and
``live_pg_vs_live``. JSON also goes to
bench/out/throughput-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

#: the checkout whose playline is measured (bench/revisions.py runs this script against
#: an older checkout by setting PLAYLINE_BENCH_CHECKOUT, so both get the same designs)
REPO = Path(os.environ.get("PLAYLINE_BENCH_CHECKOUT") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(REPO))

from temporalio.api.common.v1 import Payload  # noqa: E402
from temporalio.client import Client  # noqa: E402

from playline.cli.devserver import DevServer  # noqa: E402
from playline.contract import PlayRunResult, RunOptions  # noqa: E402
from playline.provider_server.fake_data import find_email  # noqa: E402
from playline.provider_server.process import ProviderServerProcess  # noqa: E402

try:  # an older checkout (bench/revisions.py --script-of after) kept it elsewhere
    from playline.sockets import free_port
except ImportError:  # pragma: no cover
    from playline.provider_server.process import free_port  # type: ignore[attr-defined,no-redef]
from playline.worker import connect  # noqa: E402

DESIGNS = (
    "fixture",
    "live",
    "live-none",
    "fixture-pg",
    "live-pg",
    "naive",
    "roof-httpx",
    "roof-aiohttp",
)
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
UNPACED = REPO / "bench" / "catalogs" / "unpaced.toml"
KEYS = {"ACME_API_KEY": "bench-acme-key", "FIRMO_API_KEY": "bench-firmo-key"}
OUT = REPO / "bench" / "out"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROOF_CONCURRENCY = 200
#: Temporal's warning thresholds per workflow run.
EVENTS_WARN, BYTES_WARN = 10_240, 10 * 1024 * 1024


def give_up_after(rows: int) -> timedelta:
    """A run that stalls (a failing workflow task retries forever) ends the benchmark."""
    return timedelta(seconds=600 + rows / 20)


# ---------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_process(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **KEYS, **env},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def wait_for_poller(client: Client, task_queue: str, proc: subprocess.Popen[bytes]) -> None:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode} before polling")
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        if response.pollers:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"no worker polled {task_queue}")


def pg_schema(url: str, schema: str, *, create: bool) -> None:
    """Create (or drop) the PostgreSQL schema one ``-pg`` run keeps its stores in."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if create:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        else:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# ---------------------------------------------------------------- data


def write_leads(path: Path, rows: int, tag: str) -> None:
    """``rows`` leads with distinct inputs (no two rows share a call)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["lead_id", "first_name", "last_name", "company_domain"])
        for i in range(rows):
            writer.writerow([f"{tag}{i:07d}", f"F{i}", f"L{tag}{i}", f"d{i % 5000}.example"])


def write_fixtures(csv_path: Path, path: Path) -> None:
    with csv_path.open(newline="") as src, path.open("w") as out:
        for row in csv.DictReader(src):
            person = {
                "first_name": row["first_name"],
                "last_name": row["last_name"],
                "domain": row["company_domain"],
            }
            result = find_email(**person)
            out.write(json.dumps({"tool": "email_finder", "input": person, "result": result}))
            out.write("\n")


# ---------------------------------------------------------------- histories


def _payloads(message: Any) -> list[int]:
    """The sizes of every Payload inside a protobuf message, recursively."""
    sizes: list[int] = []
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        items = value if field.is_repeated else [value]
        if field.message_type.GetOptions().map_entry:
            items = list(value.values()) if hasattr(value, "values") else []
            if items and not hasattr(items[0], "ListFields"):
                continue
        for item in items:
            if isinstance(item, Payload):
                sizes.append(item.ByteSize())
            elif hasattr(item, "ListFields"):
                sizes.extend(_payloads(item))
    return sizes


async def history_figures(client: Client, play_id: str, rows: int) -> dict[str, Any]:
    """Events per 1,000 rows, the largest run (events, bytes) and the largest payload."""
    runs = [
        (w.id, w.run_id)
        async for w in client.list_workflows(
            f'WorkflowId = "{play_id}" OR WorkflowId STARTS_WITH "{play_id}/"'
        )
    ]
    events = 0
    most_events = most_bytes = largest_payload = 0
    for workflow_id, run_id in runs:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        size = sum(e.ByteSize() for e in history.events)
        events += len(history.events)
        most_events = max(most_events, len(history.events))
        most_bytes = max(most_bytes, size)
        for event in history.events:
            largest_payload = max([largest_payload, *_payloads(event)])
    return {
        "workflow_runs": len(runs),
        "events_per_1000_rows": 1000 * events / rows,
        "most_events_in_a_run": most_events,
        "most_bytes_in_a_run": most_bytes,
        "largest_payload_bytes": largest_payload,
        "within_warning_limits": most_events < EVENTS_WARN and most_bytes < BYTES_WARN,
    }


# ---------------------------------------------------------------- designs


class Bench:
    def __init__(
        self,
        work: Path,
        server: DevServer,
        provider: ProviderServerProcess,
        pg_url: str = PG_URL,
    ) -> None:
        self.work = work
        self.pg_url = pg_url
        self.server = server
        self.provider = provider
        self.client: Client | None = None

    async def playline(
        self, mode: str, csv_path: Path, rows: int, fixtures: Path | None, history: bool = False
    ) -> dict[str, Any]:
        queue = f"tp-{uuid.uuid4().hex[:8]}"
        home = self.work / f"home-{queue}"
        catalog = UNPACED
        if mode == "live-none":
            catalog = self.work / "unpaced-none.toml"
            text = UNPACED.read_text().replace('idempotency = "key"', 'idempotency = "none"')
            catalog.write_text(text)
        env = {
            "PLAYLINE_CATALOG": str(catalog),
            "PLAYLINE_PROVIDER_URL": self.provider.base_url,
            "PLAYLINE_DATA_DIRS": str(self.work),  # the generated CSVs and fixtures
        }
        schema = None
        if mode.endswith("-pg"):
            schema = f"bench_{queue.replace('-', '_')}"
            pg_schema(self.pg_url, schema, create=True)
            env["PLAYLINE_STORE_URL"] = f"{self.pg_url}?options=-csearch_path%3D{schema}"
            mode = mode.removesuffix("-pg")
        proc = start_process(
            [
                sys.executable,
                "-m",
                "playline",
                "worker",
                "--address",
                self.server.address,
                "--task-queue",
                queue,
                "--home",
                str(home),
                "--plays",
                "bench.plays",
            ],
            env,
            self.work / f"worker-{queue}.log",
        )
        try:
            assert self.client is not None
            await wait_for_poller(self.client, queue, proc)
            options = (
                RunOptions(integration_mode="fixture", fixtures=[str(fixtures)])
                if mode == "fixture"
                else RunOptions()
            )
            play_id = f"bench-{mode}-{queue}"
            worker_cpu, server_cpu = cpu_seconds(proc.pid), cpu_seconds(self.server.pid)
            started = time.perf_counter()
            result: PlayRunResult = await self.client.execute_workflow(
                "bench_one_call",
                args=[{"csv_path": str(csv_path), "dataset": queue}, options],
                id=play_id,
                task_queue=queue,
                result_type=PlayRunResult,
                execution_timeout=give_up_after(rows),
            )
            wall = time.perf_counter() - started
            worker_cpu = cpu_seconds(proc.pid) - worker_cpu
            server_cpu = cpu_seconds(self.server.pid) - server_cpu
            peak = peak_rss_mb(proc.pid)
            if result.stats.rows_ok != rows:
                raise RuntimeError(
                    f"{mode}: {result.stats.rows_ok} of {rows} rows ok: {result.stats.first_error}"
                )
            figures: dict[str, Any] = {
                "rows_per_s": rows / wall,
                "worker_cpu_ms_per_row": 1000 * worker_cpu / rows,
                "server_cpu_ms_per_row": 1000 * server_cpu / rows,
                "wall_s": wall,
                "worker_peak_rss_mb": peak,
            }
            if history:
                figures.update(await history_figures(self.client, play_id, rows))
            return figures
        finally:
            stop(proc)
            shutil.rmtree(home, ignore_errors=True)
            if schema is not None:
                pg_schema(self.pg_url, schema, create=False)

    async def naive(self, csv_path: Path, rows: int) -> dict[str, Any]:
        queue = f"tn-{uuid.uuid4().hex[:8]}"
        out = self.work / f"naive-{queue}.db"
        proc = start_process(
            [
                sys.executable,
                str(REPO / "bench" / "naive.py"),
                "worker",
                "--address",
                self.server.address,
                "--task-queue",
                queue,
                "--out",
                str(out),
            ],
            {},
            self.work / f"naive-{queue}.log",
        )
        try:
            assert self.client is not None
            await wait_for_poller(self.client, queue, proc)
            worker_cpu, server_cpu = cpu_seconds(proc.pid), cpu_seconds(self.server.pid)
            started = time.perf_counter()
            done = await self.client.execute_workflow(
                "naive.Enrich",
                {"csv_path": str(csv_path), "provider_url": self.provider.base_url},
                id=f"naive-{queue}",
                task_queue=queue,
                result_type=int,
                execution_timeout=give_up_after(rows),
            )
            wall = time.perf_counter() - started
            worker_cpu = cpu_seconds(proc.pid) - worker_cpu
            server_cpu = cpu_seconds(self.server.pid) - server_cpu
            import sqlite3

            stored = sqlite3.connect(out).execute("SELECT COUNT(*) FROM results").fetchone()[0]
            if done != rows or stored != rows:
                raise RuntimeError(f"naive: {done} rows processed, {stored} stored of {rows}")
            return {
                "rows_per_s": rows / wall,
                "worker_cpu_ms_per_row": 1000 * worker_cpu / rows,
                "server_cpu_ms_per_row": 1000 * server_cpu / rows,
                "wall_s": wall,
            }
        finally:
            stop(proc)

    def roof(self, kind: str, csv_path: Path, rows: int) -> dict[str, Any]:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--roof",
                kind,
                "--csv",
                str(csv_path),
                "--url",
                self.provider.base_url,
            ],
            env={**os.environ, "PYTHONPATH": str(REPO), **KEYS},
            capture_output=True,
            text=True,
            check=True,
        )
        figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        if figures.pop("rows") != rows:
            raise RuntimeError(f"{kind}: not every row was answered")
        return figures


# ---------------------------------------------------------------- roofs


async def run_roof(kind: str, csv_path: str, url: str) -> dict[str, Any]:
    """No durability: read the CSV, 200 requests in flight, results to a JSONL file."""
    with open(csv_path, newline="") as handle:
        leads = list(csv.DictReader(handle))
    key = os.environ["ACME_API_KEY"]
    counter = itertools.count()
    results: list[str] = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    if kind == "httpx":
        import httpx

        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=32),
            timeout=httpx.Timeout(15.0, connect=5.0),
        )

        async def call(row: dict[str, str]) -> str:
            response = await client.post(
                f"{url}/acme/v1/email/find",
                json={
                    "first_name": row["first_name"],
                    "last_name": row["last_name"],
                    "domain": row["company_domain"],
                },
                headers={"X-Api-Key": key, "Idempotency-Key": f"roof-{row['lead_id']}"},
            )
            response.raise_for_status()
            return str(response.json().get("email"))

        close: Any = client.aclose
    else:
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))

        async def call(row: dict[str, str]) -> str:
            async with session.post(
                f"{url}/acme/v1/email/find",
                json={
                    "first_name": row["first_name"],
                    "last_name": row["last_name"],
                    "domain": row["company_domain"],
                },
                headers={"X-Api-Key": key, "Idempotency-Key": f"roof-{row['lead_id']}"},
            ) as response:
                response.raise_for_status()
                return str((await response.json()).get("email"))

        close = session.close

    async def lane() -> None:
        while (i := next(counter)) < len(leads):
            results.append(await call(leads[i]))

    await asyncio.gather(*(lane() for _ in range(ROOF_CONCURRENCY)))
    with open(csv_path + f".{kind}.jsonl", "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in results)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    await close()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "rows": len(results),
        "rows_per_s": len(results) / wall,
        "worker_cpu_ms_per_row": 1000 * cpu / len(results),
        "server_cpu_ms_per_row": 0.0,
        "wall_s": wall,
    }


# ---------------------------------------------------------------- main


def summarize(samples: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [s[key] for s in samples]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="playline-throughput-"))
    server = DevServer(home=work / "temporal", port=free_port(), ui_port=free_port())
    await server.start()
    provider = ProviderServerProcess(
        {"latency_ms": [0, 5], "max_call_records": 0}, port=0, env=KEYS
    ).start()
    bench = Bench(work, server, provider, args.pg_url)
    try:
        bench.client = await connect(server.address)
        designs = [d for d in args.designs.split(",") if d]
        samples: dict[str, list[dict[str, Any]]] = {d: [] for d in designs}
        for round_no in range(args.repeats):
            order = designs if round_no % 2 == 0 else list(reversed(designs))
            for design in order:
                tag = f"r{round_no}{design[:2]}"
                csv_path = work / f"leads-{tag}.csv"
                write_leads(csv_path, args.rows, tag)  # fresh inputs: no receipt or replay
                fixtures = None
                if design.startswith("fixture"):
                    fixtures = work / f"fixtures-{tag}.jsonl"
                    write_fixtures(csv_path, fixtures)
                provider.reset()
                if design in ("fixture", "live", "live-none", "fixture-pg", "live-pg"):
                    figures = await bench.playline(design, csv_path, args.rows, fixtures)
                elif design == "naive":
                    figures = await bench.naive(csv_path, args.rows)
                else:
                    figures = bench.roof(design.removeprefix("roof-"), csv_path, args.rows)
                samples[design].append(figures)
                print(
                    f"round {round_no + 1} {design:13s} {figures['rows_per_s']:8.0f} rows/s "
                    f"worker {figures['worker_cpu_ms_per_row']:.3f} ms/row "
                    f"server {figures['server_cpu_ms_per_row']:.3f} ms/row",
                    file=sys.stderr,
                )
                csv_path.unlink()
                if fixtures:
                    fixtures.unlink()
        comparison = {
            d: {
                k: summarize(s, k)
                for k in ("rows_per_s", "worker_cpu_ms_per_row", "server_cpu_ms_per_row")
            }
            for d, s in samples.items()
        }
        scale: dict[str, Any] = {}
        for size in [int(s) for s in args.scale.split(",") if s]:
            tag = f"s{size}"
            csv_path = work / f"leads-{tag}.csv"
            fixtures = work / f"fixtures-{tag}.jsonl"
            write_leads(csv_path, size, tag)
            write_fixtures(csv_path, fixtures)
            figures = await bench.playline("fixture", csv_path, size, fixtures, history=True)
            scale[str(size)] = figures
            print(
                f"scale {size:>8} rows: {figures['rows_per_s']:.0f} rows/s, peak RSS "
                f"{figures['worker_peak_rss_mb']:.0f} MB, "
                f"{figures['events_per_1000_rows']:.1f} events/1k rows",
                file=sys.stderr,
            )
            csv_path.unlink()
            fixtures.unlink()

        def ratio(a: str, b: str, key: str = "rows_per_s") -> float | None:
            if a in comparison and b in comparison:
                return comparison[a][key]["median"] / comparison[b][key]["median"]
            return None

        return {
            "command": " ".join(["python", "bench/throughput.py", *sys.argv[1:]]),
            "rows": args.rows,
            "repeats": args.repeats,
            "comparison": comparison,
            "samples": samples,
            "scale": scale,
            "fixture_vs_naive": ratio("fixture", "naive"),
            "live_vs_naive": ratio("live", "naive"),
            "live_vs_aiohttp_roof": ratio("live", "roof-aiohttp"),
            "live_none_vs_live": ratio("live-none", "live"),
            "fixture_pg_vs_fixture": ratio("fixture-pg", "fixture"),
            "live_pg_vs_live": ratio("live-pg", "live"),
            "machine": {"cpus": os.cpu_count(), "load_at_end": os.getloadavg()},
        }
    finally:
        provider.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def print_table(report: dict[str, Any]) -> None:
    print(f"{report['rows']} rows, {report['repeats']} repeats; medians [min-max]\n")
    print("| design | rows/s | worker CPU ms/row | Temporal server CPU ms/row |")
    print("|---|---|---|---|")
    for design, figures in report["comparison"].items():
        cells = [
            f"{f['median']:.{p}f} [{f['min']:.{p}f}-{f['max']:.{p}f}]"
            for f, p in (
                (figures["rows_per_s"], 0),
                (figures["worker_cpu_ms_per_row"], 3),
                (figures["server_cpu_ms_per_row"], 3),
            )
        ]
        print(f"| {design} | " + " | ".join(cells) + " |")
    for key in (
        "fixture_vs_naive",
        "live_vs_naive",
        "live_vs_aiohttp_roof",
        "live_none_vs_live",
        "fixture_pg_vs_fixture",
        "live_pg_vs_live",
    ):
        value = report[key]
        print(f"\n{key}: " + ("-" if value is None else f"{value:.2f}"), end="")
    print()
    if report["scale"]:
        print(
            "\n| fixture rows | rows/s | worker peak RSS MB | events per 1k rows "
            "| most events / bytes in a run | largest payload | under warning limits |"
        )
        print("|---|---|---|---|---|---|---|")
        for size, f in report["scale"].items():
            print(
                f"| {int(size):,} | {f['rows_per_s']:.0f} | {f['worker_peak_rss_mb']:.0f} | "
                f"{f['events_per_1000_rows']:.1f} | {f['most_events_in_a_run']} / "
                f"{f['most_bytes_in_a_run']:,} | {f['largest_payload_bytes']:,} | "
                f"{f['within_warning_limits']} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--designs", default=",".join(DESIGNS))
    parser.add_argument(
        "--scale",
        default="10000,100000,1000000",
        help="fixture-mode scale runs, comma-separated row counts ('' skips)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--pg-url", default=PG_URL, help="the PostgreSQL the -pg designs keep their stores in"
    )
    parser.add_argument("--roof", help=argparse.SUPPRESS)
    parser.add_argument("--csv", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.roof:
        print(json.dumps(asyncio.run(run_roof(args.roof, args.csv, args.url))))
        return 0
    report = asyncio.run(run(args))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"throughput-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
        print(f"\n(JSON: {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
