"""Typed errors, raised where a problem is detected and rendered once at the edge.

Every message says what was wrong and what to do about it. Errors that cross the
activity boundary are converted to ``temporalio.exceptions.ApplicationError`` with
the class name as its ``type`` so the workflow (and the CLI) can tell them apart
and so retry policies can name the non-retryable ones.
"""

from __future__ import annotations


class PlaylineError(Exception):
    """Base class of every playline error."""

    #: Whether Temporal should retry the activity that raised this.
    retryable: bool = False


class InvalidPlayInput(PlaylineError):
    """The play's input (or a dataset it loads) is malformed."""


class CatalogError(PlaylineError):
    """The provider catalog is malformed."""


class UnknownTool(PlaylineError):
    """A resolver asked for a tool id the catalog does not declare."""


class InvalidToolInput(PlaylineError):
    """A tool call's input does not match the tool's input model."""


class UnknownResolver(PlaylineError):
    """A column names a resolver that is not registered in this worker."""


class MissingApiKey(PlaylineError):
    """The environment variable holding a provider's API key is not set."""


class FixtureMissing(PlaylineError):
    """Fixture mode found no fixture for a tool call."""


class LeaseLost(PlaylineError):
    """Another owner took over a receipt this chunk had claimed.

    The chunk stops dispatching; Temporal retries it and the new attempt
    reclaims (or reuses) the receipts.
    """

    retryable = True


class PersistenceCircuitOpen(PlaylineError):
    """A receipt or sheet write failed earlier in this run.

    No further provider call is dispatched in the run, so nothing is paid for
    that could not be recorded.
    """

    retryable = True

    def __init__(self, cause: str, prevented_calls: int) -> None:
        super().__init__(
            f"persistence failed earlier in this chunk ({cause}); "
            f"{prevented_calls} provider call(s) were not dispatched. "
            "Check the store (disk space, database connectivity) and retry."
        )
        self.cause = cause
        self.prevented_calls = prevented_calls


class ProviderError(PlaylineError):
    """A provider call did not produce a usable result."""

    def __init__(
        self,
        message: str,
        *,
        tool_id: str,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.tool_id = tool_id
        self.status = status
        self.retry_after_s = retry_after_s


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


class RowFailed(PlaylineError):
    """A row's resolver failed and the dataset runs with ``on_row_error="fail"``."""
