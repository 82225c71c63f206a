"""The governor end to end: real Temporal dev server, real provider server, real PostgreSQL.

Every assertion is made from the provider's side of the wire: the per-call
records of the local provider server (``provider.calls()``, server monotonic
time ``t``, recorded when a call completes) are cut into 1 s sliding windows.
The provider server is a subprocess on the same machine, and on Linux
``time.monotonic()`` is the system-wide ``CLOCK_MONOTONIC``, so the test's
clock and the server's ``t`` are on one scale.

Latencies are kept at a few milliseconds so that a call's completion time is
within a few milliseconds of its arrival.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

from playline.contract import PlayRunResult, RunOptions
from playline.provider_server.fake_data import find_email
from playline.provider_server.ledger import max_in_window
from tests.conftest import REPO, new_id, start_worker_process
from tests.old_fleet_schema import forget_fleet_schema
from tests.plays import lead, run, write_csv

DSN = os.environ.get("PLAYLINE_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
EMAIL_PATH = "/acme/v1/email/find"

CATALOG_TEMPLATE = """
[providers.acme]
base_url = "http://127.0.0.1:8787"
base_url_env = "PLAYLINE_PROVIDER_URL"
auth = {{ env = "ACME_API_KEY", header = "X-Api-Key" }}
pacing = {{ rps = {rps}, burst = {burst}, max_concurrency = {max_concurrency}, min_rps = 1 }}

[providers.firmo]
base_url = "http://127.0.0.1:8787"
base_url_env = "PLAYLINE_PROVIDER_URL"
auth = {{ env = "FIRMO_API_KEY", header = "Authorization", scheme = "Bearer" }}
pacing = {{ rps = 100, burst = 10, max_concurrency = 32 }}

[tools.email_finder]
provider = "acme"
path = "/acme/v1/email/find"
input = {{ first_name = "str", last_name = "str", domain = "str" }}
getters = {{ email = "email", confidence = "confidence" }}
credits = 1.0

[tools.company_lookup]
provider = "firmo"
path = "/firmo/v1/company/lookup"
input = {{ domain = "str" }}
getters = {{ name = "name", industry = "industry", employees = "employees" }}
credits = 0.5
"""

#: Dispatch much wider than the limit allows, so that the governor, not the
#: dispatch width, is what keeps the rate down.
WIDE = RunOptions(chunk_size=20, max_chunks_in_flight=4, row_concurrency=16)


def write_catalog(tmp_path: Path, *, rps: float, burst: int, max_concurrency: int = 16) -> Path:
    path = tmp_path / f"catalog-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(CATALOG_TEMPLATE.format(rps=rps, burst=burst, max_concurrency=max_concurrency))
    return path


def leads_csv(tmp_path: Path, n: int, *, offset: int = 0) -> Path:
    """``n`` leads with distinct people: one email_finder (acme) call per row."""
    return write_csv(tmp_path / f"leads-{offset}-{n}.csv", [lead(offset + i) for i in range(n)])


def acme_calls(provider: Any, since: float = 0.0) -> list[dict[str, Any]]:
    return [c for c in provider.calls(since) if c["provider"] == "acme"]


def assert_all_ok(result: PlayRunResult, rows: int) -> None:
    (dataset,) = result.datasets
    assert dataset.stats.rows_ok == rows, dataset.stats
    assert dataset.stats.rows_failed == 0, dataset.stats.first_error


@pytest.fixture(autouse=True)
def restore_provider(provider_server: Any) -> Iterator[None]:
    """Give the shared provider server back as the other tests expect it (keys, limits)."""
    yield
    provider_server.configure(
        api_keys={},
        limiters={},
        rate_limit_headers="none",
        retry_after="ceil",
        echo_key_in_errors=False,
        rate_limit_rps={},
        rate_limit_burst={},
        max_concurrency={},
    )


@pytest.fixture
async def fleet_prefix() -> AsyncIterator[str]:
    """A fresh table prefix for fleet pacing; its tables are dropped afterwards."""
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = await psycopg.AsyncConnection.connect(DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as err:
        pytest.skip(f"PostgreSQL not reachable at {DSN}: {err}")
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    try:
        yield prefix
    finally:
        for table in ("pacing", "limits", "windows", "shares", "share_weights", "learned"):
            await conn.execute(
                psycopg.sql.SQL("DROP TABLE IF EXISTS {}").format(
                    psycopg.sql.Identifier(prefix + table)
                )
            )
        await forget_fleet_schema(conn, prefix)
        await conn.close()


# -- 1. a known limit is never exceeded ---------------------------------------


async def test_known_limit_is_never_exceeded(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rps, burst, rows = 20, 2, 90
    # The provider's true limit is the configured one (its bucket a little deeper,
    # to absorb loopback jitter); the dispatch is far wider than the limit.
    provider.configure(
        rate_limit_rps={"acme": rps}, rate_limit_burst={"acme": burst + 2}, latency_ms=[2, 6]
    )
    catalog = write_catalog(tmp_path, rps=rps, burst=burst)
    csv_path = leads_csv(tmp_path, rows)
    async with worker(catalog_path=str(catalog)):
        result = await run(
            client,
            "t_tool_column",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=WIDE,
        )

    assert_all_ok(result, rows)
    calls = acme_calls(provider)
    assert [c["status"] for c in calls].count(429) == 0
    assert provider.ledger()["rate_limited"] == 0
    assert len(calls) == rows
    times = [c["t"] for c in calls]
    assert max_in_window(times) <= rps + burst
    # ... and the limit is used, not merely respected: the run is rate-bound.
    elapsed = max(times) - min(times)
    assert elapsed >= (rows - burst) / rps * 0.95
    assert (rows - 1) / elapsed >= 0.8 * rps


# -- 2. a 429 with Retry-After pauses the key ---------------------------------


async def test_429_with_retry_after_pauses_the_key_then_recovers(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = 60
    provider.configure(latency_ms=[2, 6], retry_after_header=True)
    # The server answers an injected 429 with ``Retry-After: 1`` (app.py: _too_many
    # with wait 1.0 -> max(1, ceil(1.0))).
    catalog = write_catalog(tmp_path, rps=20, burst=2)
    csv_path = leads_csv(tmp_path, rows)
    async with worker(catalog_path=str(catalog)):
        play = await start_wide_run(client, provider, csv_path, task_queue, charged=15)
        await asyncio.to_thread(provider.configure, fail_next={"429": 1})
        result = await play

    assert_all_ok(result, rows)
    calls = acme_calls(provider)
    limited = [c for c in calls if c["status"] == 429]
    assert len(limited) == 1
    t429 = limited[0]["t"]
    # ``Retry-After: 1`` in whole seconds is a bound, not a wait (a strict limiter whose
    # next slot is 50 ms away writes it too): the key pauses an interval or a few of its
    # rate, not the whole second, and goes on. The whole second stood still before.
    resumed = [c["t"] for c in calls if t429 < c["t"] < t429 + 1.0]
    assert len(resumed) >= 5, f"only {len(resumed)} calls in the second after the 429"
    # One 429 at a rate the run had already proven clean is taken as noise (a clump,
    # not a lower limit): the key goes on at its rate, never above it.
    assert len(resumed) <= 20 + 2
    # The 429'd call was retried, and every row was paid for exactly once.
    ledger = provider.ledger()
    assert ledger["double_charged"] == 0
    assert ledger["charged_by_path"][EMAIL_PATH] == rows
    assert result.stats.retries >= 1


# -- 3. two worker processes sharing PostgreSQL stay within one budget ---------


async def start_wide_run(
    client: Any, provider: Any, csv_path: Path, task_queue: str, *, charged: int
) -> asyncio.Future[Any]:
    """Start ``t_tool_column`` with the wide dispatch; return once ``charged`` calls are paid."""
    play = asyncio.ensure_future(
        run(
            client,
            "t_tool_column",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=WIDE,
        )
    )
    deadline = time.monotonic() + 20
    while provider.ledger()["charged"] < charged:
        assert time.monotonic() < deadline and not play.done(), "the run did not start"
        await asyncio.sleep(0.05)
    return play


async def wait_for_poller(client: Any, task_queue: str, timeout_s: float = 30.0) -> None:
    """Wait until a worker polls ``task_queue`` for activities."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
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
    raise AssertionError(f"no worker polled {task_queue} within {timeout_s} s")


@pytest.mark.postgres
async def test_two_worker_processes_share_one_budget(
    client, provider, temporal_address, tmp_path, fleet_prefix
) -> None:
    rps, burst, rows = 20, 2, 80
    provider.configure(
        rate_limit_rps={"acme": rps}, rate_limit_burst={"acme": burst + 2}, latency_ms=[2, 6]
    )
    catalog = write_catalog(tmp_path, rps=rps, burst=burst)
    env = {
        "PLAYLINE_CATALOG": str(catalog),
        "PLAYLINE_PG_DSN": DSN,
        "PLAYLINE_FLEET_PREFIX": fleet_prefix,
    }
    queues = [f"tq-fleet-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    procs = [
        start_worker_process(
            temporal_address, queue, tmp_path / f"home{i}", tmp_path / f"worker{i}.log", env
        )
        for i, queue in enumerate(queues)
    ]
    try:
        await asyncio.gather(*(wait_for_poller(client, q) for q in queues))
        # One play per worker, each on its own task queue: both workers call acme at once.
        results = await asyncio.gather(
            *(
                run(
                    client,
                    "t_tool_column",
                    {"csv_path": str(leads_csv(tmp_path, rows, offset=1000 * i))},
                    task_queue=queue,
                    options=WIDE,
                )
                for i, queue in enumerate(queues)
            )
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    for result in results:
        assert_all_ok(result, rows)
        assert result.stats.calls_made == rows
    calls = acme_calls(provider)
    statuses = [c["status"] for c in calls]
    assert len(calls) == 2 * rows, {s: statuses.count(s) for s in set(statuses)}
    assert statuses.count(429) == 0
    times = [c["t"] for c in calls]
    # Alone, each worker would go at 20 rps (40 combined); together they get 20.
    assert max_in_window(times) <= rps + burst
    elapsed = max(times) - min(times)
    assert elapsed >= (2 * rows - burst) / rps * 0.95
    assert (2 * rows - 1) / elapsed <= 1.05 * rps


# -- 4. a live limit change takes effect without restart ----------------------


@pytest.mark.postgres
async def test_live_limit_change_takes_effect_without_restart(
    client, provider, worker, task_queue, tmp_path, fleet_prefix
) -> None:
    rows, new_rps, burst = 120, 5, 2
    provider.configure(latency_ms=[2, 6])
    catalog = write_catalog(tmp_path, rps=20, burst=burst)
    csv_path = leads_csv(tmp_path, rows)
    async with worker(catalog_path=str(catalog), pg_dsn=DSN, fleet_table_prefix=fleet_prefix):
        play = await start_wide_run(client, provider, csv_path, task_queue, charged=30)
        command = [
            sys.executable,
            "-m",
            "playline",
            "limits",
            "--dsn",
            DSN,
            "--table-prefix",
            fleet_prefix,
            "set",
            "acme",
            "--rps",
            str(new_rps),
            "--max-concurrency",
            "4",
        ]
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        changed_at = time.monotonic()
        assert proc.returncode == 0, err.decode()
        assert b"acme: 5 rps" in out
        charged_at_change = provider.ledger()["charged"]
        assert charged_at_change < rows - 20, "the run finished too early; add rows"
        result = await play

    assert_all_ok(result, rows)
    calls = acme_calls(provider)
    before = [c["t"] for c in calls if c["t"] < changed_at]
    after = [c["t"] for c in calls if c["t"] >= changed_at + 1.5]
    # Before the change the run went at about 20 rps; from 1.5 s after it, at 5.
    assert max_in_window(before) >= 15
    assert len(after) >= 10
    assert max_in_window(after) <= new_rps + burst
    assert [c["status"] for c in calls].count(429) == 0


# -- 5. fixture mode bypasses pacing, unless the run enforces it ---------------


def write_fixtures(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w") as out:
        for _, first, last, domain in rows:
            entry = {
                "tool": "email_finder",
                "input": {"first_name": first, "last_name": last, "domain": domain},
                "result": find_email(first, last, domain),
            }
            out.write(json.dumps(entry) + "\n")
    return path


async def test_fixture_mode_bypasses_pacing_unless_enforced(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows, rps = 20, 4
    # Distinct inputs per run, so the second run's calls are not receipt hits.
    data = {False: [lead(n) for n in range(rows)], True: [lead(100 + n) for n in range(rows)]}
    fixtures = write_fixtures(tmp_path / "fixtures.jsonl", data[False] + data[True])
    catalog = write_catalog(tmp_path, rps=rps, burst=1)

    async def timed(enforce: bool, csv_name: str) -> tuple[float, PlayRunResult]:
        csv_path = write_csv(tmp_path / csv_name, data[enforce])
        options = RunOptions(
            integration_mode="fixture",
            fixtures=[str(fixtures)],
            enforce_fixture_pacing=enforce,
            chunk_size=20,
            row_concurrency=20,
        )
        started = time.monotonic()
        result = await run(
            client,
            "t_tool_column",
            {"csv_path": str(csv_path), "dataset": csv_name},
            task_queue=task_queue,
            options=options,
            workflow_id=new_id("fixture"),
        )
        return time.monotonic() - started, result

    async with worker(catalog_path=str(catalog)):
        bypassed_s, bypassed = await timed(False, "bypass.csv")
        enforced_s, enforced = await timed(True, "enforce.csv")

    for result in (bypassed, enforced):
        assert_all_ok(result, rows)
        assert result.integration_mode == "fixture"
        assert result.stats.credits == 0
    assert provider.ledger()["received"] == 0  # no provider request in fixture mode
    # Paced, 20 calls at 4 rps with a burst of 1 take at least 19 / 4 = 4.75 s.
    assert enforced_s >= (rows - 1) / rps
    assert bypassed_s < 0.5 * (rows - 1) / rps


# -- 6. fixture mode's dispatch width comes from the fixture path ---------------


async def chunk_inputs(client: Any, workflow_id: str) -> list[dict[str, Any]]:
    """The inputs of every chunk activity a play (and its child runs) scheduled."""
    found: list[dict[str, Any]] = []
    pending = [workflow_id]
    while pending:
        history = await client.get_workflow_handle(pending.pop()).fetch_history()
        for event in history.events:
            if event.HasField("child_workflow_execution_started_event_attributes"):
                attrs = event.child_workflow_execution_started_event_attributes
                pending.append(attrs.workflow_execution.workflow_id)
            if event.HasField("activity_task_scheduled_event_attributes"):
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == "playline.run_chunk":
                    found.append(json.loads(attrs.input.payloads[0].data))
    return found


async def test_fixture_mode_width_comes_from_the_cpu_not_the_live_pacing(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = 60
    data = {False: [lead(n) for n in range(rows)], True: [lead(500 + n) for n in range(rows)]}
    fixtures = write_fixtures(tmp_path / "fixtures.jsonl", data[False] + data[True])
    # Live pacing would give this provider a width of one row: 0.5 rps.
    catalog = write_catalog(tmp_path, rps=0.5, burst=1, max_concurrency=2)
    widths = {}
    async with worker(catalog_path=str(catalog)):
        for enforce in (False, True):
            csv_path = write_csv(
                tmp_path / f"w{enforce}.csv", data[enforce][: rows if not enforce else 3]
            )
            workflow_id = new_id("width")
            options = RunOptions(
                integration_mode="fixture",
                fixtures=[str(fixtures)],
                enforce_fixture_pacing=enforce,
                chunk_size=30,
            )
            result = await run(
                client,
                "t_tool_column",
                {"csv_path": str(csv_path), "dataset": f"w{enforce}"},
                task_queue=task_queue,
                options=options,
                workflow_id=workflow_id,
            )
            assert result.datasets[0].stats.rows_failed == 0
            widths[enforce] = {
                c["row_concurrency"] for c in await chunk_inputs(client, workflow_id)
            }
    assert widths[False] == {30}  # every row of a chunk at once: the fixture path's width
    assert widths[True] == {1}  # enforced pacing keeps production parity: the live width
    assert provider.ledger()["received"] == 0


# -- 7. headers first: a reported quota is spent without a single 429 ------------


async def test_reported_quota_is_spent_evenly_without_429s(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows, limit, window = 60, 20, 2.0
    # The catalog says 200 rps; the provider allows 20 per 2-second window and says so.
    provider.configure(
        latency_ms=[2, 6],
        limiters={"acme": [{"kind": "fixed_window", "limit": limit, "window_s": window}]},
        rate_limit_headers="x-ratelimit",
        retry_after="date",
    )
    catalog = write_catalog(tmp_path, rps=200, burst=5)
    csv_path = leads_csv(tmp_path, rows)
    async with worker(catalog_path=str(catalog)):
        result = await run(
            client,
            "t_tool_column",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=WIDE,
        )

    assert_all_ok(result, rows)
    calls = acme_calls(provider)
    statuses = [c["status"] for c in calls]
    # At most the first call of the run can be a 429 (nothing was reported before it).
    assert statuses.count(429) <= 1, statuses.count(429)
    assert statuses.count(200) == rows
    # Fixed windows on the wall clock: never more than the limit in one of them.
    per_window: dict[int, int] = {}
    for c in calls:
        if c["status"] == 200:
            per_window[int(c["wall"] // window)] = per_window.get(int(c["wall"] // window), 0) + 1
    assert max(per_window.values()) <= limit
    assert provider.ledger()["double_charged"] == 0


# -- 8. per-key budgets: calls spread across a provider's keys -------------------

MULTI_KEY_CATALOG = """
[providers.acme]
base_url = "http://127.0.0.1:8787"
base_url_env = "PLAYLINE_PROVIDER_URL"
auth = { env = ["ACME_KEY_ONE", "ACME_KEY_TWO"], header = "X-Api-Key" }
pacing = { rps = 100, burst = 4, max_concurrency = 16, min_rps = 1 }
key_pacing = { rps = 8, burst = 2, max_concurrency = 8, min_rps = 1 }

[tools.email_finder]
provider = "acme"
path = "/acme/v1/email/find"
input = { first_name = "str", last_name = "str", domain = "str" }
getters = { email = "email" }
credits = 1.0
"""


async def test_calls_spread_across_keys_within_each_keys_budget(
    client, provider, worker, task_queue, tmp_path, monkeypatch
) -> None:
    rows = 64
    keys = {"ACME_KEY_ONE": "acme-account-one", "ACME_KEY_TWO": "acme-account-two"}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    # Each account's true limit is its own bucket of 8/s: one key alone would take 8 s.
    provider.configure(
        latency_ms=[2, 6],
        api_keys={"acme": list(keys.values())},
        limiters={"acme": [{"kind": "token_bucket", "rate": 8, "burst": 3, "per_key": True}]},
    )
    catalog = tmp_path / "multi-key.toml"
    catalog.write_text(MULTI_KEY_CATALOG)
    csv_path = leads_csv(tmp_path, rows)
    async with worker(catalog_path=str(catalog)):
        result = await run(
            client,
            "t_tool_column",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            options=WIDE,
        )

    assert_all_ok(result, rows)
    calls = acme_calls(provider)
    assert [c["status"] for c in calls].count(429) == 0
    per_key: dict[str, list[float]] = {}
    for c in calls:
        per_key.setdefault(c["key"], []).append(c["t"])
    assert len(per_key) == 2
    assert all(len(times) >= rows // 4 for times in per_key.values()), {
        k: len(v) for k, v in per_key.items()
    }
    for times in per_key.values():  # each key within its own budget
        assert max_in_window(times) <= 8 + 3
    assert provider.ledger()["double_charged"] == 0
