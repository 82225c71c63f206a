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

from playline.contract import MAX_CHUNK_ROWS

__all__ = ["FIRST_CHUNK_ROWS", "MAX_CHUNK_ROWS", "MIN_CHUNK_ROWS", "ChunkSizer"]

#: The first chunks' size, before any rate is known (the old constant).
FIRST_CHUNK_ROWS = 25
MIN_CHUNK_ROWS = 5
#: One observation may grow the size at most this much: a chunk whose rows were all
#: answered from receipts finishes in no time and must not set the size alone.
MAX_GROWTH = 4.0
#: Weight of a faster observation in the rows-per-second average (slower ones count fully).
ALPHA = 0.5


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
