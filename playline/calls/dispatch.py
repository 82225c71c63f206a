"""The one seam between the runner and the ways a call can be answered.

After the runner has claimed a call's receipt, a :class:`Dispatcher` *settles*
it: obtains the result (over HTTP through the governor, from a fixture, or as a
member of a bulk request) and records it in the receipt store under the lease.
The runner calls it one way and is called back by nobody; a new mode is a new
class, not a new ``if`` in the runner.

Implementations: :class:`~playline.calls.live.LiveDispatcher` (HTTP; routes
tools with a bulk endpoint through :class:`~playline.calls.bulk.BulkDispatcher`),
:class:`~playline.calls.fixtures.FixtureDispatcher`, and an estimate's
:class:`~playline.calls.estimate.EstimatingDispatcher` (counts, never sends).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from playline.calls.catalog import ToolSpec

__all__ = ["ClaimedCall", "Dispatcher", "Request", "Settled"]


@dataclass(frozen=True, slots=True)
class Settled:
    """A settled call's answer and what this attempt paid for it.

    ``paid`` is False when the answer came without a request of this attempt's (a bulk
    request another owner finished, a fixture); ``credits`` is then 0. ``recorded`` is
    False when the receipt was taken over before the answer was recorded: its new owner
    records the call and its cost. ``data`` that is a whole ``ToolResult`` is the answer
    as the dispatcher shaped it (an estimate's unpaid one) and is returned as it is.
    """

    data: Any
    credits: float = 0.0
    source: str = "rule"
    paid: bool = True
    recorded: bool = True


@dataclass(frozen=True, slots=True)
class ClaimedCall:
    """A tool call whose receipt this attempt has just claimed.

    Attributes:
        tool: the catalog's tool.
        payload: the validated, normalised input.
        key: the receipt key (content address) the lease is on.
        force: the caller asked for a fresh, paid answer.
        batch_key: set when the receipt belongs to a bulk request an earlier
            attempt recorded but never finished; that request must be re-sent.
        generation: the receipt's generation (a completed receipt claimed again
            for a fresh answer is in the next one); the ``Idempotency-Key`` derives
            from it.
        payer: who pays for the call (a dataset row), recorded on its receipt.
    """

    tool: ToolSpec
    payload: dict[str, Any]
    key: str
    force: bool = False
    batch_key: str | None = None
    generation: int = 0
    payer: str | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One provider request to send.

    Attributes:
        tool: the catalog's tool.
        payload: the request body (or query, for GET).
        idempotency_key: sent as ``Idempotency-Key``.
        lease_keys: the receipts (held by the attempt) the request answers: their
            leases must outlast the call, and they are marked sent first when the
            tool's provider does not de-duplicate.
        path: the path to call instead of the tool's (a bulk endpoint).
        pacing_key: the governor key to pace it under instead of the tool's
            provider (an asynchronous provider's status polls).
        before_send: awaited right before the request goes out, instead of marking
            ``lease_keys`` sent (a job submit marks its job ledger entry instead).
    """

    tool: ToolSpec
    payload: dict[str, Any]
    idempotency_key: str
    lease_keys: tuple[str, ...]
    path: str | None = None
    pacing_key: str | None = None
    before_send: Callable[[], Awaitable[None]] | None = None
    #: a job's status poll: a request to the provider, not a call of the tool's
    poll: bool = False


class Dispatcher(Protocol):
    """Answers claimed calls in one integration mode."""

    def auth_scope(self, tool: ToolSpec) -> str:
        """The account a call is made under, as a digest: part of the receipt key,
        so answers are never shared across accounts or modes."""
        ...

    async def settle(self, call: ClaimedCall) -> Settled:
        """Obtain the result, record it (fenced by the lease) and return it with its cost.

        Raises a typed ``ProviderError`` / ``FixtureMissing`` for a call that
        failed (recorded as failed), ``CallAmbiguous`` for one sent without a
        definitive answer to a tool that does not de-duplicate (recorded as
        ambiguous), ``ProviderQuotaExhausted`` for one parked unsent (released),
        ``LeaseLost`` when the lease was taken over before sending,
        ``PersistenceCircuitOpen`` when nothing may be dispatched.
        """
        ...

    async def aclose(self) -> None:
        """Wait for work this dispatcher started on its own (bulk requests) to finish."""
        ...

    def abort(self) -> None:
        """Cancel work this dispatcher started on its own: its attempt was cancelled."""
        ...
