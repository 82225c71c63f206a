"""Fair shares across a fleet, against the real PostgreSQL: each worker paces a
provider at the part its waiting fairness keys are owed among every worker's.

``fleet_parts`` is the rule (pure, tested first); the governors' refresh publishes
who waits, reads who waits everywhere and applies weights set while runs go.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io

import pytest

from playline.cli.limits import add_limits_parser, run_limits
from playline.pacing.fair import SHARE, Share
from playline.pacing.fleet_store import FleetPacer, FleetShare
from playline.pacing.fleet_sync import Allotment, fleet_allotments, fleet_parts
from playline.pacing.governor import Governor
from playline.pacing.policy import PacingPolicy
from tests.pg import pg_schema


def test_each_worker_is_owed_its_waiting_keys_weight_part() -> None:
    shares = [
        FleetShare("acme", "team-a", 2.0, 3, 5, worker="w1"),
        FleetShare("acme", "team-b", 1.0, 3, 5, worker="w2"),
        FleetShare("firmo", "team-a", 1.0, 3, 5, worker="w1"),
    ]
    parts = fleet_parts(shares, "w1")
    assert parts["acme"] == pytest.approx(2 / 3)
    assert parts["firmo"] is None  # nobody else waits: all of it
    assert fleet_parts(shares, "w2")["acme"] == pytest.approx(1 / 3)
    # A weight set while runs go wins over the runs' own.
    assert fleet_parts(shares, "w2", {"team-b": 4.0})["acme"] == pytest.approx(4 / 6)


def test_a_key_on_two_workers_splits_its_part_by_what_waits_on_each() -> None:
    shares = [
        FleetShare("acme", "team-a", 1.0, 3, 3, worker="w1"),
        FleetShare("acme", "team-a", 1.0, 3, 1, worker="w2"),
        FleetShare("acme", "team-b", 1.0, 3, 4, worker="w2"),
    ]
    assert fleet_parts(shares, "w1")["acme"] == pytest.approx(0.5 * 3 / 4)
    assert fleet_parts(shares, "w2")["acme"] == pytest.approx(0.5 * 1 / 4 + 0.5)


def test_a_worker_splits_its_part_between_its_keys_as_the_fleet_would() -> None:
    """Three runs of team A (one here, two on w2) beside team B's one run here: B is
    owed half the provider, so this worker weighs B three times A's local third."""
    shares = [
        FleetShare("acme", "team-a", 1.0, 3, 2, worker="w1"),
        FleetShare("acme", "team-b", 1.0, 3, 6, worker="w1"),
        FleetShare("acme", "team-a", 1.0, 3, 4, worker="w2"),
    ]
    here = fleet_allotments(shares, "w1")["acme"]
    assert here.part == pytest.approx((1 / 3 + 1) / 2)
    assert here.weights == {"team-a": pytest.approx(1 / 3), "team-b": 1.0}
    b_here = here.weights["team-b"] / sum(here.weights.values()) * here.part
    assert b_here == pytest.approx(0.5)
    # A worker with nothing waiting for a key is not held back: its first calls go.
    assert fleet_allotments(shares[2:], "w1") == {"acme": Allotment(None)}


def test_a_higher_class_anywhere_takes_the_key_first() -> None:
    shares = [
        FleetShare("acme", "backfill", 5.0, 3, 50, worker="w1"),
        FleetShare("acme", "urgent", 1.0, 1, 2, worker="w2"),
    ]
    assert fleet_parts(shares, "w1")["acme"] == 0.0
    assert fleet_parts(shares, "w2")["acme"] == 1.0


async def _queue(gov: Governor, share: Share, n: int) -> list[asyncio.Task[None]]:
    async def call() -> None:
        SHARE.set(share)
        async with gov.permit(["acme"]) as permit:
            permit.record_success(0.01)

    tasks = [asyncio.create_task(call()) for _ in range(n)]
    await asyncio.sleep(0.05)
    return tasks


async def _limits(url: str, *argv: str) -> str:
    """``playline limits ...`` against the fleet database, its output."""
    parser = argparse.ArgumentParser()
    add_limits_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["limits", "--dsn", url, *argv])
    out = io.StringIO()
    code = await asyncio.to_thread(run_limits, args, out=out)
    assert code == 0, out.getvalue()
    return out.getvalue()


@pytest.mark.postgres
async def test_two_workers_pace_a_provider_by_their_keys_weights() -> None:
    policy = PacingPolicy(rps=0.2, burst=1, max_concurrency=8)  # calls queue for tokens
    async with pg_schema() as url:
        pacers = [await FleetPacer.create(url), await FleetPacer.create(url)]
        govs = [Governor({"acme": policy}, fleet=p) for p in pacers]
        tasks: list[asyncio.Task[None]] = []
        try:
            for gov in govs:
                await gov.start()
            tasks += await _queue(govs[0], Share("team-a", 2.0), 3)
            tasks += await _queue(govs[1], Share("team-b", 1.0), 3)
            for gov in (*govs, govs[0]):  # the first reads the second's report
                assert gov._fleet is not None
                await gov._fleet.refresh_once()
            parts = [gov.snapshot()["acme"]["fleet_part"] for gov in govs]
            assert parts == [pytest.approx(2 / 3), pytest.approx(1 / 3)]

            await pacers[0].set_share_weight("team-b", 4.0)  # playline limits share
            for gov in (*govs, govs[0]):
                assert gov._fleet is not None
                await gov._fleet.refresh_once()
            parts = [gov.snapshot()["acme"]["fleet_part"] for gov in govs]
            assert parts == [pytest.approx(2 / 6), pytest.approx(4 / 6)]

            shown = await _limits(url, "show")
            sharing = shown[shown.index("sharing now:") :]
            assert "weights set with `limits share`: team-b 4" in shown
            rows = [line.split() for line in sharing.splitlines()[2:]]
            # key, fairness key, class, weight, (calls waiting), workers, owed
            assert [row[:4] + row[5:] for row in rows] == [
                ["acme", "team-a", "3", "2", "1", "33%"],
                ["acme", "team-b", "3", "4", "1", "67%"],
            ]
            said = await _limits(url, "share", "team-b", "--clear")
            assert said.startswith("team-b: its runs' own weight again")
            assert govs[1].shares("acme") == {} or govs[1].waiting_shares("acme")["team-b"][
                0
            ] == pytest.approx(4.0)
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
            for gov in govs:
                await gov.aclose()
            for pacer in pacers:
                await pacer.aclose()
