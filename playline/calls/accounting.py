"""A run's account with each provider: what was sent, charged, replayed and reused.

The terms, defined once (the run's result ``stats.accounts``, ``playline run``'s
summary, ``playline runs get``, the Temporal UI's current details and the metrics all
use them):

``requests``   HTTP requests sent to the provider, retries, conflicts (409) and
               refused ones (429) included: every request that went out or may have
               (a timeout or a connection cut while it was in flight). A request that
               could not connect is not counted: it never reached the provider. A bulk
               request is one request.
``charged``    calls charged: answers recorded with credits > 0, counted once by the
               attempt that recorded them (an answer that came on a replay included:
               the provider charged its first request, whose answer was lost). A bulk
               request is one charge, as the provider bills it.
``replays``    answers the provider marked as replays of an earlier request under the
               same ``Idempotency-Key`` (``Idempotent-Replayed: true``): not charged
               again by the provider.
``hits``       calls answered free by a completed receipt (of an earlier run, chunk or
               attempt). An answer the same row paid for in an earlier attempt of its
               chunk is neither a hit nor a new charge: the attempt that recorded it
               counted it.
``shared``     calls answered by an identical call of the same chunk attempt (one
               request, many rows).
``followers``  calls that waited for another live owner's call to the same receipt
               and took its answer.
``credits``    credits charged: the sum over the charged calls.
``saved``      credits saved by receipts: what the receipts that answered hits and
               followers had cost when they were paid.

Under faults, 409s, replays and lease takeovers ``requests``, ``charged``, ``replays``
and ``credits`` equal the provider's own ledger (``received``, the charges billed more
than 0, the replayed answers and the credits, per provider).

What they cannot see: a worker killed with SIGKILL loses what its attempts counted
since their last heartbeat reached Temporal (the requests they sent, the replays and
the charges they recorded then), so after a SIGKILL the accounts may fall short of the
ledger, never exceed it. The credits stay exact in the cells' provenance (``spend``:
"credits by provider", which ``playline run`` and ``runs get`` sum from the store):
the retried rows read their own earlier answers as paid by them. The accounts do not
count those answers again, because the attempt that recorded them may have reported
them already (a failed attempt's last heartbeat, a chunk that completed with rows held
for budget or parked): counted twice, a credit would be worse than missed. Also not
counted: a request in flight when its attempt was cancelled, and ``ctx.tool`` /
``ctx.waterfall`` calls outside a dataset (they are in no dataset's stats).

Counted per chunk attempt in :class:`~playline.calls.attempt.CallStats` (``by_provider``),
carried across attempts by heartbeats as plain data (:func:`accounts_from`), and
summed upward as ``{provider: {term: number}}`` (``ChunkStats.accounts``, merged like
``spend``); :mod:`playline.spend` shows them (workflow code renders them too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["ProviderCounts", "accounts_as_dict", "accounts_from"]


@dataclass
class ProviderCounts:
    """One provider's account in one chunk attempt (the terms: module docstring)."""

    requests: int = 0
    charged: int = 0
    replays: int = 0
    hits: int = 0
    shared: int = 0
    followers: int = 0
    credits: float = 0.0
    saved: float = 0.0

    def sent(self, *, replayed: bool) -> None:
        """A request went out (and, when ``replayed``, came back a replay)."""
        self.requests += 1
        if replayed:
            self.replays += 1

    def charge(self, credits: float) -> None:
        """An answer was recorded at ``credits`` (0: not a charge)."""
        if credits > 0:
            self.charged += 1
            self.credits += credits

    def reused(self, credits: float | None, *, follower: bool = False) -> None:
        """A completed receipt answered a call free; it had cost ``credits``."""
        if follower:
            self.followers += 1
        else:
            self.hits += 1
        self.saved += credits or 0.0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ProviderCounts:
        """Counts from their plain form; unknown keys and bad values are left out."""
        counts = cls()
        for spec in fields(cls):
            value = data.get(spec.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                setattr(counts, spec.name, type(getattr(counts, spec.name))(value))
        return counts


def accounts_from(data: Any) -> dict[str, ProviderCounts]:
    """Per-provider counts from their plain form (a heartbeat's, ``asdict``'s)."""
    if not isinstance(data, Mapping):
        return {}
    return {
        str(provider): ProviderCounts.from_mapping(counts)
        for provider, counts in data.items()
        if isinstance(counts, Mapping)
    }


def accounts_as_dict(accounts: Mapping[str, ProviderCounts]) -> dict[str, dict[str, Any]]:
    """The plain form ``ChunkStats.accounts`` holds (summed with ``merge_spend``)."""
    return {provider: asdict(counts) for provider, counts in accounts.items()}
