"""Where playline errors become Temporal errors: one activity interceptor.

Activities raise typed ``PlaylineError``s and know nothing of Temporal's failure
types. At the activity boundary each becomes an ``ApplicationError`` whose
``type`` is the class name and whose retryability comes from the class, so
Temporal retries a lost lease but not an unknown tool, and the workflow's failure
message is the error's own message. ``PlaylinePlugin`` installs it on every
worker, for activities and local activities alike.

Every error text that leaves an activity passes the worker's ``SecretScrubber``
(``Services.scrub``: API keys, store passwords, codec keys, the Temporal API key),
since it is recorded in history and shown in the UI: a playline error's message,
an ``ApplicationError``'s, and a plain exception's (a user's resolver or step
function quoting a key). A plain exception becomes the ``ApplicationError`` the SDK
would have made of it (its class name as ``type``, retryable, its traceback and
``__cause__`` chain kept), with the scrubbed text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio.exceptions import ApplicationError, FailureError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from playline.errors import PlaylineError, ProviderQuotaExhausted
from playline.services import ServicesHolder

__all__ = ["ErrorTranslation", "scrubbed_error", "to_application_error"]

logger = logging.getLogger("playline.activities")

Scrub = Callable[[str], str]


def _unchanged(text: str) -> str:
    return text


def to_application_error(err: PlaylineError, scrub: Scrub = _unchanged) -> ApplicationError:
    """The ``ApplicationError`` Temporal records for a playline error.

    A provider whose quota is spent until a reset is retried after the reset, on
    Temporal's own durable retry timer (a scalar ``ctx.tool`` call; chunks park
    their rows in the dataset run instead).
    """
    delay = None
    if isinstance(err, ProviderQuotaExhausted):
        delay = timedelta(seconds=max(1.0, err.resume_at - time.time() + 1.0))
    return ApplicationError(
        scrub(str(err)),
        type=type(err).__name__,
        non_retryable=not err.retryable,
        next_retry_delay=delay,
    )


def scrubbed_error(err: BaseException, scrub: Scrub) -> BaseException:
    """``err`` as Temporal would record it, its text (and its causes') scrubbed.

    Temporal's other failures (cancellation, timeouts, child and activity errors)
    are returned as they are: the SDK treats them by type and their text is its own.
    A plain exception whose text holds a secret becomes the ``ApplicationError`` the
    SDK's failure converter would build from it (``type`` the class name, retryable,
    its ``__cause__`` as the cause), so only the text differs from what history held
    before. An error holding no secret is returned unchanged.
    """
    if isinstance(err, ApplicationError):
        message = err.message
        # The converter records the cause, else the context unless it was suppressed.
        chained = err.__cause__ if err.__suppress_context__ else err.__cause__ or err.__context__
    elif isinstance(err, FailureError) or not isinstance(err, Exception):
        return err
    else:
        message = str(err)
        chained = err.__cause__  # a converted plain exception keeps only its cause
    cause = scrubbed_error(chained, scrub) if chained is not None else None
    clean = scrub(message)
    if clean == message and cause is chained:
        return err
    if isinstance(err, ApplicationError):
        copy = ApplicationError(
            clean,
            *err.details,
            type=err.type,
            non_retryable=err.non_retryable,
            next_retry_delay=err.next_retry_delay,
            category=err.category,
        )
    else:
        copy = ApplicationError(clean, type=type(err).__name__)
    copy.__traceback__ = err.__traceback__
    copy.__cause__ = cause
    return copy


class _TranslatingInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, holder: ServicesHolder | None) -> None:
        super().__init__(next)
        self._holder = holder

    def _scrub(self) -> Scrub:
        """The worker's scrubber while its services are open; else the identity."""
        if self._holder is None:
            return _unchanged
        try:
            return self._holder.services.scrub
        except RuntimeError:  # not open: a worker given neither services nor a run context
            return _unchanged

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await self.next.execute_activity(input)
        except PlaylineError as err:
            # The message says what went wrong and what to do; the traceback goes to
            # the worker's log. Chaining the Python causes would put worker stack
            # traces into history (and past the server's failure size limit).
            logger.debug(
                "activity %s raised %s", input.fn.__name__, type(err).__name__, exc_info=True
            )
            raise to_application_error(err, self._scrub()) from None
        except Exception as err:
            translated = scrubbed_error(err, self._scrub())
            if translated is err:
                raise
            raise translated from translated.__cause__


class ErrorTranslation(Interceptor):
    """Turns every ``PlaylineError`` an activity raises into a typed ``ApplicationError``,
    and every error text an activity raises into one that holds none of the worker's
    secrets (``holder``'s ``Services.scrub``, once its services are open)."""

    def __init__(self, holder: ServicesHolder | None = None) -> None:
        self._holder = holder

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TranslatingInbound(next, self._holder)
