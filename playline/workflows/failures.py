"""How an activity's or child's failure becomes the play's failure.

The user needs the root cause's message and type, not "Activity task failed":
:func:`as_failure` re-raises it as a non-retryable ``ApplicationError`` carrying
both, so the play's failure (and ``playline runs get``) says what went wrong.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from playline.errors import non_retryable_types, root_cause

__all__ = ["CHUNK_RETRY", "SETUP_RETRY", "as_failure"]

#: Setup activities (loads, prepare, finalize, scalar calls): a few quick retries.
SETUP_RETRY = RetryPolicy(maximum_attempts=5, non_retryable_error_types=non_retryable_types())

#: Chunks: retried patiently (a worker crash costs one heartbeat timeout per retry).
CHUNK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=20,
    non_retryable_error_types=non_retryable_types(),
)


def as_failure(err: BaseException) -> ApplicationError:
    """Re-raise an activity/child failure with the root cause's message and type."""
    cause = root_cause(err)
    kind = (
        cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause).__name__
    )
    message = cause.message if isinstance(cause, ApplicationError) else str(cause)
    return ApplicationError(message, type=kind, non_retryable=True)
