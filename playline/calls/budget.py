"""Budgets on the call path: a paid call's worst case is reserved before it is sent.

:class:`BudgetedDispatcher` wraps a run's live dispatcher. For every claimed call
(a receipt miss: hits never reach a dispatcher, so they never draw on a budget) it

1. reserves the tool's worst-case credits (``ToolSpec.max_credits``; a bulk member's
   share) against every budget the run names (:class:`RunBudget`), in one atomic
   store operation shared by the whole fleet. A refusal releases the receipt and
   raises :class:`~playline.errors.BudgetReached`: nothing was sent, the row is left
   for the dataset run to hold or skip;
2. lets the wrapped dispatcher send and record the call;
3. settles the reservation at what the call actually cost (0 for a miss on a
   charge-on-hit tool), or releases it when nothing can have been charged (parked,
   refused by the provider, the lease lost before sending).

Rows: before a row starts, the chunk reserves the row's worst case (every tool its
columns declare) against the run's budgets as one reservation (:meth:`open_row`);
granted, the row's calls reserve against a budget of the row's own (``row:<payer>``,
limited to that worst case) instead, and when the row ends its reservation is settled
at what the row's budget used (:meth:`close_row`). So the run's budget admits whole
rows, fleet-wide: a tight budget ends with rows that finished, not with every row of
the window half paid for. A call past the row's worst case (a tool its resolver did
not declare) reserves against the run's budgets directly; a row whose reservation is
refused runs that way throughout (it may cost nothing: receipts).

A money cap (``RunOptions(max_spend=...)``) is a line of its own
(:class:`~playline.stores.budget_ids.SpendBudgetId`) whose scale is the called
provider's ``credit_price``: a call reserves its worst case times the price, and settles
at its charge times the same price (the reservation stores its scale). It is checked
call by call: rows do not reserve on it (a row's worst case in money depends on which
providers its calls reach), so a row may stop half paid at a money cap and run again,
its paid calls answered by their receipts, when the cap is raised. A call to a provider
without a price in the run's currency is refused before anything is reserved
(:class:`~playline.errors.SpendUnpriced`).

Every reservation is keyed by the call's receipt and generation (a row's by the row),
so a retried attempt, a SIGKILLed worker's successor or a replayed chunk of the same
run reserves the same call once: N workers, retries and crashes never take spend past
the cap. What is left open on purpose, counting at its worst case (never under): a
call that may have been charged without an answer (ambiguous), a bulk member another
owner answered, a receipt taken over (its new owner settles it), a row left pending
(it runs again under the same reservation), and a reservation whose worker died
between recording the answer and settling (the retry reuses the answer and sends
nothing).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog, ProviderSpec, ToolSpec
from playline.calls.dispatch import ClaimedCall, Dispatcher, Settled
from playline.calls.job_status import MISSING, member_results
from playline.contract import RunOptions
from playline.errors import (
    BudgetReached,
    JobPending,
    LeaseLost,
    ProviderError,
    ProviderQuotaExhausted,
    SpendUnpriced,
)
from playline.stores.budget_ids import (
    BudgetId,
    NamedBudgetId,
    ProviderShareId,
    RowBudgetId,
    RunBudgetId,
    SpendBudgetId,
    check_name,
)
from playline.stores.budgets import (
    TOLERANCE,
    BudgetLine,
    BudgetStore,
    Refusal,
    RunEnd,
    period_bounds,
)
from playline.stores.jobs import Job, JobStore, member_ref
from playline.stores.receipts import Receipt, ReceiptStore

__all__ = [
    "RESERVATION_PATIENCE_S",
    "BudgetedDispatcher",
    "Overshoot",
    "RunBudget",
    "call_reservation_key",
    "charge_at_run_end",
    "end_run_budgets",
]

log = logging.getLogger(__name__)

#: How long a call waits for reservations in flight to settle when none does.
RESERVATION_PATIENCE_S = 15.0


@dataclass(frozen=True, slots=True)
class CreditPrice:
    """What one credit of a provider costs, and in which currency (the catalog's)."""

    price: float
    currency: str


@dataclass(frozen=True)
class RunBudget:
    """The budgets a play run's paid calls draw on (see ``RunOptions``).

    Attributes:
        run: the play run the caps belong to (its run id).
        max_credits: the run's cap over every provider (None: none).
        by_provider: caps per provider.
        named: a named budget of the store (a team's per-day or per-month cap).
        max_spend: the run's cap in money (None: none), in ``currency``.
        prices: each priced provider's credit price (the catalog's).
        currency: the currency ``max_spend`` is in (None: the prices' one currency).
    """

    run: str
    max_credits: float | None = None
    by_provider: Mapping[str, float] = field(default_factory=dict)
    named: str | None = None
    max_spend: float | None = None
    prices: Mapping[str, CreditPrice] = field(default_factory=dict)
    currency: str | None = None

    @classmethod
    def of(cls, options: RunOptions, run: str, catalog: Catalog | None = None) -> RunBudget | None:
        """The run's budgets, or None when it has none (``catalog``: the providers'
        credit prices, for a money cap)."""
        if not options.budgeted:
            return None
        prices = {} if catalog is None else credit_prices(catalog.providers)
        currency = options.spend_currency
        if currency is None:
            found = {p.currency for p in prices.values()}
            currency = found.pop() if len(found) == 1 else None
        return cls(
            run=options.budget_run or run,
            max_credits=options.max_credits,
            by_provider=dict(options.max_credits_by_provider),
            named=options.budget,
            max_spend=options.max_spend,
            prices=prices,
            currency=currency,
        )

    def lines(self, provider: str | None) -> list[BudgetLine]:
        """What a call to ``provider`` reserves against, in refusal order (``None``:
        the lines every provider shares, which a row's worst case reserves on: the
        money cap is not one of them, see the module docstring)."""
        lines: list[BudgetLine] = []
        if self.max_credits is not None:
            lines.append(BudgetLine(RunBudgetId(self.run), self.max_credits))
        cap = None if provider is None else self.by_provider.get(provider)
        if provider is not None and cap is not None:
            lines.append(BudgetLine(ProviderShareId(self.run, provider), cap))
        if provider is not None and self.max_spend is not None:
            lines.append(
                BudgetLine(SpendBudgetId(self.run), self.max_spend, scale=self.price(provider))
            )
        if self.named is not None:
            lines.append(BudgetLine(NamedBudgetId(check_name(self.named))))
        return lines

    def refs(self, provider: str | None) -> list[BudgetId]:
        return [line.budget for line in self.lines(provider)]

    def price(self, provider: str) -> float:
        """What one of ``provider``'s credits counts on the money cap; a provider with
        no price in the cap's currency is :class:`SpendUnpriced` (nothing is sent)."""
        found = self.prices.get(provider)
        if found is None:
            raise SpendUnpriced(
                f"the run has a money cap (--max-spend {self.max_spend:g}) but provider "
                f"{provider!r} has no credit_price in the catalog; state its price or cap "
                "the run in credits (--max-credits)"
            )
        if self.currency is None or found.currency != self.currency:
            priced = ", ".join(sorted({p.currency for p in self.prices.values()}))
            raise SpendUnpriced(
                f"the run has a money cap (--max-spend {self.max_spend:g}) in "
                f"{self.currency or 'no single currency'} but provider {provider!r} prices "
                f"its credits in {found.currency} (the catalog's currencies: {priced})"
            )
        return found.price


def credit_prices(providers: Mapping[str, ProviderSpec]) -> dict[str, CreditPrice]:
    """The credit price of each provider whose catalog entry states one."""
    return {
        name: CreditPrice(spec.credit_price, spec.currency)
        for name, spec in sorted(providers.items())
        if spec.credit_price is not None
    }


@dataclass(frozen=True, slots=True)
class Overshoot:
    """A settled charge above the call's reservation (the rule's worst case was not
    an upper bound of what the provider charged)."""

    tool_id: str
    key: str
    reserved: float
    charged: float


class BudgetedDispatcher:
    """Reserves before sending, settles after; see the module docstring.

    A charge above its reservation (:class:`Overshoot`) is logged, counted
    (``playline_budget_overshoots``) and kept in :attr:`overshoots`; the budget's
    spend records it, so a cap it reached admits nothing more, and from then on this
    dispatcher reserves that tool at the highest charge seen.

    Args:
        inner: the dispatcher that sends and records (live, bulk behind it).
        attempt: the chunk attempt (its store writes trip its breaker).
        store: the budget ledger.
        budget: the run's budgets.
    """

    def __init__(
        self, inner: Dispatcher, attempt: Attempt, store: BudgetStore, budget: RunBudget
    ) -> None:
        self._inner = inner
        self._attempt = attempt
        self._store = store
        self.budget = budget
        #: rows whose worst case is reserved: the budget each draws on
        self._rows: dict[str, BudgetLine] = {}
        #: budgets whose reservations did not settle for the whole patience, and how
        #: much was reserved then: the next call refused by them does not wait again
        self._stuck: dict[str, float] = {}
        #: per tool, the highest charge seen above its worst case: reserved from then on
        self._observed: dict[str, float] = {}
        #: the charges above their reservation this dispatcher settled
        self.overshoots: list[Overshoot] = []

    # -- rows: a row's worst case reserved before it starts -----------------------

    async def open_row(self, payer: str, worst: float) -> bool:
        """Reserve a row's worst case (its columns' declared tools) before it starts.

        Granted, the row has a budget of its own, ``row:<payer>`` with that limit, and
        its calls reserve against it instead of the run's: the run's budget sees the
        row as one reservation, so however many workers start rows, each row that
        starts can finish and a tight budget ends with whole rows, not many half-paid
        ones. While rows under way hold the room it needs, it waits for them (see
        :meth:`_reserve`); refused, when what is spent leaves no room for a whole row,
        the row still runs and each of its paid calls reserves against the run's budget
        on its own (a row answered by receipts costs nothing, a cheap one may fit).
        """
        lines = self.budget.lines(None)
        if worst <= 0 or not lines:
            return False
        row = RowBudgetId(payer)
        if await self._reserve(row.key, worst, lines) is not None:
            return False
        self._rows[payer] = BudgetLine(row, worst)
        return True

    async def adopt_row(self, payer: str) -> bool:
        """Take over the row budget an earlier attempt opened for ``payer`` (a row left
        pending keeps it), reserving nothing new; whether there was one. A cancelled
        run reading its jobs does this instead of :meth:`open_row`: the row's calls
        draw on what it reserved then, and a row that never had one gets none."""
        row = RowBudgetId(payer)
        state = await self._attempt.durably(
            lambda: self._store.state(row), what=f"budget of row {payer}"
        )
        if state is None:
            return False
        self._rows[payer] = BudgetLine(row, state.limit)
        return True

    async def close_row(self, payer: str, *, pending: bool = False) -> None:
        """Settle the row's reservation at what its calls used of its own budget (paid,
        or reserved by a call that may have been charged without an answer); a row left
        ``pending`` keeps it, to run again under it."""
        row = self._rows.pop(payer, None)
        if row is None or pending:
            return
        await self._settle_row(payer)

    async def settle_rows(self, payers: Iterable[str]) -> None:
        """Settle the reservations of rows an earlier attempt finished (the sheet says
        so) but may not have closed: a store error in its ``close_row``, a worker killed
        between the row's write and it. Each settles at what its own budget used; one
        already settled is left alone."""
        for payer in payers:
            await self._settle_row(payer)

    async def _settle_row(self, payer: str) -> None:
        row = RowBudgetId(payer)
        # Read and settled with retries: a transient store error must not leave the
        # row's worst case reserved for good.
        state = await self._attempt.durably(
            lambda: self._store.state(row), what=f"budget of row {payer}"
        )
        used = 0.0 if state is None else state.used
        refs = self.budget.refs(None)
        await self._attempt.durably(
            lambda: self._store.settle(row.key, used, refs), what=f"budget of row {payer}"
        )

    def auth_scope(self, tool: ToolSpec) -> str:
        return self._inner.auth_scope(tool)

    async def settle(self, call: ClaimedCall) -> Settled:
        tool = call.tool
        worst = tool.max_credits
        if worst <= 0:
            return await self._inner.settle(call)
        worst = max(worst, self._observed.get(tool.id, 0.0))
        key = call_reservation_key(call.key, call.generation)
        attempt = self._attempt
        try:
            lines = self.budget.lines(tool.provider)
        except SpendUnpriced:
            await self._release_receipt(call)
            raise
        refusal: Refusal | None = None
        row = self._rows.get(call.payer) if call.payer is not None else None
        if row is not None:
            # Against the row's own budget (and a provider's cap), not the run's; past
            # the row's worst case (a call its resolver did not declare), the run's.
            shared = set(self.budget.refs(None))
            in_row = [row, *(line for line in lines if line.budget not in shared)]
            refusal = await self._reserve(key, worst, in_row)
            if refusal is None:
                lines = in_row
        if row is None or (refusal is not None and refusal.state.budget == row.key):
            refusal = await self._reserve(key, worst, lines)
        refs = [line.budget for line in lines]
        if refusal is not None:
            await self._release_receipt(call)
            state = refusal.state
            ref = state.ref
            raise BudgetReached(
                _shown(ref),
                limit=state.limit,
                used=state.used,
                needed=refusal.needed,
                tool_id=tool.id,
                provider=ref.provider if isinstance(ref, ProviderShareId) else None,
                resets_at=_period_end(ref),
                spent=state.spent,
                currency=self.budget.currency if isinstance(ref, SpendBudgetId) else None,
            )
        try:
            settled = await self._inner.settle(call)
        except JobPending as pending:
            # A job submitted is charged when it finishes: its reservation stays until
            # then (reserving again under the same key draws nothing more).
            if not pending.submitted:
                await self._release(key, refs)
            raise
        except (ProviderQuotaExhausted, LeaseLost):
            await self._release(key, refs)  # not sent
            raise
        except ProviderError as err:
            if not err.may_have_charged:
                await self._release(key, refs)
            raise
        if settled.paid and settled.recorded:
            credits = settled.credits
            await attempt.durably(
                lambda: self._store.settle(key, credits, refs), what=f"budget of {call.key}"
            )
            if credits > worst + TOLERANCE:
                self._overshot(Overshoot(tool.id, call.key, worst, credits), refs)
        return settled

    async def _release_receipt(self, call: ClaimedCall) -> None:
        """Nothing was sent: the call's receipt is given back for a later attempt."""
        attempt = self._attempt
        await attempt.best_effort(
            lambda: attempt.receipts.release([call.key], lease_id=attempt.lease_id),
            what=f"release of {call.key}",
        )

    def _overshot(self, over: Overshoot, refs: list[BudgetId]) -> None:
        """A charge above its reservation: say so, count it, and reserve the tool at
        that figure from now on (its budgets already count it as spent)."""
        self.overshoots.append(over)
        self._observed[over.tool_id] = max(self._observed.get(over.tool_id, 0.0), over.charged)
        log.warning(
            "budget overshoot: %s charged %g credits for %s, %g were reserved (%s); "
            "its further calls reserve %g",
            over.tool_id,
            over.charged,
            over.key,
            over.reserved,
            ", ".join(ref.key for ref in refs),
            over.charged,
        )
        self._attempt.metrics.overshoot(over.tool_id)

    async def _reserve(self, key: str, worst: float, lines: list[BudgetLine]) -> Refusal | None:
        """Reserve, waiting while only reservations in flight stand in the way.

        A budget full of reservations (calls in flight, rows under way) is not spent:
        most settle for less within seconds. So a call the settled spend alone leaves
        room for waits for them, as long as they keep settling; it is refused when the
        spend itself leaves no room, or when nothing has settled for
        :data:`RESERVATION_PATIENCE_S` (reservations kept open: rows waiting to run
        again, calls that may have been charged without an answer).
        """
        attempt = self._attempt
        last_reserved: float | None = None
        waited_since = time.monotonic()
        while True:
            refusal = await attempt.persist(
                self._store.reserve(key, worst, lines, run=self.budget.run)
            )
            if refusal is None:
                return None
            state = refusal.state
            if state.spent + refusal.needed > state.limit + TOLERANCE:
                return refusal  # spent: nothing in flight can make room
            stuck = self._stuck.get(state.budget)
            if stuck is not None and abs(stuck - state.reserved) <= TOLERANCE:
                return refusal  # already waited out in this attempt: nothing settles
            if last_reserved is None or state.reserved < last_reserved - TOLERANCE:
                last_reserved, waited_since = state.reserved, time.monotonic()
            elif time.monotonic() - waited_since > RESERVATION_PATIENCE_S:
                self._stuck[state.budget] = state.reserved
                return refusal
            attempt.check_before_dispatch()
            await asyncio.sleep(0.2 + random.random() * 0.3)

    async def _release(self, key: str, refs: list[BudgetId]) -> None:
        await self._attempt.best_effort(
            lambda: self._store.release(key, refs), what=f"budget release of {key}"
        )

    async def aclose(self) -> None:
        await self._inner.aclose()

    def abort(self) -> None:
        self._inner.abort()


def _shown(budget: BudgetId) -> str:
    """A budget as a person reads it: ``run``, ``spend``, ``acme (provider cap)``,
    ``team-a (2026-12-04)``."""
    match budget:
        case NamedBudgetId(name, None):
            return name
        case NamedBudgetId(name, period):
            return f"{name} ({period})"
        case ProviderShareId(_, provider):
            return f"{provider} (provider cap)"
        case SpendBudgetId():
            return "spend"
    return "run"


def _period_end(budget: BudgetId) -> float | None:
    """When a named budget's period (``named:NAME@2026-12-04`` or ``@2026-12``) ends."""
    if not isinstance(budget, NamedBudgetId):
        return None
    bounds = period_bounds(budget)
    return None if bounds is None else bounds[1]


def call_reservation_key(receipt_key: str, generation: int) -> str:
    """The key a call's reservations are held under: its receipt and generation."""
    return f"{receipt_key}#{generation}"


def charge_at_run_end(
    key: str,
    receipts: Mapping[str, Receipt],
    jobs: Mapping[str, Job],
    catalog: Catalog | None = None,
) -> tuple[bool, float | None]:
    """Whether the call of an open reservation (``<receipt>#<gen>``) was sent, and
    what it was charged if its receipt recorded it (``None``: may have been charged
    without an answer, so its worst case). ``receipts`` by receipt key, ``jobs`` by
    member ref (:func:`playline.stores.jobs.member_ref`).

    Answered in that generation: its recorded charge. Its job finished (its answer
    not read yet): what the job's answer for it is billed (``catalog`` given). Ambiguous,
    or sent (its own request, or a job submitted) with no answer: its worst case. A receipt
    taken to a later generation: its worst case (never under). Nothing sent (no
    receipt, claimed and never sent, a job not submitted): released."""
    receipt_key, _, gen_text = key.rpartition("#")
    try:
        generation = int(gen_text)
    except ValueError:
        return True, None  # not a call key this module made: never under
    receipt = receipts.get(receipt_key)
    ref = member_ref(receipt_key, generation)
    job = jobs.get(ref)
    submitted = job is not None and job.state != "opened"
    if receipt is not None and receipt.generation != generation:
        return True, None
    if receipt is not None and receipt.status == "completed":
        return True, receipt.credits
    if receipt is not None and receipt.status == "ambiguous":
        return True, None
    if job is not None and job.state == "done" and catalog is not None:
        return True, _job_charge(catalog, job, ref)
    if submitted or (receipt is not None and receipt.sent_at is not None):
        return True, None
    return False, None


def _job_charge(catalog: Catalog, job: Job, ref: str) -> float | None:
    """What a finished job charged for member ``ref`` (its answer as the tool bills
    it), ``None`` when that cannot be read (then its worst case)."""
    try:
        tool = catalog.tool(job.tool_id)
        assert tool.job is not None
        result = member_results(tool.job, job.status, len(job.members), done=True)[
            job.members.index(ref)
        ]
        if result is MISSING:
            return None
        return float(tool.charge(result).credits)
    except Exception:  # an unknown tool, an answer not as the catalog says: never under
        return None


async def end_run_budgets(
    budgets: BudgetStore,
    receipts: ReceiptStore,
    jobs: JobStore,
    run: str,
    catalog: Catalog | None = None,
) -> RunEnd:
    """The rule "a run's reservations are settled or released when the run ends,
    however it ends", applied to ``run`` (``RunBudget.run``): each open call
    reservation is judged on its receipt and job (:func:`charge_at_run_end`), then the
    store settles or releases them all, and the rows' at what their budgets used
    (:meth:`BudgetStore.end_run`). Safe to run again: what is settled stays so."""
    opened = await budgets.open_reservations(run)
    calls = [r.key for r in opened if r.what == "call"]
    if not opened:
        return RunEnd(run)
    found: dict[str, Receipt] = {}
    members: dict[str, Job] = {}
    if calls:
        parts = [key.rpartition("#") for key in calls]
        found = await receipts.get(sorted({receipt for receipt, _, _ in parts}))
        refs = [
            member_ref(receipt, int(gen)) if gen.isdigit() else receipt for receipt, _, gen in parts
        ]
        members = await jobs.jobs_of(sorted(set(refs)))
    sent: dict[str, float | None] = {}
    for key in calls:
        was_sent, charged = charge_at_run_end(key, found, members, catalog)
        if was_sent:
            sent[key] = charged
    return await budgets.end_run(run, sent)
