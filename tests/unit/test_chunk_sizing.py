"""Chunks sized by time: aim at the target duration, grow carefully, stay in bounds."""

from __future__ import annotations

from playline.workflows.chunk_sizing import (
    FIRST_CHUNK_ROWS,
    MAX_CHUNK_ROWS,
    MIN_CHUNK_ROWS,
    ChunkSizer,
)


def test_starts_at_the_first_size_and_aims_at_the_target_duration() -> None:
    sizer = ChunkSizer(target_s=5.0)
    assert sizer.size == FIRST_CHUNK_ROWS
    sizer.observe(25, 10.0)  # 2.5 rows/s: 5 s is 12.5 rows
    assert sizer.size == 12
    sizer.observe(12, 4.8)  # the same rate again: the size holds
    assert sizer.size == 12


def test_growth_is_capped_per_observation_but_shrinking_is_immediate() -> None:
    sizer = ChunkSizer(target_s=5.0)
    sizer.observe(25, 0.01)  # 2,500 rows/s, e.g. every row answered from receipts
    assert sizer.size == 4 * FIRST_CHUNK_ROWS
    sizer.observe(100, 0.04)
    assert sizer.size == 16 * FIRST_CHUNK_ROWS
    sizer.observe(400, 200.0)  # the provider slowed to 2 rows/s
    assert sizer.size < 400 / 4


def test_the_size_stays_within_bounds() -> None:
    fast = ChunkSizer(target_s=600.0, size=MAX_CHUNK_ROWS)
    fast.observe(MAX_CHUNK_ROWS, 1.0)
    assert fast.size == MAX_CHUNK_ROWS
    slow = ChunkSizer(target_s=1.0)
    slow.observe(25, 1000.0)
    assert slow.size == MIN_CHUNK_ROWS


def test_empty_or_instant_observations_change_nothing() -> None:
    sizer = ChunkSizer(target_s=5.0)
    sizer.observe(0, 1.0)
    sizer.observe(10, 0.0)
    assert (sizer.size, sizer.rate) == (FIRST_CHUNK_ROWS, None)
