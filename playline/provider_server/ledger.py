"""The provider server's ledger: what was received, what was charged, what went wrong.

playline's promise is "never pay a provider twice, never exceed its limit", and
this ledger is how tests and benchmarks check it from the provider's side of the
wire: ``double_charged`` counts charged calls whose exact input had already been
charged, ``rate_limited`` counts requests that broke the limit, ``max_in_flight``
the highest concurrency observed. A bounded list of per-call records lets a
benchmark compute the achieved rate per time window.

A charge the client never learnt about is the case playline must not retry
blindly, so the ledger also counts ``charged_unanswered``: charged calls whose
client got no usable answer, by reason (``UNANSWERED_REASONS``): the client was
gone when the answer was ready (``client_gone``: it timed out, was cancelled or
was SIGKILLed while the request slept in the latency), or a charged fault broke
the answer (``malformed``, ``500_after_charge``, ``drop_after_charge``,
``timeout_after_charge``). A charged fault is the reason even when the client
also left (it left *because* of the fault); ``client_gone`` is for calls that
would have been answered. Each call record says ``answered`` and carries
``idem``, a digest of its ``Idempotency-Key``, and ``in_flight_idem`` lists the
digests of the requests in flight, so a test that kills a client can name the
exact call it cut off.

Each provider's account also has a balance: its ``starting_balance`` (config) less
its ``credits_by_provider``, which its balance endpoint reports (see ``balances``);
those requests are free and counted apart, in ``balance_reads_by_provider``.

Every charged call also has a price: ``credits`` is what the provider billed in all
(``credits_by_provider``, ``credits_by_path``), net of refunds. A provider that
charges up front and refunds a miss adds the charge and subtracts the refund, and
``refunds`` / ``credits_refunded`` count those. A charged fault is billed like the
answer it broke; an idempotent replay is not charged and costs nothing. Each call
record carries its net ``credits`` (0 when not charged), so playline's own credit
figures can be checked against the provider's, call by call.

playline's accounts (``playline.calls.accounting``) are checked per provider against
``received_by_provider`` (requests), ``billed_by_provider`` (charged calls whose net
bill is more than 0: a free miss is charged 0, not billed), ``replays_by_provider``
(answers replayed for a repeated ``Idempotency-Key``, counted in ``duplicates``) and
``credits_by_provider``.

The asynchronous job providers (``fullenrich``, ``dropcontact``; see ``jobs``) are
counted per provider in ``jobs_by_provider`` (``JOB_COUNTERS``): ``job_submits``
(submit requests that created a job), ``jobs`` (distinct jobs by content: a batch
submitted twice is 2 submits, 1 job), ``job_members`` (contacts submitted),
``duplicate_submits`` (contacts whose input, by digest and without the echoed
``custom`` fields, had been submitted before, in this job or another), ``polls``
(status requests answered), ``jobs_finished``, ``submits_unanswered`` (a job was
created but its submit's answer was lost: a charged fault or a client gone) and the
webhooks: ``webhooks_sent`` (every POST attempt, retries and duplicate copies
included, and the deliveries dropped on purpose, which the server believes it sent),
``webhooks_delivered`` (attempts answered 2xx), ``webhooks_failed`` (attempts
answered non-2xx or not at all), ``webhooks_dropped`` and ``webhooks_abandoned``
(deliveries given up after the last retry). Each finished contact is charged once, as
one charge of the submit path whose digest is the contact's input: a contact bought
twice is ``double_charged``. Job charges carry no call record (they happen after the
calls).

The ledger lives in the server's event loop thread and is mutated without locks;
every method is synchronous and never awaits.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, deque
from dataclasses import dataclass, field, fields
from typing import Any

#: ``(t_monotonic, t_wall, provider, path, status, charged, items, duplicate, key,
#: idem, answered, unanswered_reason, credits)``; ``key`` is the API key's digest
#: (``key_digest``), never the key; ``idem`` is ``idem_digest`` of the
#: ``Idempotency-Key`` header (``""`` without one); ``answered`` is False when the
#: client got no usable answer, and ``unanswered_reason`` then says why (``""`` else);
#: ``credits`` is what the call was billed, net of any refund (appended last so
#: readers that index the older fields keep working).
CallRecord = tuple[float, float, str, str, int, bool, int, bool, str, str, bool, str, float]

_RECORD_FIELDS = (
    "t", "wall", "provider", "path", "status", "charged", "items", "duplicate", "key",
    "idem", "answered", "unanswered_reason", "credits",
)  # fmt: skip

#: Why a charged call went unanswered (the keys of ``charged_unanswered_by_reason``).
UNANSWERED_REASONS = (
    "client_gone",
    "500_after_charge",
    "drop_after_charge",
    "timeout_after_charge",
    "malformed",
)


#: The per-provider counters of the asynchronous job providers (``jobs_by_provider``).
JOB_COUNTERS = (
    "job_submits",
    "jobs",
    "job_members",
    "duplicate_submits",
    "polls",
    "jobs_finished",
    "submits_unanswered",
    "webhooks_sent",
    "webhooks_delivered",
    "webhooks_failed",
    "webhooks_dropped",
    "webhooks_abandoned",
)


def idem_digest(idempotency_key: str | None) -> str:
    """The first 16 hex digits of sha256 of an ``Idempotency-Key``; ``""`` without one.

    Tests compute the same digest from the key they sent to find their call.
    """
    if idempotency_key is None:
        return ""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Bill:
    """What one call costs: the charge, and what a refund-on-miss provider gives back."""

    #: what the provider charged for the call, before any refund
    credits: float = 0.0
    #: what it gave back (a refund-on-miss provider), and for how many misses
    refunded: float = 0.0
    refunds: int = 0

    @property
    def net(self) -> float:
        """What the call costs in the end."""
        return self.credits - self.refunded


@dataclass(frozen=True)
class Charge:
    """One charged call: where, which input, how many bulk items (1 for a single call)."""

    provider: str
    path: str
    body_digest: bytes
    #: Digests of the company-lookup items bought (single or bulk), for item-level checks.
    item_digests: tuple[bytes, ...] = ()
    items: int = 1
    bill: Bill = Bill()


@dataclass
class Tally:
    """What the ledger counts from one reset to the next; :meth:`Ledger.snapshot`
    reports each field under its own name (the module docstring says what each is)."""

    started_at: float = field(default_factory=time.time)
    received: int = 0
    charged: int = 0
    duplicates: int = 0
    double_charged: int = 0
    double_charged_items: int = 0
    items_charged: int = 0
    rate_limited: int = 0
    faults: int = 0
    unauthorized: int = 0
    invalid: int = 0
    conflicts: int = 0
    charged_unanswered: int = 0
    charged_unanswered_by_reason: Counter[str] = field(default_factory=Counter)
    #: the highest concurrency since the reset (a reset starts it at what is in flight)
    max_in_flight: int = 0
    charged_by_path: Counter[str] = field(default_factory=Counter)
    credits: float = 0.0
    credits_by_provider: dict[str, float] = field(default_factory=dict)
    credits_by_path: dict[str, float] = field(default_factory=dict)
    refunds: int = 0
    credits_refunded: float = 0.0
    received_by_provider: Counter[str] = field(default_factory=Counter)
    charged_by_provider: Counter[str] = field(default_factory=Counter)
    billed_by_provider: Counter[str] = field(default_factory=Counter)
    replays_by_provider: Counter[str] = field(default_factory=Counter)
    rate_limited_by_provider: Counter[str] = field(default_factory=Counter)
    faults_by_kind: Counter[str] = field(default_factory=Counter)
    max_in_flight_by_provider: Counter[str] = field(default_factory=Counter)
    key_digests_by_provider: dict[str, set[str]] = field(default_factory=dict)
    jobs_by_provider: dict[str, Counter[str]] = field(default_factory=dict)
    #: balance requests answered (free, not counted in ``received``)
    balance_reads_by_provider: Counter[str] = field(default_factory=Counter)


class Ledger:
    """Counters and call records of one provider server since its last reset."""

    def __init__(self, max_records: int = 100_000) -> None:
        self.max_records = max_records
        self.in_flight = 0
        self.in_flight_by_provider: Counter[str] = Counter()
        #: idem digests of the keyed requests in flight (a reset keeps them: they will leave)
        self.in_flight_idem: Counter[str] = Counter()
        self.reset()

    def reset(self) -> None:
        """Forget everything (counters, records, charged inputs) but what is in flight now."""
        self.tally = Tally(
            max_in_flight=self.in_flight,
            max_in_flight_by_provider=Counter(+self.in_flight_by_provider),
        )
        self._charged_inputs: set[tuple[str, bytes]] = set()
        self._charged_items: set[bytes] = set()
        self.records: deque[CallRecord] = deque(maxlen=self.max_records)

    def resize(self, max_records: int) -> None:
        """Change how many call records are kept (the newest are kept)."""
        if max_records != self.max_records:
            self.max_records = max_records
            self.records = deque(self.records, maxlen=max_records)

    def enter(self, provider: str, idem: str = "") -> int:
        """A request arrived; returns how many of this provider's requests are now in flight."""
        if idem:
            self.in_flight_idem[idem] += 1
        self.tally.received += 1
        self.tally.received_by_provider[provider] += 1
        self.in_flight += 1
        self.tally.max_in_flight = max(self.tally.max_in_flight, self.in_flight)
        current = self.in_flight_by_provider[provider] + 1
        self.in_flight_by_provider[provider] = current
        if current > self.tally.max_in_flight_by_provider[provider]:
            self.tally.max_in_flight_by_provider[provider] = current
        return current

    def leave(self, provider: str, idem: str = "") -> None:
        """A request finished (whatever its outcome)."""
        self.in_flight -= 1
        self.in_flight_by_provider[provider] -= 1
        if idem:
            self.in_flight_idem[idem] -= 1
            if self.in_flight_idem[idem] <= 0:
                del self.in_flight_idem[idem]

    def saw_key(self, provider: str, digest: str) -> None:
        """Note the fingerprint (never the key) of an API key a provider was called with."""
        self.tally.key_digests_by_provider.setdefault(provider, set()).add(digest)

    def note_rate_limited(self, provider: str) -> None:
        self.tally.rate_limited += 1
        self.tally.rate_limited_by_provider[provider] += 1

    def note_replay(self, provider: str) -> None:
        """An answer replayed for a repeated ``Idempotency-Key`` (not charged)."""
        self.tally.duplicates += 1
        self.tally.replays_by_provider[provider] += 1

    def note_job(self, provider: str, counter: str, count: int = 1) -> None:
        """Add ``count`` to one of ``provider``'s ``JOB_COUNTERS``."""
        if counter not in JOB_COUNTERS:
            raise ValueError(f"unknown job counter {counter!r}")
        self.tally.jobs_by_provider.setdefault(provider, Counter())[counter] += count

    def note_balance_read(self, provider: str) -> None:
        """A balance request was answered (free; not a call: ``received`` skips it)."""
        self.tally.balance_reads_by_provider[provider] += 1

    def used(self, provider: str) -> float:
        """The credits billed to ``provider`` since the last reset, net of refunds."""
        return self.tally.credits_by_provider.get(provider, 0.0)

    def note_fault(self, kind: str) -> None:
        self.tally.faults += 1
        self.tally.faults_by_kind[kind] += 1

    def charge(self, charge: Charge) -> None:
        """Charge one call, counting it as double-charged if its input was charged before."""
        self.tally.charged += 1
        self.tally.charged_by_path[charge.path] += 1
        self.tally.charged_by_provider[charge.provider] += 1
        key = (charge.path, charge.body_digest)
        if key in self._charged_inputs:
            self.tally.double_charged += 1
        else:
            self._charged_inputs.add(key)
        self.tally.items_charged += charge.items
        self._bill(charge)
        for item in charge.item_digests:
            if item in self._charged_items:
                self.tally.double_charged_items += 1
            else:
                self._charged_items.add(item)

    def _bill(self, charge: Charge) -> None:
        net = charge.bill.net
        if net > 0:
            self.tally.billed_by_provider[charge.provider] += 1
        self.tally.credits += net
        self.tally.credits_by_provider[charge.provider] = (
            self.tally.credits_by_provider.get(charge.provider, 0.0) + net
        )
        self.tally.credits_by_path[charge.path] = (
            self.tally.credits_by_path.get(charge.path, 0.0) + net
        )
        self.tally.refunds += charge.bill.refunds
        self.tally.credits_refunded += charge.bill.refunded

    def record(
        self,
        provider: str,
        path: str,
        status: int,
        charged: bool,
        items: int = 1,
        duplicate: bool = False,
        key: str = "",
        idem: str = "",
        unanswered_reason: str = "",
        credits: float = 0.0,
    ) -> None:
        """Append one per-call record (bounded; the oldest fall off).

        ``unanswered_reason`` (one of ``UNANSWERED_REASONS``) marks a call whose
        client got no usable answer; a charged one is counted in
        ``charged_unanswered`` whether or not records are kept.
        """
        answered = not unanswered_reason
        if charged and not answered:
            self.tally.charged_unanswered += 1
            self.tally.charged_unanswered_by_reason[unanswered_reason] += 1
        if self.max_records:
            now, wall = time.monotonic(), time.time()
            call: CallRecord = (
                now, wall, provider, path, status, charged, items, duplicate, key,
                idem, answered, unanswered_reason, credits,
            )  # fmt: skip
            self.records.append(call)

    def calls_since(self, since: float = 0.0, limit: int | None = None) -> list[dict[str, Any]]:
        """Call records with a monotonic time after ``since``, oldest first."""
        selected = [r for r in self.records if r[0] > since]
        if limit is not None:
            selected = selected[-limit:] if limit > 0 else []
        return [dict(zip(_RECORD_FIELDS, r, strict=True)) for r in selected]

    def snapshot(self) -> dict[str, Any]:
        """The ledger as JSON-ready data: every tally (maps as plain dicts, key digests
        sorted, each job provider's ``JOB_COUNTERS`` all present) and what is in flight."""
        tally = self.tally
        return {
            **{f.name: _plain(getattr(tally, f.name)) for f in fields(tally)},
            "key_digests_by_provider": {
                p: sorted(d) for p, d in tally.key_digests_by_provider.items()
            },
            "jobs_by_provider": {
                p: {name: counts[name] for name in JOB_COUNTERS}
                for p, counts in tally.jobs_by_provider.items()
            },
            "in_flight": self.in_flight,
            "in_flight_idem": sorted(self.in_flight_idem.elements()),
            "calls_recorded": len(self.records),
            "now_monotonic": time.monotonic(),
        }


def _plain(value: Any) -> Any:
    """A tally as JSON takes it: a ``Counter`` or map as a plain dict of its own."""
    return dict(value) if isinstance(value, dict) else value


def max_in_window(times: list[float], window: float = 1.0) -> int:
    """The most events in any half-open window ``[s, s + window)``.

    How tests and benchmarks read a rate limit off the call records: a limit of
    ``rps`` with ``burst`` is kept when this stays within ``rps * window + burst``.
    """
    times = sorted(times)
    best = j = 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] < start + window:
            j += 1
        best = max(best, j - i)
    return best
