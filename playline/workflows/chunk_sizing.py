"""How many rows a chunk activity gets: sized by time, not by a constant.

A chunk is one activity: every chunk costs a schedule, a start, a completion and a
heartbeat stream in the workflow's history and on the Temporal server, so small
chunks are expensive for fast rows (fixture mode, cached rows) and large ones are
slow to retry for slow rows (a provider at 2 rps). The sizer aims each chunk at
``target_s`` seconds from the rows per second that completed chunks achieved, within
``[MIN_CHUNK_ROWS, MAX_CHUNK_ROWS]``. It is pure arithmetic on activity results, so
a replay computes the same sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from playline.contract import MAX_CHUNK_ROWS, Width

__all__ = [
    "FIRST_CHUNK_ROWS",
    "MAX_CHUNK_ROWS",
    "MAX_FILL_CHUNKS",
    "MIN_CHUNK_ROWS",
    "ChunkSizer",
    "chunks_to_fill",
]

#: The first chunks' size, before any rate is known (the old constant).
FIRST_CHUNK_ROWS = 25
MIN_CHUNK_ROWS = 5
#: One observation may grow the size at most this much: a chunk whose rows were all
#: answered from receipts finishes in no time and must not set the size alone.
MAX_GROWTH = 4.0
#: Weight of a faster observation in the rows-per-second average (slower ones count fully).
ALPHA = 0.5
#: The most chunks :func:`chunks_to_fill` keeps in flight (a worker runs 64 activities).
MAX_FILL_CHUNKS = 32
#: Chunks beyond those that hold the rows: the next chunks start while stragglers finish.
SPARE_CHUNKS = 2


def chunks_to_fill(width: Width, chunk_rows: int | None) -> int:
    """Chunks to keep in flight so that ``width.rows_in_flight`` rows can be in flight.

    A chunk holds at most ``min(row_concurrency, its rows)`` rows in flight, and chunks
    sized by time are small when rows are slow: three chunks of five rows would starve
    a provider that takes sixteen calls at a time for seconds each. So the window is
    ``ceil(rows_in_flight / rows per chunk)`` plus the spare chunks, never less than the
    width's own ``chunks_in_flight`` and at most ``MAX_FILL_CHUNKS``. Pure arithmetic on
    the recorded width and the sizer, so a replay computes the same window; a width
    without ``rows_in_flight`` (pinned by the options, or from an older history) is
    taken as it is.
    """
    rows = width.rows_in_flight
    if rows is None or chunk_rows is None:
        return width.chunks_in_flight
    per_chunk = max(1, min(width.row_concurrency, chunk_rows))
    needed = -(-rows // per_chunk) + SPARE_CHUNKS
    return max(width.chunks_in_flight, min(MAX_FILL_CHUNKS, needed))


@dataclass
class ChunkSizer:
    """The next chunk's size, from the rows per second of the chunks that finished.

    Args:
        target_s: how long a chunk should take.
        size: the size to start from (a learnt size survives continue-as-new).
    """

    target_s: float
    size: int = FIRST_CHUNK_ROWS
    rate: float | None = None

    def observe(self, rows: int, seconds: float) -> None:
        """A chunk of ``rows`` rows took ``seconds`` of wall time in its activity."""
        if rows < 1 or seconds <= 0:
            return
        observed = rows / seconds
        if self.rate is None or observed < self.rate:
            # A slower chunk is believed at once: an oversized chunk of a slowed-down
            # provider would hold its rows (and a retry would redo them) for minutes.
            self.rate = observed
        else:
            self.rate += ALPHA * (observed - self.rate)
        wanted = self.rate * self.target_s
        capped = min(wanted, self.size * MAX_GROWTH)
        self.size = int(max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, round(capped))))
