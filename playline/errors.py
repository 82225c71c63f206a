"""Typed errors, raised where a problem is detected and rendered once at the edge.

Every message says what was wrong and what to do about it. Each class declares,
once, how the runtime treats it:

* ``retryable`` - whether Temporal should retry the activity that raised it. At
  the activity boundary (:mod:`playline.interceptors`) every ``PlaylineError``
  becomes an ``ApplicationError`` whose ``type`` is the class name and whose
  ``non_retryable`` is ``not retryable``; workflows' retry policies name
  :func:`non_retryable_types`.
* ``chunk_fatal`` - whether it is about the play or the worker rather than one
  row, so it stops the whole chunk instead of being recorded on the row.

This module imports nothing but the standard library, so every layer may raise
these errors. It also holds how messages describe what they must not quote (a CSV
header: :func:`header_summary`), shared by the CSV reader and the sheet store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any


class PlaylineError(Exception):
    """Base class of every playline error."""

    #: Whether Temporal should retry the activity that raised this.
    retryable: bool = False
    #: Whether it stops the chunk (about the play or the worker, not one row).
    chunk_fatal: bool = False


class TemporalUnavailable(PlaylineError):
    """The Temporal frontend could not be reached (or refused the connection)."""


class InvalidPlayInput(PlaylineError):
    """The play's input (or a dataset it loads) is malformed."""


class CatalogError(PlaylineError):
    """The provider catalog is malformed."""


class UnknownTool(PlaylineError):
    """A resolver asked for a tool id the catalog does not declare."""

    chunk_fatal = True


class InvalidToolInput(PlaylineError):
    """A tool call's input does not match the tool's input model (an unknown field, a
    wrong type): a bug in the play."""


class BlankInput(PlaylineError):
    """A tool call's required input field is blank: missing, ``None``, or an empty or
    whitespace-only string. Missing data, not a bug in the play (so not an
    ``InvalidToolInput``): the call is refused before a receipt is claimed, a budget
    reserved or anything sent. A row's cell whose resolver lets it through is recorded
    ``skipped_input`` (free) and the row goes on; a waterfall step records it as its
    outcome and tries the next step. About one row, never retried.

    The message names the tool and the fields, never the row's values.
    """

    def __init__(self, tool_id: str, fields: Sequence[str]) -> None:
        names = ", ".join(repr(name) for name in fields)
        noun = "input" if len(fields) == 1 else "inputs"
        verb = "is" if len(fields) == 1 else "are"
        super().__init__(
            f"tool {tool_id!r}: required {noun} {names} {verb} blank; nothing was sent "
            "(skipped_input, free)"
        )
        self.tool_id = tool_id
        self.fields = tuple(fields)


class UnknownResolver(PlaylineError):
    """A column names a resolver that is not registered in this worker."""

    chunk_fatal = True


class MissingApiKey(PlaylineError):
    """The environment variable holding a provider's API key is not set."""

    chunk_fatal = True


class FixtureMissing(PlaylineError):
    """Fixture mode found no fixture for a tool call."""


class LeaseLost(PlaylineError):
    """Another owner took over a receipt this chunk had claimed.

    The chunk stops dispatching; Temporal retries it and the new attempt
    reclaims (or reuses) the receipts.
    """

    retryable = True
    chunk_fatal = True


class PersistenceCircuitOpen(PlaylineError):
    """A receipt or sheet write failed earlier in this run.

    No further provider call is dispatched in the run, so nothing is paid for
    that could not be recorded.
    """

    retryable = True
    chunk_fatal = True

    def __init__(self, cause: str, prevented_calls: int, rows_held_back: int = 0) -> None:
        held = f"{prevented_calls} provider call(s)"
        if rows_held_back:
            held += f" and {rows_held_back} row(s) not yet started"
        super().__init__(
            f"persistence failed earlier in this chunk ({cause}); {held} were held back, "
            "nothing was dispatched after the failure. Check the store (disk space, "
            "database connectivity); Temporal retries the chunk."
        )
        self.cause = cause
        self.prevented_calls = prevented_calls
        self.rows_held_back = rows_held_back


class ProviderError(PlaylineError):
    """A provider call did not produce a usable result.

    ``may_have_charged`` says whether the request may have been processed (and paid
    for) although no usable answer came back: a timeout after it was sent, a dropped
    connection, a 500, a 200 whose body is not JSON. Such an outcome is *ambiguous*:
    re-sending it is free only for a tool whose provider de-duplicates
    (``idempotency = "key"`` or ``"natural"`` in the catalog). A definitive failure (a
    4xx, a 429, a 503, a refused connection) was not processed and may be retried.
    """

    def __init__(
        self,
        message: str,
        *,
        tool_id: str,
        status: int | None = None,
        retry_after_s: float | None = None,
        may_have_charged: bool = False,
    ) -> None:
        super().__init__(message)
        self.tool_id = tool_id
        self.status = status
        self.retry_after_s = retry_after_s
        self.may_have_charged = may_have_charged


class ProviderRateLimited(ProviderError):
    """The provider answered 429 (after the retries the budget allowed)."""

    retryable = True


class ProviderTransientError(ProviderError):
    """A 5xx, a connection reset or a malformed body (after retries)."""

    retryable = True


class ProviderTimeout(ProviderError):
    """The provider did not answer in time (after retries)."""

    retryable = True


class ProviderRejected(ProviderError):
    """The provider rejected the request (4xx other than 429); not retried."""


class ProviderQuotaExhausted(ProviderError):
    """The provider cannot take a call before ``resume_at``; nothing was dispatched.

    Raised instead of waiting when the governor knows the key stays blocked
    past the attempt's parking horizon (a daily quota spent, a ``Retry-After``
    of minutes, a rate-limit reset far away). The receipt is released, not
    failed, so the caller can park durably and resume at ``resume_at`` (Unix
    epoch seconds, wall clock) without paying twice.
    """

    retryable = True
    chunk_fatal = False

    def __init__(self, provider: str, resume_at: float, *, tool_id: str = "") -> None:
        when = datetime.fromtimestamp(resume_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        super().__init__(f"{provider} quota exhausted until {when}", tool_id=tool_id)
        self.provider = provider
        self.resume_at = resume_at


class JobPending(ProviderQuotaExhausted):
    """A call's provider job is still running (or waits for room in the provider's
    queue): the row leaves the chunk like a parked row and runs again at
    ``resume_at``, when its job is looked at again; nothing is submitted twice.

    ``submitted`` says whether the job went out (its charge comes when it finishes,
    so a budget keeps the call's reservation) or is not sent yet (queue full).
    """

    def __init__(
        self,
        provider: str,
        resume_at: float,
        *,
        tool_id: str = "",
        job_id: str | None = None,
        submitted: bool = True,
    ) -> None:
        super().__init__(provider, resume_at, tool_id=tool_id)
        when = datetime.fromtimestamp(resume_at, tz=UTC).strftime("%H:%M:%S UTC")
        what = f"job {job_id}" if job_id else "a job (queue full)"
        self.args = (f"{provider} {what} still running; looked at again at {when}",)
        self.job_id = job_id
        self.submitted = submitted


class JobFailed(ProviderRejected):
    """A provider job failed, or did not finish within the tool's ``max_wait_s``: its
    calls fail with the reason (a later run submits them again)."""


class BudgetReached(PlaylineError):
    """A paid call's worst case does not fit what is left of a budget; nothing was sent.

    Raised before sending (the reservation was refused, the receipt released), so the
    row is left unprocessed: the dataset run waits for more budget (``runs budget
    --add``) or stops, as the run's ``on_budget`` says. About one row, never retried
    by Temporal.
    """

    retryable = False
    chunk_fatal = False

    def __init__(
        self,
        budget: str,
        *,
        limit: float,
        used: float,
        needed: float,
        tool_id: str = "",
        provider: str | None = None,
        resets_at: float | None = None,
        spent: float | None = None,
        currency: str | None = None,
    ) -> None:
        unit = currency or "credits"
        super().__init__(
            f"budget {budget} reached: {used:g} of {limit:g} {unit} spent or reserved, "
            f"{tool_id or 'the call'} may cost {needed:g}"
        )
        self.budget = budget
        self.limit = limit
        self.used = used
        self.needed = needed
        self.tool_id = tool_id
        #: the provider whose cap it is (None: the run's or a named budget)
        self.provider = provider
        #: when a named budget's period ends (epoch seconds)
        self.resets_at = resets_at
        #: of ``used``, what is settled (the rest is reserved by calls and rows in flight)
        self.spent = used if spent is None else spent
        #: the figures are money in this currency (a run's money cap), not credits
        self.currency = currency


class SpendUnpriced(PlaylineError):
    """A run capped in money (``max_spend``) is about to call a provider whose credits
    have no price in the run's currency (no ``credit_price`` in the catalog, or another
    ``currency``): its cost cannot be counted against the cap, so nothing is sent. About
    the play, not one row."""

    chunk_fatal = True


class NotSentCancelled(PlaylineError):
    """A call a cancelled run would have sent new; nothing was sent.

    A run cancelled while rows wait on provider jobs still reads those jobs (they are
    paid for), re-running only those rows; every call that would send something new
    (a waterfall's next step, a column not reached) is refused with this error, and
    the row is recorded with what it had already paid for. About one row.
    """

    def __init__(self, tool_id: str) -> None:
        super().__init__(
            f"{tool_id}: not sent: the run was cancelled (only answers already paid for are read)"
        )
        self.tool_id = tool_id


class UnknownBudget(PlaylineError):
    """A budget was named that does not exist and could not be created (no limit given,
    or a named budget nobody defined with ``playline budgets set``)."""


class UnknownJob(PlaylineError):
    """A provider job was named that the job ledger does not hold (it is recorded by
    ``JobStore.open`` before anything else is done with it: a bug, not retried)."""


class InvalidBudget(PlaylineError, ValueError):
    """A budget's name, period or amount is malformed (a ``ValueError`` too, for callers
    that validate arguments)."""


class CallAmbiguous(PlaylineError):
    """A call to a tool that does not de-duplicate was sent and got no definitive answer.

    It may have been charged, so it is never re-sent automatically: its receipt is
    ``ambiguous`` and the row fails with this error. A run with
    ``RunOptions(retry_ambiguous=True)`` (``playline run --retry-ambiguous``) re-sends
    it on purpose. Retrying the chunk cannot help, and it is about one row.
    """

    def __init__(self, tool_id: str, reason: str) -> None:
        super().__init__(
            f"{tool_id}: the request was sent but got no definitive answer ({reason}); "
            "it may have been charged, so it was not re-sent (re-send it on purpose with "
            "--retry-ambiguous)"
        )
        self.tool_id = tool_id
        self.reason = reason


class UnstorableValue(PlaylineError):
    """A resolver returned a value the sheet store cannot keep (NaN, a NUL, a datetime).

    It fails that row only; the row's other cells are kept.
    """


class RowFailed(PlaylineError):
    """A row's resolver failed and the dataset runs with ``on_row_error="fail"``."""


def non_retryable_types() -> list[str]:
    """The type names of every error retrying cannot fix, for Temporal retry policies.

    Derived from the classes' ``retryable`` flags (``PlaylineError`` itself
    included: an unclassified playline error is a bug retrying will not fix).
    """
    names: list[str] = []
    pending: list[type[PlaylineError]] = [PlaylineError]
    while pending:
        cls = pending.pop(0)
        if not cls.retryable and cls.__name__ not in names:
            names.append(cls.__name__)
        pending.extend(cls.__subclasses__())
    return names


def root_cause(err: BaseException) -> BaseException:
    """The innermost cause of a Temporal error chain (what the user needs to read).

    Temporal's failure errors chain through ``.cause``; plain exceptions have none.
    """
    cause: Any = err
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause
    result: BaseException = cause
    return result


def format_validation_errors(errors: Iterable[Mapping[str, Any]], *, top: str = "input") -> str:
    """One line naming every problem of a pydantic ``ValidationError.errors()``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or top}: {e['msg']}" for e in errors)


#: Header names a message shows at most, and the characters of each.
SHOWN_NAMES = 3
SHOWN_NAME_CHARS = 32


def shown_names(names: Sequence[str]) -> str:
    """At most three names, each cut to 32 characters: ``'a', 'b', 'c', ...``."""
    shown = [
        repr(n[:SHOWN_NAME_CHARS] + ("…" if len(n) > SHOWN_NAME_CHARS else ""))
        for n in names[:SHOWN_NAMES]
    ]
    return ", ".join(shown + (["..."] if len(names) > SHOWN_NAMES else []))


def header_summary(columns: Sequence[str]) -> str:
    """How messages describe a header without quoting it: ``the header has 14 columns:
    'a', 'b', 'c', ...`` (a header may be anything a play names, even a secrets file)."""
    count = len(columns)
    noun = "column" if count == 1 else "columns"
    return f"the header has {count} {noun}: {shown_names(columns)}"
