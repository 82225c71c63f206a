"""Weighted fair shares of one provider end to end (issue 19).

Real Temporal dev server, real provider server, real PostgreSQL for the fleet case.
One provider, ``acme``, is paced at ``RPS`` calls per second, and runs of a few
hundred rows contend for it. The play ``t_fair`` (``tests/plays_fair.py``) makes one
``acme`` call per row through one of two tools with different paths, so the provider
server's per-call records tell two contenders apart (``path``); every run reads leads
of its own (no receipt is shared, every call is a new charge).

Nothing here asserts a timing. Shares are judged by counts: the in-process worker's
governor (``Governor.shares("acme")``: calls served per fairness key) sampled while
both contenders have calls waiting, and the provider's records inside the window in
which both were mid-run. Every row is charged exactly once (the provider's ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest
from temporalio.worker import Worker

import tests.plays_fair  # noqa: F401  (registers t_fair)
from playline import demo
from playline.contract import PlayRunResult, RunOptions
from tests.pg import pg_schema
from tests.plays import lead, run, write_csv
from tests.plays_fair import PATHS

RPS = 50
DEMO_PACING = "pacing = { rps = 100, burst = 10, max_concurrency = 32 }"
#: Dispatch wider than the limit allows: every run keeps calls waiting at the governor.
WIDE = {"chunk_size": 20, "max_chunks_in_flight": 4, "row_concurrency": 16}
TIMEOUT_S = 90.0


def fair_catalog(tmp_path: Path, *, rps: int = RPS) -> Path:
    """The demo catalog with ``acme`` (the first provider) paced at ``rps``."""
    text = demo.CATALOG.read_text()
    assert text.startswith("#") and text.count(DEMO_PACING) == 5
    text = text.replace(
        DEMO_PACING, f"pacing = {{ rps = {rps}, burst = 2, max_concurrency = 16 }}", 1
    )
    path = tmp_path / "catalog-fair.toml"
    path.write_text(text)
    return path


_OFFSETS = iter(range(0, 10**6, 1000))


def leads(tmp_path: Path, n: int, tag: str) -> Path:
    """``n`` leads no other run has (their own ids and people): every call a new charge."""
    offset = next(_OFFSETS)
    rows = [
        lead(offset + i, first_name=f"{tag}x{i}", domain=f"{tag}-{i % 7}.example") for i in range(n)
    ]
    return write_csv(tmp_path / f"leads-{tag}.csv", rows)


def options(**fields: Any) -> RunOptions:
    return RunOptions(**WIDE, **fields)


def start(
    client: Any, task_queue: str, csv_path: Path, tool: str, opts: RunOptions
) -> asyncio.Future[PlayRunResult]:
    """Start ``t_fair`` over ``csv_path`` (its own dataset) in the background."""
    return asyncio.ensure_future(
        run(
            client,
            "t_fair",
            {"csv_path": str(csv_path), "tool": tool, "dataset": f"fair_{csv_path.stem[6:]}"},
            task_queue=task_queue,
            options=opts,
            timeout_s=TIMEOUT_S,
        )
    )


class governor_of:
    """The governor of an in-process worker (its plugin's services, opened once the
    worker runs): ``shares(key)`` is the governor's, ``{}`` before the services open."""

    def __init__(self, running: Worker) -> None:
        plugins = running.client.config()["plugins"]
        holders: list[Any] = [p.holder for p in plugins if hasattr(p, "holder")]
        assert holders, "the worker has no playline plugin"
        self._holder = holders[0]

    def shares(self, key: str) -> dict[str, dict[str, Any]]:
        try:
            governor = self._holder.services.governor
        except RuntimeError:  # not open yet
            return {}
        return dict(governor.shares(key))


class Sampler:
    """Samples ``governor.shares("acme")`` every 50 ms while runs go."""

    def __init__(self, governor: Any) -> None:
        self.governor = governor
        self.samples: list[dict[str, dict[str, Any]]] = []
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            self.samples.append(self.governor.shares("acme"))
            await asyncio.sleep(0.05)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Sampler]:
        self._task = asyncio.ensure_future(self._loop())
        try:
            yield self
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def served(self, key: str) -> int:
        latest = self.samples[-1] if self.samples else {}
        return int(latest.get(key, {}).get("served", 0))

    def backlogged_deltas(self, a: str, b: str) -> tuple[int, int, int]:
        """Calls served to ``a`` and ``b`` between the first and the last sample at which
        both had calls waiting, and how many such samples there were."""
        both = [
            s for s in self.samples if s.get(a, {}).get("waiting") and s.get(b, {}).get("waiting")
        ]
        assert len(both) >= 5, f"the two keys were rarely both waiting ({len(both)} samples)"
        first, last = both[0], both[-1]
        return (
            last[a]["served"] - first[a]["served"],
            last[b]["served"] - first[b]["served"],
            len(both),
        )


async def until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def acme_times(provider: Any) -> dict[str, list[float]]:
    """Completion times of the successful acme calls, by path."""
    out: dict[str, list[float]] = {path: [] for path in PATHS.values()}
    for call in provider.calls(0.0):
        if call["provider"] == "acme" and call["status"] == 200:
            out[call["path"]].append(call["t"])
    return {path: sorted(times) for path, times in out.items()}


def mid_run_split(a: list[float], b: list[float]) -> tuple[int, int]:
    """Calls of ``a`` and ``b`` in the window where both were mid-run: from the later
    one's 10th percentile call to the earlier one's 90th (start-up and tails cut)."""
    lo = max(a[len(a) // 10], b[len(b) // 10])
    hi = min(a[len(a) * 9 // 10], b[len(b) * 9 // 10])
    assert hi > lo, "the runs did not overlap"
    return sum(lo <= t <= hi for t in a), sum(lo <= t <= hi for t in b)


def assert_once(provider: Any, results: list[PlayRunResult], per_path: dict[str, int]) -> None:
    """Every row of every run ok, and charged exactly once (no double charge)."""
    for result in results:
        (dataset,) = result.datasets
        assert dataset.stats.rows_failed == 0, dataset.stats.first_error
        assert dataset.stats.rows_ok == dataset.admitted, dataset.stats
    ledger = provider.ledger()
    assert ledger["double_charged"] == 0
    assert ledger["rate_limited"] == 0
    by_path = ledger["charged_by_path"]
    for path, rows in per_path.items():
        assert by_path.get(path, 0) == rows, (path, by_path)
    assert ledger["charged_by_provider"].get("acme", 0) == sum(per_path.values())


async def gather(*futures: Awaitable[PlayRunResult]) -> list[PlayRunResult]:
    return list(await asyncio.gather(*futures))


# -- (a) weight 2 gets about twice weight 1's calls -------------------------------


async def test_weight_two_gets_about_twice_the_calls_of_weight_one(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = 200
    heavy, light = f"team-a-{uuid.uuid4().hex[:6]}", f"team-b-{uuid.uuid4().hex[:6]}"
    catalog = fair_catalog(tmp_path)
    async with (
        worker(catalog_path=str(catalog)) as running,
        Sampler(governor_of(running)).running() as sampler,
    ):
        plays = [
            start(client, task_queue, leads(tmp_path, rows, "wa"), "email",
                  options(fairness_key=heavy, fairness_weight=2)),
            start(client, task_queue, leads(tmp_path, rows, "wb"), "person",
                  options(fairness_key=light, fairness_weight=1)),
        ]  # fmt: skip
        results = await gather(*plays)

    served_heavy, served_light, samples = sampler.backlogged_deltas(heavy, light)
    ratio = served_heavy / max(served_light, 1)
    times = acme_times(provider)
    wire_heavy, wire_light = mid_run_split(times[PATHS["email"]], times[PATHS["person"]])
    wire_ratio = wire_heavy / max(wire_light, 1)
    print(
        f"weights 2:1: governor {served_heavy}:{served_light} = {ratio:.2f} over {samples} "
        f"samples; provider mid-run {wire_heavy}:{wire_light} = {wire_ratio:.2f}"
    )
    assert served_heavy + served_light >= 60, "too few calls while both waited"
    assert 1.5 <= ratio <= 2.7
    assert 1.5 <= wire_ratio <= 2.7
    assert_once(provider, results, {PATHS["email"]: rows, PATHS["person"]: rows})


# -- (b) three runs of key A beside one of key B split the provider evenly ---------


async def test_three_runs_of_one_key_share_evenly_with_one_run_of_another(
    client, provider, worker, task_queue, tmp_path
) -> None:
    per_a, rows_b = 80, 240
    key_a, key_b = f"team-a-{uuid.uuid4().hex[:6]}", f"team-b-{uuid.uuid4().hex[:6]}"
    catalog = fair_catalog(tmp_path)
    async with (
        worker(catalog_path=str(catalog)) as running,
        Sampler(governor_of(running)).running() as sampler,
    ):
        plays = [
            start(client, task_queue, leads(tmp_path, per_a, f"a{i}"), "email",
                  options(fairness_key=key_a))
            for i in range(3)
        ]  # fmt: skip
        plays.append(
            start(client, task_queue, leads(tmp_path, rows_b, "b"), "person",
                  options(fairness_key=key_b))
        )  # fmt: skip
        results = await gather(*plays)

    served_a, served_b, samples = sampler.backlogged_deltas(key_a, key_b)
    ratio = served_a / max(served_b, 1)
    times = acme_times(provider)
    wire_a, wire_b = mid_run_split(times[PATHS["email"]], times[PATHS["person"]])
    wire_ratio = wire_a / max(wire_b, 1)
    print(
        f"3 runs of A : 1 of B: governor {served_a}:{served_b} = {ratio:.2f} over {samples} "
        f"samples; provider mid-run {wire_a}:{wire_b} = {wire_ratio:.2f}"
    )
    # Per run it would be 3:1; per fairness key it is 1:1.
    assert served_a + served_b >= 60, "too few calls while both waited"
    assert 0.7 <= ratio <= 1.4
    assert 0.7 <= wire_ratio <= 1.4
    assert_once(provider, results, {PATHS["email"]: 3 * per_a, PATHS["person"]: rows_b})


# -- (c) a priority-1 run goes first through a priority-2 backfill -------------------


async def test_a_priority_one_run_goes_first_through_a_priority_two_backfill(
    client, provider, worker, task_queue, tmp_path
) -> None:
    backfill_rows, urgent_rows = 300, 60
    catalog = fair_catalog(tmp_path)
    async with worker(catalog_path=str(catalog)) as running:
        governor = governor_of(running)
        async with Sampler(governor).running() as sampler:
            backfill = start(client, task_queue, leads(tmp_path, backfill_rows, "bf"), "person",
                             options(fairness_key="backfill", priority=2))  # fmt: skip
            await until(lambda: sampler.served("backfill") >= 50, 30, "the backfill to go")
            urgent = start(client, task_queue, leads(tmp_path, urgent_rows, "ur"), "email",
                           options(fairness_key="urgent", priority=1))  # fmt: skip
            urgent_result = await urgent
            backfill_left = backfill_rows - sampler.served("backfill")
            backfill_result = await backfill

    times = acme_times(provider)
    urgent_times = times[PATHS["email"]]
    first, last = urgent_times[0], urgent_times[-1]
    # The backfill's calls while the urgent run was on the wire (calls of the backfill
    # already admitted when the urgent run's first call queued complete in this window too).
    beside = sum(first <= t <= last for t in times[PATHS["person"]])
    print(
        f"priority: {urgent_rows} urgent calls, {beside} backfill calls beside them; "
        f"{backfill_left} backfill rows left when the urgent run finished"
    )
    assert backfill_left > 20, "the backfill finished too early; add rows"
    assert beside <= 0.35 * urgent_rows
    assert_once(
        provider,
        [urgent_result, backfill_result],
        {PATHS["email"]: urgent_rows, PATHS["person"]: backfill_rows},
    )


# -- (d) two workers sharing PostgreSQL keep the same shares -----------------------


@pytest.mark.postgres
async def test_two_workers_sharing_postgresql_keep_the_weighted_shares(
    client, provider, worker, task_queue, tmp_path
) -> None:
    rows = 240
    heavy, light = f"team-a-{uuid.uuid4().hex[:6]}", f"team-b-{uuid.uuid4().hex[:6]}"
    catalog = fair_catalog(tmp_path)
    async with pg_schema() as store_url:
        settings = {"catalog_path": str(catalog), "store_url": store_url}
        async with (
            worker(home=tmp_path / "machine-a", **settings) as first,
            worker(home=tmp_path / "machine-b", **settings) as second,
        ):
            governors = [governor_of(first), governor_of(second)]
            plays = [
                start(client, task_queue, leads(tmp_path, rows, "fa"), "email",
                      options(fairness_key=heavy, fairness_weight=2)),
                start(client, task_queue, leads(tmp_path, rows, "fb"), "person",
                      options(fairness_key=light, fairness_weight=1)),
            ]  # fmt: skip
            results = await gather(*plays)
            served = [{k: v["served"] for k, v in g.shares("acme").items()} for g in governors]

    times = acme_times(provider)
    wire_heavy, wire_light = mid_run_split(times[PATHS["email"]], times[PATHS["person"]])
    wire_ratio = wire_heavy / max(wire_light, 1)
    print(
        f"two workers, weights 2:1: provider mid-run {wire_heavy}:{wire_light} = "
        f"{wire_ratio:.2f}; served per worker {served}"
    )
    assert wire_heavy + wire_light >= 60
    assert 1.5 <= wire_ratio <= 2.7
    assert_once(provider, results, {PATHS["email"]: rows, PATHS["person"]: rows})


@pytest.mark.postgres
async def test_two_workers_three_runs_of_one_key_share_evenly_with_one_of_another(
    client, provider, worker, task_queue, tmp_path
) -> None:
    per_a, rows_b = 80, 240
    key_a, key_b = f"team-a-{uuid.uuid4().hex[:6]}", f"team-b-{uuid.uuid4().hex[:6]}"
    catalog = fair_catalog(tmp_path)
    async with pg_schema() as store_url:
        settings = {"catalog_path": str(catalog), "store_url": store_url}
        async with (
            worker(home=tmp_path / "machine-a", **settings) as first,
            worker(home=tmp_path / "machine-b", **settings) as second,
        ):
            governors = [governor_of(first), governor_of(second)]
            plays = [
                start(client, task_queue, leads(tmp_path, per_a, f"a{i}"), "email",
                      options(fairness_key=key_a))
                for i in range(3)
            ]  # fmt: skip
            plays.append(
                start(client, task_queue, leads(tmp_path, rows_b, "b"), "person",
                      options(fairness_key=key_b))
            )  # fmt: skip
            results = await gather(*plays)
            served = [{k: v["served"] for k, v in g.shares("acme").items()} for g in governors]

    times = acme_times(provider)
    wire_a, wire_b = mid_run_split(times[PATHS["email"]], times[PATHS["person"]])
    wire_ratio = wire_a / max(wire_b, 1)
    print(
        f"two workers, 3 runs of A : 1 of B: provider mid-run {wire_a}:{wire_b} = "
        f"{wire_ratio:.2f}; served per worker {served}"
    )
    assert_once(provider, results, {PATHS["email"]: 3 * per_a, PATHS["person"]: rows_b})
    assert wire_a + wire_b >= 60
    assert 0.7 <= wire_ratio <= 1.4
