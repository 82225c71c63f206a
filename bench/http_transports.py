"""HTTP transports under playline's provider client, side by side (throughput issue, item 1).

Run from the repository root::

    python bench/http_transports.py [--requests 6000] [--concurrency 200] [--repeats 3]

Each variant runs in a fresh client process that sends ``--requests`` POSTs with
``--concurrency`` in flight to the local provider server (no latency, no limits),
through httpx's API exactly as playline does (JSON body, API key and
``Idempotency-Key`` headers, a per-request timeout). Variants are interleaved and
repeated; the client process's own CPU time per request (user + system, from
``getrusage``) is the figure that matters, wall-clock requests/s is reported beside it.

``httpx``           httpx.AsyncClient, playline's pool (256 connections, 32 kept alive)
``httpx-pool200``   the same with 200 kept alive
``httpx-sharded4``  four httpx clients, requests spread round-robin
``httpx-aiohttp``   httpx's API over aiohttp (``httpx_aiohttp.HttpxAiohttpClient``)
``httpx-h2``        HTTP/2 (prior knowledge) to the same app served by hypercorn
``aiohttp``         aiohttp.ClientSession directly: the roof, without httpx's API

JSON goes to bench/out/http-<timestamp>.json; paste the table into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS = (
    "httpx",
    "httpx-pool200",
    "httpx-sharded4",
    "httpx-aiohttp",
    "httpx-h2",
    "aiohttp",
)
PATH = "/acme/v1/email/find"
BODY = {"first_name": "Ada", "last_name": "Lovelace", "domain": "example.com"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the client side (one variant per process) ---------------------------------


def _headers(i: int) -> dict[str, str]:
    return {"X-Api-Key": "bench-key", "Idempotency-Key": f"{uuid.uuid4().hex}-{i}"}


async def _drive(send: Any, n: int, concurrency: int) -> None:
    counter = itertools.count()

    async def lane() -> None:
        while (i := next(counter)) < n:
            status = await send(i)
            if status != 200:
                raise RuntimeError(f"request {i} answered {status}")

    await asyncio.gather(*(lane() for _ in range(concurrency)))


async def run_variant(variant: str, url: str, n: int, concurrency: int) -> dict[str, float]:
    import httpx

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=32)
    timeout = httpx.Timeout(15.0, connect=5.0)
    target = url + PATH
    clients: list[Any] = []
    if variant in ("httpx", "httpx-h2"):
        h2 = variant == "httpx-h2"
        clients = [httpx.AsyncClient(limits=limits, timeout=timeout, http1=not h2, http2=h2)]
    elif variant == "httpx-pool200":
        clients = [
            httpx.AsyncClient(
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=200),
                timeout=timeout,
            )
        ]
    elif variant == "httpx-sharded4":
        shard = httpx.Limits(max_connections=64, max_keepalive_connections=16)
        clients = [httpx.AsyncClient(limits=shard, timeout=timeout) for _ in range(4)]
    elif variant == "httpx-aiohttp":
        from httpx_aiohttp import HttpxAiohttpClient

        clients = [HttpxAiohttpClient(limits=limits, timeout=timeout)]
    if clients:

        async def send(i: int) -> int:
            client = clients[i % len(clients)]
            response = await client.post(target, json=BODY, headers=_headers(i))
            response.json()
            return int(response.status_code)

    else:  # aiohttp, the roof
        import aiohttp

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256),
            timeout=aiohttp.ClientTimeout(sock_read=15.0, sock_connect=5.0),
        )

        async def send(i: int) -> int:
            async with session.post(target, json=BODY, headers=_headers(i)) as response:
                await response.json()
                return response.status

    await _drive(send, min(200, n), concurrency)  # warm up connections
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await _drive(send, n, concurrency)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for client in clients:
        await client.aclose()
    if not clients:
        await session.close()
    return {"rps": n / wall, "cpu_ms_per_request": 1000 * cpu / n, "wall_s": wall}


# -- the servers ------------------------------------------------------------------


def start_uvicorn() -> tuple[Any, str]:
    from playline.provider_server.process import ProviderServerProcess

    server = ProviderServerProcess({"latency_ms": [0, 0], "max_call_records": 0}, port=0)
    server.start()
    return server, server.base_url


def start_hypercorn() -> tuple[subprocess.Popen[bytes], str]:
    """The same provider app under hypercorn, which speaks HTTP/2 without TLS (h2c)."""
    port = free_port()
    code = (
        "import asyncio, hypercorn.asyncio, hypercorn.config;"
        "from playline.provider_server.app import create_app;"
        "from playline.provider_server.config import ServerConfig;"
        f"c = hypercorn.config.Config(); c.bind = ['127.0.0.1:{port}']; c.loglevel = 'ERROR';"
        "c.keep_alive_timeout = 60; c.h2_max_concurrent_streams = 1000;"
        "asyncio.run(hypercorn.asyncio.serve("
        "create_app(ServerConfig(latency_ms=(0, 0), max_call_records=0)), c))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("hypercorn did not start")


def one_run(variant: str, url: str, n: int, concurrency: int) -> dict[str, Any]:
    """One variant in a fresh process; a failed run is reported, not hidden."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--one",
            variant,
            "--url",
            url,
            "--requests",
            str(n),
            "--concurrency",
            str(concurrency),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(
            json.dumps(
                asyncio.run(run_variant(args.one, args.url, args.requests, args.concurrency))
            )
        )
        return 0
    variants = [v for v in args.variants.split(",") if v]
    uvicorn_server, uvicorn_url = start_uvicorn()
    h2_proc, h2_url = start_hypercorn()
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    try:
        for round_no in range(args.repeats):
            order = variants if round_no % 2 == 0 else list(reversed(variants))
            for variant in order:
                url = h2_url if variant == "httpx-h2" else uvicorn_url
                uvicorn_server.reset()
                result = one_run(variant, url, args.requests, args.concurrency)
                results[variant].append(result)
                if "error" in result:
                    print(
                        f"round {round_no + 1} {variant:15s} FAILED: {result['error']}",
                        file=sys.stderr,
                    )
                    continue
                print(
                    f"round {round_no + 1} {variant:15s} {result['rps']:8.0f} req/s "
                    f"{result['cpu_ms_per_request']:.3f} ms CPU/request",
                    file=sys.stderr,
                )
    finally:
        uvicorn_server.stop()
        h2_proc.terminate()
        h2_proc.wait(timeout=10)
    ok = {v: [r for r in rs if "error" not in r] for v, rs in results.items()}
    base = (
        statistics.median(r["cpu_ms_per_request"] for r in ok["httpx"]) if ok.get("httpx") else None
    )
    print(
        "| variant | client CPU per request (ms), median [min-max] | req/s, median [min-max] "
        "| CPU vs httpx |"
    )
    print("|---|---|---|---|")
    summary: dict[str, Any] = {}
    for variant in variants:
        failed = [r["error"] for r in results[variant] if "error" in r]
        if not ok[variant]:
            print(f"| {variant} | failed in every run: {failed[0]} | - | - |")
            summary[variant] = {"errors": failed}
            continue
        cpu = [r["cpu_ms_per_request"] for r in ok[variant]]
        rps = [r["rps"] for r in ok[variant]]
        med = statistics.median(cpu)
        ratio = f"{med / base:.2f}x" if base else "-"
        print(
            f"| {variant} | {med:.3f} [{min(cpu):.3f}-{max(cpu):.3f}] | "
            f"{statistics.median(rps):.0f} [{min(rps):.0f}-{max(rps):.0f}] | {ratio} |"
        )
        summary[variant] = {"cpu_ms_per_request": cpu, "rps": rps, "errors": failed}
    out_dir = REPO / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"http-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args), "results": summary}, indent=1))
    print(f"\n(JSON: {path})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
