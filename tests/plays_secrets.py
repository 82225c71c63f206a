"""A play whose own code quotes one of the worker's secrets in an error.

User code does this by accident: a step function or resolver puts the request it
made (headers, URL, settings) into its exception. ``t_leaky_step`` runs such a step
with ``ctx.step``; its error must reach history with the key replaced by
``[redacted]``. ``tests/e2e/test_error_scrubbing.py`` imports this module with
``import_plays``; nothing else registers it.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel

from playline import PlayContext, play, resolver
from playline.errors import PlaylineError

#: The worker's secret the step quotes (the provider fixture exports it).
SECRET_VARIABLE = "ACME_API_KEY"


class StepRefused(PlaylineError):
    """A typed playline error (not retried) raised by the leaky step."""


class LeakyInput(BaseModel):
    #: "plain": a ``ValueError`` caused by a ``ConnectionError``, both quoting the key;
    #: "playline": a ``StepRefused`` quoting it.
    kind: Literal["plain", "playline"]


@resolver
def t_leak(kind: str) -> dict[str, str]:
    """Fails, quoting the worker's acme key (read where the step runs: in the worker)."""
    key = os.environ[SECRET_VARIABLE]
    if kind == "playline":
        raise StepRefused(f"acme refused Authorization: Bearer {key}; check the account")
    try:
        raise ConnectionError(f"acme closed the connection for key {key}")
    except ConnectionError as err:
        raise ValueError(f"lookup with api_key={key} failed") from err


@play(name="t_leaky_step")
async def t_leaky_step(ctx: PlayContext, input: LeakyInput) -> None:
    """One ``ctx.step`` that always fails with the key in its message."""
    await ctx.step("leak", t_leak, input.kind)
