"""Enough rows in flight for a slow provider, whatever the chunk sizing says (issue 17)."""

from __future__ import annotations

import asyncio
from typing import Any

from playline.activities.width import LiveRowGate, column_providers, dispatch_width
from playline.calls.catalog import Catalog
from playline.contract import ChunkInput, ColumnSpec, RunOptions, Width
from playline.pacing.governor import Governor
from playline.pacing.policy import PacingPolicy
from playline.workflows.chunk_sizing import MAX_FILL_CHUNKS, chunks_to_fill

CATALOG = Catalog.model_validate(
    {
        "providers": {"acme": {"base_url": "http://x", "pacing": {"rps": 50}}},
        "tools": {"slow_lookup": {"provider": "acme", "path": "/acme/v1/email/find"}},
    }
)


def test_small_chunks_are_kept_in_flight_in_number_enough_for_the_rows() -> None:
    width = Width(chunks_in_flight=3, row_concurrency=32, rows_in_flight=32)
    assert chunks_to_fill(width, 25) == 4  # ceil(32 / 25) + 2
    assert chunks_to_fill(width, 5) == 9  # ceil(32 / 5) + 2: a slow provider's chunks
    assert chunks_to_fill(width, 5000) == 3  # never fewer than the width says
    many = Width(chunks_in_flight=3, row_concurrency=256, rows_in_flight=256)
    assert chunks_to_fill(many, 5) == MAX_FILL_CHUNKS
    # A pinned row concurrency bounds each chunk's rows too.
    pinned = Width(chunks_in_flight=5, row_concurrency=4, rows_in_flight=12)
    assert chunks_to_fill(pinned, 25) == 5


def test_a_width_without_its_rows_is_taken_as_it_is() -> None:
    recorded = Width(chunks_in_flight=3, row_concurrency=25)  # an older history's width
    assert chunks_to_fill(recorded, 5) == 3
    assert chunks_to_fill(Width(chunks_in_flight=3, row_concurrency=8, rows_in_flight=32), None)


def test_the_dispatch_width_says_how_many_rows_it_wants_in_flight() -> None:
    gov = Governor({"acme": PacingPolicy(rps=8, max_concurrency=16)})
    width = dispatch_width(gov, ["acme"], RunOptions())
    assert width.rows_in_flight == gov.suggested_parallelism("acme")
    pinned = dispatch_width(gov, ["acme"], RunOptions(max_chunks_in_flight=2))
    assert (pinned.chunks_in_flight, pinned.rows_in_flight) == (2, None)


class FakePacer:
    """Only what the width reads: a suggested parallelism that can change."""

    def __init__(self, width: int) -> None:
        self.width = width

    def suggested_parallelism(self, key: str) -> int:
        return self.width

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def chunk(options: RunOptions, row_concurrency: int = 2) -> ChunkInput:
    return ChunkInput(
        run_ref="r",
        start=0,
        end=25,
        columns=[ColumnSpec(name="email", resolver="tests.slow_lookup")],
        on_row_error="isolate",
        options=options,
        row_concurrency=row_concurrency,
    )


def test_the_providers_of_a_chunk_are_those_its_resolvers_declare(monkeypatch: Any) -> None:
    from playline import resolvers

    monkeypatch.setitem(resolvers._DECLARED_TOOLS, "tests.slow_lookup", ("slow_lookup",))
    assert column_providers(CATALOG, chunk(RunOptions()).columns) == ["acme"]
    assert column_providers(CATALOG, [ColumnSpec(name="x", resolver="tests.unknown")]) == []


async def test_a_chunk_follows_the_governors_width_while_it_runs(monkeypatch: Any) -> None:
    from playline import resolvers

    monkeypatch.setitem(resolvers._DECLARED_TOOLS, "tests.slow_lookup", ("slow_lookup",))
    pacer = FakePacer(2)
    gate = LiveRowGate(pacer, CATALOG, chunk(RunOptions()))
    in_flight = peak = 0
    release = asyncio.Event()

    async def row() -> None:
        nonlocal in_flight, peak
        async with gate:
            in_flight += 1
            peak = max(peak, in_flight)
            await release.wait()
            in_flight -= 1

    rows = [asyncio.create_task(row()) for _ in range(25)]
    await asyncio.sleep(0)
    assert peak == 2  # the workflow's width, from a guess of the latency
    pacer.width = 16  # the first answers came back slow: Little's law wants more rows
    gate.follow()  # as each row's start and end does
    await asyncio.sleep(0)
    assert peak == 16 and gate.limit == 16
    release.set()
    await asyncio.gather(*rows)
    pacer.width = 1
    async with gate:
        pass
    assert gate.limit == 2  # never below what the workflow said


def test_pinned_widths_fixture_mode_and_estimates_keep_the_workflows_number(
    monkeypatch: Any,
) -> None:
    from playline import resolvers

    monkeypatch.setitem(resolvers._DECLARED_TOOLS, "tests.slow_lookup", ("slow_lookup",))
    pacer = FakePacer(40)
    for options in (
        RunOptions(row_concurrency=3),
        RunOptions(integration_mode="fixture", fixtures=["f.jsonl"]),
        RunOptions(estimate=True),
    ):
        gate = LiveRowGate(pacer, CATALOG, chunk(options, row_concurrency=3))
        gate.follow()
        assert gate.limit == 3
