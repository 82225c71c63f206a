"""Where playline errors become Temporal errors.

Activities raise typed ``PlaylineError``s; at the activity boundary each becomes an
``ApplicationError`` whose ``type`` is the class name and whose retryability comes
from the class, so Temporal retries a lost lease but not an unknown tool, and the
workflow failure message is the error's own message.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from temporalio.exceptions import ApplicationError

from playline.errors import PlaylineError

P = ParamSpec("P")
R = TypeVar("R")


def to_application_error(err: PlaylineError) -> ApplicationError:
    return ApplicationError(str(err), type=type(err).__name__, non_retryable=not err.retryable)


def translate_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate an activity so its ``PlaylineError``s reach Temporal typed."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except PlaylineError as err:
            raise to_application_error(err) from err

    return wrapper
