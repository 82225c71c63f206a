"""What a sink's destination does with one batch, and what it answers per record.

A destination (HubSpot, a PostgreSQL table) takes a batch of
:class:`~playline.sinks.plan.RecordPlan` s and answers one :class:`RecordOutcome`
per record, in order. The answer is JSON (``as_json``): it is what the batch's
receipt stores, so a sync that crashed after the destination acknowledged the batch
applies the stored answer instead of sending the batch again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from playline.errors import PlaylineError
from playline.sinks.plan import RecordPlan

__all__ = [
    "CREATED",
    "KEPT",
    "REJECTED",
    "UPDATED",
    "Destination",
    "RecordOutcome",
    "SinkBusy",
    "SinkParked",
    "SinkUnavailable",
]

CREATED = "created"
UPDATED = "updated"
#: nothing written: every field to send was ``if_blank`` and the destination had a value
KEPT = "kept"
REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """What the destination did with one record of a batch."""

    record: str
    status: str
    object_id: str | None = None
    #: why the destination refused the record (its own words), for ``rejected``
    reason: str | None = None
    #: the fields written, as texts
    written: dict[str, str | None] = field(default_factory=dict)
    #: ``if_blank`` fields left alone because the destination held a value
    kept: dict[str, str | None] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordOutcome:
        return cls(**data)


class SinkBusy(PlaylineError):
    """A batch this sync would write is another sync's (or a killed one's, until its
    lease runs out), or this sync lost its lease: trying again later settles it."""

    retryable = True


class SinkUnavailable(PlaylineError):
    """The destination could not be reached (after retries): nothing is known written
    that is not recorded; trying again later is safe."""

    retryable = True


class SinkParked(PlaylineError):
    """The destination will not take more now (its daily limit, a storm of 429s
    longer than the sync's patience): what was acknowledged is kept, a later sync
    resumes with the rest."""

    def __init__(self, message: str, *, until_wall: float | None = None) -> None:
        super().__init__(message)
        self.until_wall = until_wall


class Destination(Protocol):
    """Where a sink writes. ``scope`` goes into the batches' receipt keys (never a
    secret): the same batch for another account or table is another call."""

    scope: str
    max_batch: int
    #: requests sent so far (the summary reports them)
    requests: int

    async def write(
        self, batch: Sequence[RecordPlan], *, resent: bool = False
    ) -> list[RecordOutcome]:
        """Write ``batch``; one outcome per record, in order. Raises
        :class:`SinkParked` when the destination will not take it now. ``resent``: a
        sync that stopped before recording the answer sent this batch already (a
        destination that can tell what it holds need not write it twice)."""
        ...

    async def close(self) -> None: ...
