"""The dispatch width: fixture mode's from the CPU, live mode's from the governor."""

from __future__ import annotations

from playline.activities.width import MAX_CHUNKS_IN_FLIGHT, dispatch_width, fixture_width
from playline.contract import RunOptions
from playline.pacing.governor import Governor
from playline.pacing.policy import PacingPolicy

SLOW = Governor({"acme": PacingPolicy(rps=0.5, burst=1, max_concurrency=2)})


def test_fixture_mode_width_ignores_the_live_pacing() -> None:
    options = RunOptions(integration_mode="fixture", chunk_size=40)
    width = dispatch_width(SLOW, ["acme"], options)
    assert width == fixture_width(options)
    assert width.row_concurrency == 40  # every row of a chunk at once
    assert width.chunks_in_flight >= 2


def test_fixture_width_follows_the_cores_and_the_options() -> None:
    options = RunOptions(integration_mode="fixture", chunk_size=10)
    assert fixture_width(options, cpus=2).chunks_in_flight == 3
    assert fixture_width(options, cpus=64).chunks_in_flight == MAX_CHUNKS_IN_FLIGHT
    fixed = RunOptions(
        integration_mode="fixture", chunk_size=10, row_concurrency=4, max_chunks_in_flight=2
    )
    assert (fixture_width(fixed).row_concurrency, fixture_width(fixed).chunks_in_flight) == (4, 2)


def test_enforced_fixture_pacing_and_live_mode_take_the_governors_width() -> None:
    enforced = RunOptions(integration_mode="fixture", enforce_fixture_pacing=True, chunk_size=40)
    live = RunOptions(chunk_size=40)
    for options in (enforced, live):
        width = dispatch_width(SLOW, ["acme"], options)
        assert width.row_concurrency == 1  # ceil(0.5 rps x 2 x 0.25 s)
        assert width.chunks_in_flight == 3  # one for the rows, two for stragglers' tails
