"""Plays on the PostgreSQL store, and plays that need no disk shared with the client.

Real Temporal dev server, real worker processes, real PostgreSQL (one schema per
test, dropped afterwards), real HTTP to the provider server and to a file server.
"""

from __future__ import annotations

import asyncio
import csv
import http.server
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import psycopg
import pytest

from playline import demo
from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.datasets import export_run, store_source, upload_csv
from playline.stores.backends import open_stores
from tests.conftest import LEADS_CSV, core_charged, start_worker_process
from tests.e2e.test_bad_input import assert_nothing_dispatched, fails_with
from tests.e2e.test_crash_recovery import first_rows, wait_for
from tests.pg import pg_schema
from tests.plays import lead, read_csv_rows, run, write_csv

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg_store() -> AsyncIterator[str]:
    async with pg_schema() as url:
        yield url


async def test_a_play_on_the_postgres_store_pays_once_and_exports_from_a_client(
    client, provider, worker, task_queue, tmp_path, pg_store
) -> None:
    rows = [lead(i, domain=f"pg{i % 4}.example") for i in range(30)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    play_input = {"csv_path": str(csv_path), "column_tool": "company"}
    async with worker(store_url=pg_store, home=tmp_path / "worker-home"):
        first = await run(client, "t_tool_column", play_input, task_queue=task_queue)
        second = await run(client, "t_tool_column", play_input, task_queue=task_queue)
    assert first.stats.rows_ok == 30 and first.stats.calls_made == 4
    assert second.stats.calls_made == 0 and second.stats.rows_cached == 30
    assert provider.ledger()["charged"] == 4
    # A client process with no home of its own reads the rows from the database.
    settings = Settings(store_url=pg_store, home=tmp_path / "client-home")
    async with await open_stores(settings, create=False) as stores:
        count = await export_run(stores.sheet, second.datasets[0].run_ref, str(tmp_path / "o.csv"))
    exported = read_csv_rows(tmp_path / "o.csv")
    assert count == 30 and [r["lead_id"] for r in exported] == [r[0] for r in rows]
    assert all(r["value"] for r in exported)
    assert not (tmp_path / "client-home").exists()
    # Fleet pacing shares the store's database: the provider's row is there.
    async with await psycopg.AsyncConnection.connect(pg_store) as conn:
        cur = await conn.execute("SELECT key FROM playline_pacing ORDER BY key")
        assert ("firmo",) in await cur.fetchall()


async def test_two_workers_without_a_shared_disk_run_a_play_from_an_upload(
    client, provider, temporal_address, task_queue, tmp_path, pg_store
) -> None:
    """The client uploads the CSV and deletes it; two worker processes with homes of
    their own run the play from the store reference; the client exports the result."""
    local = tmp_path / "client" / "leads.csv"
    local.parent.mkdir()
    with LEADS_CSV.open() as src:
        local.write_text("".join(src.readlines()[:61]))
    async with await open_stores(Settings(store_url=pg_store), create=True) as stores:
        ref = await upload_csv(stores.sheet, local, key="leads")
    local.unlink()  # nothing on any disk now: the rows are in the store
    env = {"PLAYLINE_STORE_URL": pg_store}
    workers = [
        start_worker_process(
            temporal_address, task_queue, tmp_path / f"home{i}", tmp_path / f"w{i}.log", env
        )
        for i in range(2)
    ]
    try:
        result = await run(
            client,
            "enrich_leads",
            {"csv_path": store_source(ref.id)},
            task_queue=task_queue,
            timeout_s=120,
        )
    finally:
        stop(workers)
    assert result.stats.rows_ok == 60 and result.stats.rows_failed == 0
    ledger = provider.ledger()
    assert ledger["double_charged"] == 0 and ledger["charged"] == result.stats.calls_made
    out = tmp_path / "client" / "enriched.csv"
    async with await open_stores(Settings(store_url=pg_store), create=False) as stores:
        assert await export_run(stores.sheet, result.datasets[0].run_ref, str(out)) == 60
    exported = read_csv_rows(out)
    assert all(r["work_email"] and r["company_name"] for r in exported)
    for i in range(2):  # neither worker wrote a store file under its home
        assert not list((tmp_path / f"home{i}").glob("*.db"))


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for proc in processes:
        proc.terminate()
    for proc in processes:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def test_a_store_reference_that_does_not_exist_fails_before_any_call(
    client, provider, worker, task_queue, pg_store
) -> None:
    async with worker(store_url=pg_store):
        cause = await fails_with(
            client, task_queue, "t_tool_column", {"csv_path": store_source("leads@0000")}
        )
    assert cause.type == "InvalidPlayInput"
    assert "store:leads@0000: no such dataset" in cause.message
    assert_nothing_dispatched(provider)


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


async def test_a_play_loads_its_csv_from_a_url(
    client, provider, worker, task_queue, tmp_path, file_server
) -> None:
    base, root = file_server
    write_csv(root / "leads.csv", [lead(i) for i in range(12)])
    # The file server is on loopback: a worker reaches it only when told it is trusted.
    async with worker(url_loads=True, url_allow_hosts=("127.0.0.1",)):
        result = await run(
            client,
            "t_tool_column",
            {"csv_path": f"{base}/leads.csv?token={uuid.uuid4().hex}", "column_tool": "company"},
            task_queue=task_queue,
        )
        cause = await fails_with(
            client, task_queue, "t_tool_column", {"csv_path": f"{base}/missing.csv?token=SECRET"}
        )
    assert result.stats.rows_ok == 12
    assert cause.type == "InvalidPlayInput"
    assert f"CSV URL {base}/missing.csv?… answered HTTP 404" in cause.message
    assert "SECRET" not in cause.message


async def test_a_fixture_mode_play_on_the_postgres_store(
    client, provider, worker, task_queue, tmp_path, pg_store
) -> None:
    options = RunOptions(integration_mode="fixture", fixtures=[str(demo.FIXTURES)], chunk_size=20)
    async with worker(store_url=pg_store):
        result = await run(
            client,
            "enrich_leads",
            {"csv_path": str(LEADS_CSV)},
            task_queue=task_queue,
            options=options,
            timeout_s=120,
        )
    assert result.stats.rows_ok == 236 and result.stats.rows_failed == 0
    assert_nothing_dispatched(provider)
    async with await open_stores(Settings(store_url=pg_store), create=False) as stores:
        out = tmp_path / "fixture.csv"
        await export_run(stores.sheet, result.datasets[0].run_ref, str(out))
    with out.open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 236


async def test_sigkill_on_the_postgres_store_loses_no_row_and_pays_nothing_twice(
    client, provider, temporal_address, task_queue, tmp_path, pg_store
) -> None:
    """Kill the worker mid-run; a worker on another home (another machine, as far as
    the stores go) takes the chunks over from PostgreSQL and finishes the play."""
    provider.configure(latency_ms=[80, 120])
    csv_path = first_rows(60, tmp_path / "leads60.csv")
    options = RunOptions(chunk_size=5, heartbeat_timeout_s=3, max_chunks_in_flight=4)
    env = {"PLAYLINE_STORE_URL": pg_store}
    log = tmp_path / "worker.log"
    first = start_worker_process(temporal_address, task_queue, tmp_path / "a", log, env)
    handle = await client.start_workflow(
        "enrich_leads",
        args=[{"csv_path": str(csv_path)}, options],
        id=f"pg-crash-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
        result_type=PlayRunResult,
    )
    try:
        await wait_for(lambda: core_charged(provider.ledger()) >= 25, 60, "the first paid calls")
        first.kill()
        first.wait(timeout=10)
        assert core_charged(provider.ledger()) < 120, "the play finished before the kill"
        second = start_worker_process(temporal_address, task_queue, tmp_path / "b", log, env)
        try:
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            stop([second])
    finally:
        if first.poll() is None:
            first.kill()
    ledger = provider.ledger()
    domains = {row["company_domain"] for row in csv.DictReader(csv_path.open())}
    assert result.stats.rows_ok == 60
    assert ledger["double_charged"] == 0
    assert core_charged(ledger) == 60 + 60 + len(domains)
