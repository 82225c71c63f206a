"""PostgreSQL restarted in the middle of a run: nothing paid twice, every row once.

Real Temporal dev server, a real worker (in this process) on PostgreSQL stores (a
schema of its own), real HTTP to the provider server, which here *ignores*
``Idempotency-Key`` as most enrichment APIs do: any call sent twice is charged twice.
While chunks are in flight the cluster is restarted (``pg_ctlcluster ... restart``,
fast mode: every connection is cut, transactions in progress roll back); the run
must go on by itself once the server is back. Run with the demo catalog's tools
(``idempotency = "key"``) and with a copy declaring ``"none"``.

The restart is short (a second or two) but it cuts every connection on the
machine's PostgreSQL: the test starts it again and waits for it whatever happens.
"""

from __future__ import annotations

import asyncio
import csv
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.datasets import export_run
from playline.stores.backends import open_stores
from tests.conftest import core_charged, demo_catalog
from tests.e2e.test_crash_recovery import first_rows, wait_for
from tests.pg import SERVER, schema_url
from tests.plays import read_csv_rows

#: It restarts the machine's PostgreSQL: run alone (``pytest -n 0 -m pg_restart``).
pytestmark = [pytest.mark.postgres, pytest.mark.pg_restart]

ROWS = 150
CLUSTER = "main"


def _cluster_version() -> str | None:
    """The PostgreSQL version whose ``main`` cluster pg_ctlcluster can restart here."""
    if shutil.which("pg_ctlcluster") is None or shutil.which("pg_isready") is None:
        return None
    if os.geteuid() != 0:
        return None
    try:
        versions = sorted(
            (p.name for p in Path("/etc/postgresql").iterdir() if (p / CLUSTER).is_dir()),
            key=lambda v: [int(x) if x.isdigit() else x for x in v.split(".")],
        )
    except OSError:
        return None
    return versions[-1] if versions else None


async def _run(*argv: str, timeout_s: float = 60.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"{argv[0]} timed out"
    return proc.returncode or 0, out.decode(errors="replace")


async def _postgres_ready(timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code, _ = await _run("pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432", timeout_s=10)
        if code == 0:
            return True
        await asyncio.sleep(0.2)
    return False


async def _ensure_postgres_up(version: str) -> None:
    """Start the cluster if it is down and wait until it accepts connections."""
    if await _postgres_ready(timeout_s=2):
        return
    await _run("pg_ctlcluster", "--skip-systemctl-redirect", version, CLUSTER, "start")
    assert await _postgres_ready(), "PostgreSQL did not come back after the test's restart"


@asynccontextmanager
async def _schema(version: str) -> AsyncIterator[str]:
    """A store URL on a schema of its own, dropped afterwards over a new connection
    (the restart cuts any connection held across it)."""
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = await psycopg.AsyncConnection.connect(SERVER, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as err:
        pytest.skip(f"PostgreSQL not reachable at {SERVER}: {err}")
    schema = f"t_{uuid.uuid4().hex[:10]}"
    async with conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema_url(schema)
    finally:
        await _ensure_postgres_up(version)
        async with await psycopg.AsyncConnection.connect(
            SERVER, autocommit=True, connect_timeout=10
        ) as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.mark.parametrize("idempotency", ["key", "none"])
async def test_a_postgres_restart_mid_run_pays_nothing_twice_and_keeps_every_row(
    client, provider, worker, task_queue, tmp_path, idempotency
) -> None:
    version = _cluster_version()
    if version is None:
        pytest.skip("needs root and pg_ctlcluster/pg_isready with a 'main' cluster")
    provider.configure(idempotency="ignore", latency_ms=[20, 40])
    catalog_path = demo_catalog(tmp_path, idempotency=idempotency)
    csv_path = first_rows(ROWS, tmp_path / "leads.csv")
    with csv_path.open(newline="") as handle:
        leads = list(csv.DictReader(handle))
    # One email and one person lookup per lead, one company lookup per domain.
    expected_calls = 2 * ROWS + len({lead["company_domain"] for lead in leads})
    options = RunOptions(chunk_size=10, heartbeat_timeout_s=3, max_chunks_in_flight=4)
    async with _schema(version) as store_url:
        try:
            async with worker(
                store_url=store_url, home=tmp_path / "worker", catalog_path=str(catalog_path)
            ):
                handle = await client.start_workflow(
                    "enrich_leads",
                    args=[{"csv_path": str(csv_path)}, options],
                    id=f"pg-restart-{uuid.uuid4().hex[:8]}",
                    task_queue=task_queue,
                    result_type=PlayRunResult,
                )
                await wait_for(
                    lambda: core_charged(provider.ledger()) >= expected_calls // 4,
                    90,
                    "the first paid calls",
                )
                charged_before = core_charged(provider.ledger())
                code, out = await _run(
                    "pg_ctlcluster", "--skip-systemctl-redirect", version, CLUSTER, "restart"
                )
                assert code == 0, out
                assert await _postgres_ready(), "PostgreSQL did not come back"
                charged_after = core_charged(provider.ledger())
                result = await asyncio.wait_for(handle.result(), 180)
        finally:
            await _ensure_postgres_up(version)
        settings = Settings(store_url=store_url, home=tmp_path / "client")
        async with await open_stores(settings, create=False) as stores:
            out_path = tmp_path / "enriched.csv"
            exported = await export_run(stores.sheet, result.datasets[0].run_ref, str(out_path))
    assert charged_after < expected_calls, "the run was over before the restart ended"
    ledger = provider.ledger()
    # Nothing paid twice, though the provider would have charged every repeat.
    assert ledger["double_charged"] == 0, ledger
    assert ledger["double_charged_items"] == 0
    assert core_charged(ledger) == expected_calls
    # Every row exactly once, and enriched: a store outage is the worker's trouble, not
    # the row's (the chunk stops and is retried; nothing fails for good).
    stats = result.stats
    assert stats.rows_ok == ROWS and stats.rows_failed == 0, stats
    rows = read_csv_rows(out_path)
    assert exported == ROWS
    counts = Counter(row["lead_id"] for row in rows)
    assert sorted(counts) == sorted(lead["lead_id"] for lead in leads)
    assert set(counts.values()) == {1}
    # What the run reports paying is what the provider billed, every billing rule
    # included (per request, per hit, refund on miss, a verifier).
    assert stats.calls_made == ledger["charged"], (stats, ledger["charged"])
    assert stats.credits == pytest.approx(ledger["credits"]), (stats.credits, ledger["credits"])
    errors = Counter(row["_error"].split(":")[0] for row in rows if row.get("_error"))
    print(
        f"pg restart ({idempotency}): {ledger['charged']} calls charged, {charged_before} "
        f"before the restart and {charged_after} once it was back; {stats.rows_ok} ok, "
        f"{stats.rows_failed} failed {dict(errors)}"
    )
