"""The receipt store: which provider calls were made, and what they returned.

Every tool call is identified by a content address (tool id, tool version, canonical
input, auth-scope digest). Before a call is dispatched the caller *claims* its receipt
with a lease; only the lease holder may complete it (completion is fenced by lease
id). A completed receipt is a cache hit for every later call with the same address,
which is what makes a rerun, a retried chunk or a crashed worker free: nothing is
paid twice.

States: ``running`` (claimed; ``lease_id`` and ``lease_expires_at`` set), ``completed``
(``result`` set), ``failed`` (``error`` set; a later claim retries it). A running
receipt whose lease has expired is reclaimable; that is how a new attempt takes over
from a crashed worker.

The interface (:class:`ReceiptStore`) and the claim rule (:func:`decide_claim`) are
backend-neutral; :class:`~playline.stores.receipts_sqlite.SqliteReceiptStore` is the
embedded default.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def receipt_key(tool_id: str, tool_version: str, tool_input: Any, auth_scope: str) -> str:
    """The content address of one tool call."""
    material = canonical_json(
        {"tool": tool_id, "version": tool_version, "input": tool_input, "scope": auth_scope}
    )
    return f"{tool_id}:{hashlib.sha256(material.encode()).hexdigest()[:32]}"


def idempotency_key(key: str, *, force: bool, lease_id: str | None) -> str:
    """The ``Idempotency-Key`` sent to the provider.

    Derived from the receipt key, so a retried attempt after a crash presents the
    same key and the provider does not charge again. A forced call adds its lease
    id: forcing means "pay for a fresh answer", which must not be deduplicated away.
    """
    material = f"{key}|{lease_id}" if force and lease_id else key
    return hashlib.sha256(material.encode()).hexdigest()


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"  # the caller holds the lease and must call the provider
    HIT = "hit"  # a completed receipt answers the call
    HELD = "held"  # another live owner holds the lease; wait for it


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    key: str
    tool_id: str
    force: bool = False
    stale_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    key: str
    status: ClaimStatus
    result: Any = None
    lease_expires_at: float | None = None
    owner: str | None = None
    batch_key: str | None = None  # CLAIMED member of an unfinished batch: resume it


@dataclass(frozen=True, slots=True)
class Receipt:
    key: str
    tool_id: str
    status: str
    result: Any
    error: str | None
    owner: str | None
    lease_id: str | None
    lease_expires_at: float | None
    completed_at: float | None
    attempts: int
    credits: float


@dataclass(frozen=True, slots=True)
class BatchClaim:
    """What claiming an aggregate receipt found: the stored request and its members."""

    status: ClaimStatus
    member_keys: list[str]
    request: dict[str, Any]


class ReceiptStore(Protocol):
    """What the tool runner needs from a receipt backend. All methods are atomic."""

    async def claim(
        self, requests: Sequence[ClaimRequest], *, owner: str, lease_id: str, ttl_s: float
    ) -> list[ClaimOutcome]:
        """Claim many receipts in one transaction; one outcome per request, in order."""
        ...

    async def renew(self, keys: Sequence[str], *, lease_id: str, ttl_s: float) -> list[bool]:
        """Extend the lease on each key; False where this lease no longer holds it."""
        ...

    async def complete(self, key: str, *, lease_id: str, result: Any, credits: float) -> bool:
        """Record a result; False (and nothing written) if the lease was lost."""
        ...

    async def fail(self, key: str, *, lease_id: str, error: str) -> bool:
        """Record a failure; False if the lease was lost."""
        ...

    async def release(self, keys: Sequence[str], *, lease_id: str) -> None:
        """Give back leases of calls that were never dispatched."""
        ...

    async def get(self, keys: Sequence[str]) -> dict[str, Receipt]:
        """Current receipts for these keys (missing keys are absent)."""
        ...

    async def open_batch(
        self,
        agg_key: str,
        *,
        tool_id: str,
        member_keys: Sequence[str],
        request: dict[str, Any],
        owner: str,
        lease_id: str,
        ttl_s: float,
    ) -> bool:
        """Record a batch's exact request and point its members (held by this lease) at
        it, before it is sent; False if a member is no longer held."""
        ...

    async def claim_batch(
        self, agg_key: str, *, owner: str, lease_id: str, ttl_s: float
    ) -> BatchClaim:
        """Take over an unfinished batch: the aggregate and all its unfinished members."""
        ...

    async def complete_batch(
        self,
        agg_key: str,
        *,
        lease_id: str,
        results: dict[str, Any],
        credits_per_member: float,
    ) -> bool:
        """Complete the aggregate and every member in one transaction (fenced)."""
        ...

    async def fail_batch(
        self, agg_key: str, *, lease_id: str, error: str, release_members: bool
    ) -> None:
        """Record a batch failure; ``release_members`` frees them for a new batch."""
        ...

    async def close(self) -> None: ...


def decide_claim(
    req: ClaimRequest, row: tuple[Any, ...] | None, *, now: float, lease_id: str
) -> ClaimOutcome | None:
    """What a claim finds; ``None`` means "take the lease".

    Shared by every backend so the rules are stated once: a fresh completed receipt
    is a hit unless forced; a live lease held by someone else is waited on; anything
    else (missing, failed, stale, expired lease) is claimed.
    """
    if row is None:
        return None
    status, result, owner, held_lease, lease_expires_at, completed_at = row[:6]
    if status == "running" and held_lease != lease_id and (lease_expires_at or 0) > now:
        return ClaimOutcome(
            req.key, ClaimStatus.HELD, lease_expires_at=lease_expires_at, owner=owner
        )
    if status == "completed" and not req.force:
        fresh = req.stale_after_s is None or (completed_at or 0) >= now - req.stale_after_s
        if fresh:
            value = json.loads(result) if isinstance(result, str) else result
            return ClaimOutcome(req.key, ClaimStatus.HIT, result=value)
    return None
