"""What became of one provider request: a value, not an exception in flight.

A dispatcher obtains a :data:`CallOutcome` (over HTTP, from a fixture, for a bulk
request) and hands it to :meth:`Attempt.settle <playline.calls.attempt.Attempt.settle>`,
which maps it to the receipt by one rule for single calls and bulk requests alike:

===============  ==============================  ==================================
outcome          receipt                         the caller gets
===============  ==============================  ==================================
``Answered``     completed (durably: retried)    the data
``Failed``       failed (a later claim retries)  the typed error, raised
``Parked``       released (nothing was sent)     ``ProviderQuotaExhausted``, raised
``Ambiguous``    ambiguous (never re-sent)       ``CallAmbiguous``, raised
===============  ==============================  ==================================

``Ambiguous`` is only ever produced for a tool whose provider does not de-duplicate
(``idempotency = "none"``): the request went out and no definitive answer came back,
so it may have been charged. For ``key`` and ``natural`` tools the same failure is
retried, and after the retries it is ``Failed`` (re-sending it later is free).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from playline.errors import FixtureMissing, ProviderError, ProviderQuotaExhausted

__all__ = ["Ambiguous", "Answered", "CallOutcome", "Failed", "Parked"]


@dataclass(frozen=True, slots=True)
class Answered:
    """The provider answered: ``data`` is the result, ``credits`` what it cost.

    ``source`` says where the figure came from (``"provider"``: it reported the charge;
    ``"rule"``: the catalog's billing rule). A sender leaves ``credits`` at 0 and puts
    the charge the provider reported in a header in ``reported``; the dispatcher that
    knows the answer's shape (single, or a bulk request's members, ``member_credits``)
    prices it (:mod:`playline.calls.billing`) before it is settled.
    """

    data: Any
    credits: float = 0.0
    source: str = "rule"
    reported: float | None = None
    member_credits: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """A definitive failure (or retries used up on a tool that may be re-sent)."""

    error: ProviderError | FixtureMissing


@dataclass(frozen=True, slots=True)
class Parked:
    """Nothing was sent: the provider cannot take the call before ``error.resume_at``."""

    error: ProviderQuotaExhausted


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """Sent, no definitive answer, and the provider does not de-duplicate."""

    error: ProviderError


CallOutcome = Answered | Failed | Parked | Ambiguous
