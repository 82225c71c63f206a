"""Fleet pacing against the real PostgreSQL: several workers, one provider budget.

Each test gets its own table prefix, and the tables are dropped afterwards, so
runs never see each other's state.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from playline.cli.limits import add_limits_parser, run_limits
from playline.pacing.fleet_store import FleetPacer, FleetPacingUnavailable
from playline.pacing.fleet_sync import SHARE_MAX_AGE_S
from playline.pacing.governor import Governor
from playline.pacing.pacer import KeyBlocked
from playline.pacing.policy import PacingPolicy
from playline.provider_server.ledger import max_in_window
from tests.old_fleet_schema import forget_fleet_schema

pytestmark = pytest.mark.postgres

DSN = os.environ.get("PLAYLINE_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = await psycopg.AsyncConnection.connect(DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as err:
        pytest.skip(f"PostgreSQL not reachable at {DSN}: {err}")
    name = f"pltest_{uuid.uuid4().hex[:10]}_"
    try:
        yield name
    finally:
        for table in ("pacing", "limits", "windows", "shares", "share_weights", "learned"):
            await conn.execute(
                psycopg.sql.SQL("DROP TABLE IF EXISTS {}").format(
                    psycopg.sql.Identifier(name + table)
                )
            )
        await forget_fleet_schema(conn, name)
        await conn.close()


@pytest.fixture
async def pacers(prefix: str) -> AsyncIterator[list[FleetPacer]]:
    """Two pacers on separate connections: two workers of one fleet."""
    made = [await FleetPacer.create(DSN, table_prefix=prefix) for _ in range(2)]
    yield made
    for pacer in made:
        await pacer.aclose()


async def eventually(check: Callable[[], bool], *, within: float) -> float:
    """Poll ``check`` until it holds; return how long that took, or fail after ``within``."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > within:
            pytest.fail(f"condition not met within {within} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def test_tickets_admit_burst_then_space_at_one_over_rps(pacers: list[FleetPacer]) -> None:
    a, _ = pacers
    delays = list(await a.take_many("acme", 8, rps=10, burst=3))
    assert delays[:3] == [0.0, 0.0, 0.0]
    # From an empty bucket, one statement: exactly 0.1 s spacing (float8 epoch
    # seconds carry ~0.2 us of rounding).
    assert delays[3:] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5], abs=1e-5)
    last = await a.take("acme")  # a moment later: due at 0.6 s minus the time since
    assert 0.5 < last <= 0.6 + 1e-5


async def test_two_workers_together_stay_within_the_budget(pacers: list[FleetPacer]) -> None:
    rps, burst, run_for = 40.0, 4, 1.5
    due: list[float] = []

    async def worker(pacer: FleetPacer) -> None:
        stop = time.monotonic() + run_for
        while time.monotonic() < stop:
            delay = await pacer.take("acme", rps=rps, burst=burst)
            await asyncio.sleep(delay)
            due.append(time.monotonic())

    await asyncio.gather(*(worker(p) for p in pacers for _ in range(8)))
    # Dispatch times carry a few ms of scheduling noise; allow one extra call per window.
    for window in (0.25, 0.5, 1.0):
        assert max_in_window(due, window) <= burst + rps * window + 1, window
    # ... and the budget is actually used, not wasted.
    assert len(due) >= rps * run_for * 0.7


async def test_rate_cut_by_one_slows_the_fleet_and_is_idempotent(
    pacers: list[FleetPacer],
) -> None:
    a, b = pacers
    await a.take("acme", rps=40, burst=1)
    before = (await b.read_state())["acme"].rate
    assert before is not None and before.rps == 40
    cut = await a.report_cut("acme", 20, min_rps=1, pause_s=0.3)
    assert (cut.rps, cut.epoch) == (20, before.epoch + 1)
    assert 0.2 < cut.paused_for_s <= 0.3
    # The other worker, cutting for the same burst, changes nothing.
    again = await b.report_cut("acme", 20, min_rps=1, pause_s=0.3)
    assert (again.rps, again.epoch) == (20, cut.epoch)
    # Tickets wait out the shared pause, then come at the new rate.
    d1 = await b.take("acme")
    assert 0.2 < d1 <= 0.31
    # A stale increase (from before the cut) cannot undo it; a current one can.
    assert await b.report_increase("acme", 42, ceiling_rps=40, epoch=before.epoch) is None
    raised = await b.report_increase("acme", 22, ceiling_rps=40, epoch=cut.epoch)
    assert raised is not None and raised.rps == 22
    capped = await b.report_increase("acme", 99, ceiling_rps=40, epoch=cut.epoch)
    assert capped is not None and capped.rps == 40


async def test_governor_cut_is_seen_by_another_worker_within_a_second(
    pacers: list[FleetPacer],
) -> None:
    policy = {"acme": PacingPolicy(rps=40, burst=5, max_concurrency=8, min_rps=1)}
    gov_a = Governor(policy, fleet=pacers[0], fleet_refresh_s=0.5)
    gov_b = Governor(policy, fleet=pacers[1], fleet_refresh_s=0.5)
    try:
        await gov_a.start()
        await gov_b.start()
        async with gov_b.permit(["acme"]) as in_flight_on_b:
            async with gov_a.permit(["acme"]) as permit:
                permit.record_rate_limited(0.2)
            assert gov_a.snapshot()["acme"]["rate_rps"] == 20
            took = await eventually(lambda: gov_b.snapshot()["acme"]["rate_rps"] == 20, within=1.2)
            assert took <= 1.2
            # B's call was sent before B adopted the cut: its 429 belongs to the
            # same burst and cuts neither B nor the fleet again.
            in_flight_on_b.record_rate_limited(0.2)
        assert gov_b.snapshot()["acme"]["rate_rps"] == 20
        assert gov_b.snapshot()["acme"]["cuts"] == 0
        await asyncio.sleep(0.1)  # let any (wrong) report land
        fleet_rate = (await pacers[1].read_state())["acme"].rate
        assert fleet_rate is not None and fleet_rate.rps == 20
    finally:
        await gov_a.aclose()
        await gov_b.aclose()


async def test_limits_set_reaches_a_running_governor_within_a_second(
    prefix: str, pacers: list[FleetPacer]
) -> None:
    gov = Governor(
        {"acme": PacingPolicy(rps=40, burst=5, max_concurrency=8)},
        fleet=pacers[0],
        fleet_refresh_s=0.5,
    )
    try:
        async with gov.permit(["acme"]):
            pass
        code = await run_cli(prefix, "set", "acme", "--rps", "7", "--max-concurrency", "3")
        assert code == 0
        took = await eventually(
            lambda: (
                (gov.snapshot()["acme"]["rps"], gov.snapshot()["acme"]["max_concurrency"]) == (7, 3)
            ),
            within=1.1,
        )
        assert took <= 1.1
        snap = gov.snapshot()["acme"]
        assert (snap["rate_rps"], snap["burst"]) == (7, 5)  # burst kept from the fleet row
        state = (await pacers[1].read_state())["acme"]
        assert state.limits is not None and state.rate is not None
        # burst was not set fleet-wide: the limits row leaves it to the workers (5)
        assert (state.limits.rps, state.limits.max_concurrency, state.limits.burst) == (7, 3, None)
        assert (state.rate.rps, state.rate.burst) == (7, 5)
    finally:
        await gov.aclose()


async def test_fleet_governors_share_one_budget(pacers: list[FleetPacer]) -> None:
    """Two governors, each allowed 30 rps locally, send 30 rps together, not 60."""
    rps, burst = 30.0, 3
    policy = {"acme": PacingPolicy(rps=rps, burst=burst, max_concurrency=16)}
    govs = [Governor(policy, fleet=p) for p in pacers]
    granted: list[float] = []

    async def worker(gov: Governor, stop: float) -> None:
        while time.monotonic() < stop:
            async with gov.permit(["acme"]) as permit:
                granted.append(time.monotonic())
                permit.record_success(0.001)

    try:
        stop = time.monotonic() + 1.5
        await asyncio.gather(*(worker(g, stop) for g in govs for _ in range(6)))
    finally:
        for gov in govs:
            await gov.aclose()
    for window in (0.5, 1.0):
        assert max_in_window(granted, window) <= burst + rps * window + 1, window
    assert len(granted) >= rps * 1.5 * 0.6


async def test_limits_cli_show_and_set(prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert await run_cli(prefix, "set", "acme", "--rps", "12.5", "--max-concurrency", "4") == 0
    assert (
        await run_cli(
            prefix, "set", "firmo", "--rps", "3", "--max-concurrency", "2", "--burst", "2"
        )
        == 0
    )
    out = io.StringIO()
    assert await run_cli(prefix, "show", out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == [
        "KEY", "RPS", "ADAPTED_RPS", "HOW", "MAX_CONCURRENCY", "BURST",
        "PER_MINUTE", "PER_HOUR", "PER_DAY", "MIN_RPS", "PAUSED_S",
    ]  # fmt: skip
    # burst not set: the shared row's (1, no worker has used the key yet)
    acme = ["acme", "12.5", "12.5", "limits-set", "4", "1", "-", "-", "-", "-", "-"]
    assert lines[1].split() == acme
    assert lines[2].split() == ["firmo", "3", "3", "limits-set", "2", "2", "-", "-", "-", "-", "-"]
    # Each limit on its own: a daily quota alone keeps the rest.
    assert await run_cli(prefix, "set", "acme", "--per-day", "5000", "--min-rps", "2") == 0
    out = io.StringIO()
    assert await run_cli(prefix, "show", out=out) == 0
    acme = out.getvalue().splitlines()[1].split()
    assert acme == ["acme", "12.5", "12.5", "limits-set", "4", "1", "-", "-", "5000", "2", "-"]
    assert await run_cli(prefix, "set", "acme") == 2
    assert "at least one limit" in capsys.readouterr().err
    assert await run_cli(prefix, "set", "acme", "--rps", "0", "--max-concurrency", "4") == 2
    assert "--rps must be" in capsys.readouterr().err


async def test_limits_show_says_what_was_learnt_how_and_when(prefix: str) -> None:
    async with await FleetPacer.create(DSN, table_prefix=prefix) as fleet:
        await fleet.take("hunter", rps=30, burst=1)  # a key a worker used
        await fleet.report_cut("hunter", 19.5, min_rps=1)
        await fleet.record_learned("hunter", 19.5, ceiling_rps=30, source="429 measurement")
        learned = await fleet.read_learned()
    assert learned["hunter"].rps == 19.5 and learned["hunter"].ceiling_rps == 30
    assert learned["hunter"].source == "429 measurement" and learned["hunter"].age_s < 60
    out = io.StringIO()
    assert await run_cli(prefix, "show", out=out) == 0
    text = out.getvalue().splitlines()
    assert text[1].split()[:4] == ["hunter", "-", "19.5", "429-measurement"]
    at = text.index("learnt limits (the fleet's next run starts at them):")
    assert text[at + 1].split() == ["KEY", "LEARNED_RPS", "CATALOG_RPS", "HOW", "WHEN", "AGE"]
    row = text[at + 2].split()
    assert row[:5] == ["hunter", "19.5", "30", "429", "measurement"]
    assert row[-1] == "s"  # seconds ago


async def test_a_second_run_starts_at_the_limit_the_first_learnt(prefix: str) -> None:
    """A worker learns an unknown strict limit from its 429s and the fleet store
    remembers it; the next run's worker starts there, not at the catalog's rate."""
    from tests.gcra_sim import SimProvider

    policy = {"acme": PacingPolicy(rps=60, burst=1, min_rps=1, max_concurrency=8)}
    provider = SimProvider(15.0, 1)  # the provider's real limit, on this process's clock

    sources: list[str] = []  # how the rate in force was learnt, after each answer

    async def run(gov: Governor, until: Callable[[], bool], most_s: float) -> list[float]:
        sent: list[float] = []
        stop = time.monotonic() + most_s

        async def lane() -> None:
            while time.monotonic() < stop and not until():
                async with gov.permit(["acme"]) as permit:
                    now = time.monotonic()
                    sent.append(now)
                    wait = provider.admit(now)
                    if wait is not None:
                        permit.record_rate_limited(wait)
                        continue
                    await asyncio.sleep(0.02)
                    permit.record_success(0.02)
                sources.append(gov.snapshot()["acme"]["limit_source"])

        await asyncio.gather(*(lane() for _ in range(4)))
        return sent

    async with await FleetPacer.create(DSN, table_prefix=prefix) as store:
        first = Governor(policy, fleet=store)
        try:
            await first.start()
            await run(first, lambda: first.snapshot()["acme"]["learned_rps"] is not None, 20.0)
            await run(first, lambda: False, 3.0)  # the run goes on at what it learnt
            learned = first.snapshot()["acme"]["learned_rps"]
        finally:
            await first.aclose()  # waits for the report to be written
        remembered = (await store.read_learned())["acme"]
    assert learned is not None and learned < 60
    assert remembered.rps == pytest.approx(learned)
    assert remembered.source == "429 measurement" and remembered.ceiling_rps == 60

    # The next run comes later: the first worker's report of who waited on it has aged
    # out (a fresh one would make the second worker take half the rate, as if shared).
    await asyncio.sleep(SHARE_MAX_AGE_S)
    provider.calls.clear()
    provider.tat = None  # the provider's bucket refilled since
    sources.clear()
    async with await FleetPacer.create(DSN, table_prefix=prefix) as store:
        second = Governor(policy, fleet=store)
        try:
            await second.start()
            sent = await run(second, lambda: False, 1.0)
        finally:
            await second.aclose()
    # (a 429 later in the run, a probe a step above it, would make it a measurement again)
    assert sources[0] == "fleet store (429 measurement)"
    # Its first calls went at the learnt rate, not at the catalog's 60/s.
    gaps = [b - a for a, b in itertools.pairwise(sent)][1:11]
    # (on average: one call of a loaded machine may leave a little late, the next on time)
    assert len(gaps) == 10 and sum(gaps) / len(gaps) >= 0.8 / learned


async def test_unreachable_database_is_a_clear_error() -> None:
    with pytest.raises(FleetPacingUnavailable, match="reachable"):
        await FleetPacer.create("postgresql://postgres@127.0.0.1:1/none?connect_timeout=1")


async def run_cli(prefix: str, *argv: str, out: io.StringIO | None = None) -> int:
    """Run ``playline limits ...`` as the main CLI would (in a thread: it owns its loop)."""
    parser = argparse.ArgumentParser(prog="playline")
    add_limits_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["limits", "--dsn", DSN, "--table-prefix", prefix, *argv])
    return await asyncio.to_thread(run_limits, args, out=out)


# ---------------------------------------------------------------- quota windows, fleet-wide


async def test_a_fleet_window_admits_its_limit_across_workers_then_says_how_long(
    pacers: list[FleetPacer],
) -> None:
    a, b = pacers
    windows = {60.0: 3, 3600.0: 100}
    admitted = [await p.take_window_slot("acme", windows) for p in (a, b, a)]
    assert admitted == [0.0, 0.0, 0.0]
    wait = await b.take_window_slot("acme", windows)  # the minute is full, fleet-wide
    assert 1.0 <= wait <= 62.0
    assert await a.take_window_slot("acme", {3600.0: 100}) == 0.0  # the hour has room


async def test_governors_share_a_per_minute_quota_through_the_fleet(
    pacers: list[FleetPacer],
) -> None:
    policy = {"acme": PacingPolicy(rps=100, burst=10, per_minute=6, max_concurrency=8)}
    govs = [Governor(policy, fleet=p) for p in pacers]
    try:
        for gov in govs:  # each worker alone would allow 6 in the minute; together, 6
            for _ in range(3):
                async with gov.permit(["acme"], park_after_s=5.0):
                    pass
        waiter = asyncio.create_task(_one_call(govs[0]))
        await asyncio.sleep(1.5)
        assert not waiter.done()  # the seventh call of the minute waits for the fleet
        waiter.cancel()
        assert (await asyncio.gather(waiter, return_exceptions=True))[0] is not None
    finally:
        for gov in govs:
            await gov.aclose()


async def _one_call(gov: Governor) -> None:
    async with gov.permit(["acme"]):
        pass


async def test_limits_set_per_day_reaches_a_running_governor(
    prefix: str, pacers: list[FleetPacer]
) -> None:
    gov = Governor({"acme": PacingPolicy(rps=40, burst=5)}, fleet=pacers[0], fleet_refresh_s=0.5)
    try:
        async with gov.permit(["acme"]):
            pass
        assert await run_cli(prefix, "set", "acme", "--per-day", "2", "--per-minute", "30") == 0
        await eventually(
            lambda: gov.snapshot()["acme"]["windows"] == {60.0: 30, 86400.0: 2}, within=1.2
        )
        snap = gov.snapshot()["acme"]
        assert snap["rps"] == 40  # not set fleet-wide: the catalog's stands
        for _ in range(2):  # the day's two calls (counted from when the quota was set)
            async with gov.permit(["acme"]):
                pass
        assert gov.blocked_until("acme") is not None
        with pytest.raises(KeyBlocked):
            async with gov.permit(["acme"], park_after_s=60):
                pass
    finally:
        await gov.aclose()
