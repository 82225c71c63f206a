"""When a paced call really leaves: stamped by the transport, read by the governor.

A key without a burst (a strict GCRA refuses any call sooner than one interval after
the last one it admitted) is spaced from when its previous call *left*, not from when
that call was admitted: a call admitted on time can leave late (the event loop was
busy, a receipt was written first), and the next one, admitted on schedule, would
then reach the provider right behind it. The governor knows when it admitted a call;
only the call path knows when the request is written. So a permit puts a stamp in its
task's context (:func:`sending_stamp`), and the transport calls :func:`note_sending`
just before it hands the request to the wire; the next call of the key is spaced from
then. A call path that never calls it is spaced from its admission, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

__all__ = ["note_sending", "sending_stamp"]

_STAMP: ContextVar[Callable[[], None] | None] = ContextVar("playline_pacing_stamp", default=None)


def note_sending() -> None:
    """The request of this task's permit is being written now (no permit: nothing)."""
    stamp = _STAMP.get()
    if stamp is not None:
        stamp()


@contextlib.contextmanager
def sending_stamp(stamp: Callable[[], None]) -> Iterator[None]:
    """While held, :func:`note_sending` in this task calls ``stamp``."""
    token = _STAMP.set(stamp)
    try:
        yield
    finally:
        _STAMP.reset(token)
