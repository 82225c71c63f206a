"""One tool call, from a resolver to a recorded receipt. No Temporal in here.

The path of one call, top to bottom::

    rc.tool("email_finder", {...})                     activities/chunk.py (RowCall)
      -> ToolRunner.call: validate, dedup, claim       calls/runner.py
           -> ReceiptStore.claim (bulk, per tick)      stores/receipts.py (decide_claim)
           -> Dispatcher.settle                        calls/dispatch.py (the protocol)
                LiveDispatcher.settle                  calls/live.py
                  -> PacedSender.send -> CallOutcome   calls/live.py
                       -> Governor.permit              pacing/governor.py
                       -> Attempt.mark_sent (none)     calls/attempt.py
                       -> ProviderClient.exchange      calls/http.py
                  -> ToolSpec.charge(answer): credits  calls/billing.py (rule or report)
                  -> settle(outcome) -> receipt        calls/settle.py (one rule)
                       -> ReceiptStore.complete/...    stores/receipts.py (fenced)

Fixture mode swaps ``LiveDispatcher`` for ``FixtureDispatcher``
(:mod:`~playline.calls.fixtures`); a tool with a bulk endpoint is settled by
``BulkDispatcher`` (:mod:`~playline.calls.bulk`) behind ``LiveDispatcher``. Nothing
calls back up the chain: dispatchers share only the attempt's public state
(:mod:`~playline.calls.attempt`: leases, breaker, stats, metrics).

The catalog (:mod:`~playline.calls.catalog`) says what tools exist, where they
live, how they bill (:mod:`~playline.calls.billing`), how fast their provider may be
called, and which waterfalls (:mod:`~playline.calls.waterfall_spec`) try them in
order. A waterfall (:mod:`~playline.calls.waterfall`) is a loop of ``rc.tool`` calls
over the same path; :mod:`~playline.calls.provenance` turns a column's calls into its
cell's provenance.

A run with a budget wraps its live dispatcher in ``BudgetedDispatcher``
(:mod:`~playline.calls.budget`): a paid call's worst case is reserved in the budget
ledger before it is sent and settled at what it cost (a row's worst case is reserved
as one before the row starts); :mod:`~playline.calls.accounting` counts each provider's
requests, charges, replays and reuses.

An estimate (:mod:`~playline.calls.estimate`) runs the same row context, ``ToolRunner``
and waterfall loop with an ``EstimatingDispatcher`` below them: a read-only
``ReceiptStore.get`` instead of a claim, and a count
(:mod:`~playline.calls.estimate_tally`) instead of a dispatch; the waterfall weighs an
unpaid step by the chance it gives the value.
"""

from playline.calls.attempt import Attempt, CallStats
from playline.calls.catalog import Catalog, ToolSpec
from playline.calls.dispatch import ClaimedCall, Dispatcher
from playline.calls.fixtures import FixtureBook, FixtureDispatcher
from playline.calls.http import ProviderClient
from playline.calls.live import LiveDispatcher, PacedSender, RetryPolicy
from playline.calls.runner import ToolResult, ToolRunner

__all__ = [
    "Attempt",
    "CallStats",
    "Catalog",
    "ClaimedCall",
    "Dispatcher",
    "FixtureBook",
    "FixtureDispatcher",
    "LiveDispatcher",
    "PacedSender",
    "ProviderClient",
    "RetryPolicy",
    "ToolResult",
    "ToolRunner",
    "ToolSpec",
]
