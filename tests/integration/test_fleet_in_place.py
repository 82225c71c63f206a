"""Fleet pacing tables created by the code before ``playline.db`` open in place.

Each test builds the tables with the old code's DDL and rows (:mod:`tests.old_fleet_schema`)
in a PostgreSQL schema of its own, opens them with today's :class:`FleetPacer` as a
restarted worker would, and checks that the fleet's state is all there and still works.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from playline.pacing.fleet_store import FleetPacer, FleetShare
from playline.pacing.policy import Limits
from tests.old_fleet_schema import LIMITS_0_2, old_fleet
from tests.pg import pg_schema

pytestmark = pytest.mark.postgres

_NOW = "extract(epoch FROM clock_timestamp())::float8"


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with pg_schema() as found:
        yield found


def _versions(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT component, version FROM playline_schema").fetchall()
    return {str(c): int(v) for c, v in rows}


@pytest.mark.parametrize(
    ("prefix", "component"),
    [("playline_", "fleet"), ("Old_Fleet_", "fleet:Old_Fleet_")],
)
async def test_a_running_fleets_tables_open_in_place_with_their_state(
    url: str, prefix: str, component: str
) -> None:
    old_fleet(
        url,
        prefix,
        [
            # acme: cut four times to 7 rps, its bucket empty; firmo: only limits.
            (
                "INSERT INTO {pacing} (key, tat, rps, burst, epoch, paused_until, last_now)"
                " VALUES ('acme', 0, 7, 3, 4, 0, 0)",
                [],
            ),
            (
                "INSERT INTO {limits} (key, rps, max_concurrency, per_day, min_rps)"
                " VALUES ('acme', 7, 3, 5000, 2)",
                [],
            ),
            ("INSERT INTO {limits} (key, rps) VALUES ('firmo', 3)", []),
            # Another worker waits for acme; team-b's weight was set while runs go.
            (
                "INSERT INTO {shares} (key, worker, fairness_key, weight, priority, waiting,"
                f" seen_at) VALUES ('acme', 'w-old', 'team-a', 2, 3, 5, {_NOW})",
                [],
            ),
            ("INSERT INTO {weights} (fairness_key, weight) VALUES (?, ?)", ["team-b", 4.0]),
            # The minute's quota of 3 is used up.
            (
                "INSERT INTO {windows} (key, window_s, bucket, count)"
                f" VALUES ('acme', 60, floor({_NOW} / 1)::bigint, 3)",
                [],
            ),
        ],
    )
    async with await FleetPacer.create(url, table_prefix=prefix) as pacer:
        state = await pacer.read_state()
        assert set(state) == {"acme", "firmo"}
        acme = state["acme"]
        assert acme.limits == Limits(rps=7, max_concurrency=3, per_day=5000, min_rps=2)
        assert acme.rate is not None
        assert (acme.rate.rps, acme.rate.burst, acme.rate.epoch) == (7, 3, 4)
        assert state["firmo"].limits == Limits(rps=3)
        assert state["firmo"].rate is None
        assert await pacer.read_share_weights() == {"team-b": 4.0}
        assert await pacer.read_shares(60) == [FleetShare("acme", "team-a", 2.0, 3, 5, "w-old")]
        assert await pacer.take_window_slot("acme", {60.0: 3}) > 0  # still full
        assert await pacer.take_window_slot("acme", {60.0: 4}) == 0.0
        # Tickets at the row's rate and burst, not the worker's catalog.
        delays = await pacer.take_many("acme", 4, rps=100, burst=10)
        assert delays[:3] == (0.0, 0.0, 0.0)
        assert delays[3] == pytest.approx(1 / 7, abs=1e-5)
        # The epoch carried over: an increase from it applies, a stale one does not.
        assert await pacer.report_increase("acme", 8, ceiling_rps=10, epoch=3) is None
        raised = await pacer.report_increase("acme", 8, ceiling_rps=10, epoch=4)
        assert raised is not None and (raised.rps, raised.epoch) == (8, 4)
        # Version 2 added the learnt limits beside the old tables.
        assert await pacer.read_learned() == {}
        await pacer.record_learned("acme", 6.5, ceiling_rps=10, source="429 measurement")
    assert _versions(url) == {component: 2}
    async with await FleetPacer.create(url, table_prefix=prefix) as again:  # a second start
        rate = (await again.read_state())["acme"].rate
        assert rate is not None and (rate.rps, rate.epoch) == (8, 4)
        assert (await again.read_learned())["acme"].rps == 6.5


async def test_a_limits_table_of_playline_0_2_gets_the_quota_columns(url: str) -> None:
    old_fleet(
        url,
        "playline_",
        [("INSERT INTO {limits} (key, rps, burst, max_concurrency) VALUES ('acme', 5, 2, 4)", [])],
        ddl=(LIMITS_0_2,),
    )
    async with await FleetPacer.create(url) as pacer:
        limits = (await pacer.read_state())["acme"].limits
        assert limits == Limits(rps=5, burst=2, max_concurrency=4)
        # The quota columns are there, and a limit alone no longer needs the others.
        stored = await pacer.set_limits("acme", Limits(per_day=10))
        assert stored == Limits(rps=5, burst=2, max_concurrency=4, per_day=10)
        assert await pacer.set_limits("firmo", Limits(min_rps=1)) == Limits(min_rps=1)
    assert _versions(url) == {"fleet": 2}
