"""Where playline errors become Temporal errors: one activity interceptor.

Activities raise typed ``PlaylineError``s and know nothing of Temporal's failure
types. At the activity boundary each becomes an ``ApplicationError`` whose
``type`` is the class name and whose retryability comes from the class, so
Temporal retries a lost lease but not an unknown tool, and the workflow's failure
message is the error's own message. ``PlaylinePlugin`` installs it on every
worker, for activities and local activities alike.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from playline.errors import PlaylineError, ProviderQuotaExhausted

__all__ = ["ErrorTranslation", "to_application_error"]

logger = logging.getLogger("playline.activities")


def to_application_error(err: PlaylineError) -> ApplicationError:
    """The ``ApplicationError`` Temporal records for a playline error.

    A provider whose quota is spent until a reset is retried after the reset, on
    Temporal's own durable retry timer (a scalar ``ctx.tool`` call; chunks park
    their rows in the dataset run instead).
    """
    delay = None
    if isinstance(err, ProviderQuotaExhausted):
        delay = timedelta(seconds=max(1.0, err.resume_at - time.time() + 1.0))
    return ApplicationError(
        str(err),
        type=type(err).__name__,
        non_retryable=not err.retryable,
        next_retry_delay=delay,
    )


class _TranslatingInbound(ActivityInboundInterceptor):
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
            raise to_application_error(err) from None


class ErrorTranslation(Interceptor):
    """Turns every ``PlaylineError`` an activity raises into a typed ``ApplicationError``."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TranslatingInbound(next)
