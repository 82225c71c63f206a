"""``PacingMargin``: how far below its rate a key is paced, sized by the refusals it meets.

A key is paced a little below the rate in force (its *margin*): calls that leave evenly
spaced arrive a little bunched (the event loop, the network, the provider's own loop),
and a provider with a small burst refuses the ones that arrive too close. The right
margin depends on that arrival jitter, which the worker cannot see directly: what it
sees is the provider's verdict, the "noise" 429s (refusals at a rate proven clean).
So the margin is steered by their measured share of the calls sent:

* over the last ``window_s``, noise refusals above ``high_share`` of the calls sent
  widen the margin, by ``step`` times how far the share is over (up to ``max_steps``
  steps at once): the jitter is larger than the margin absorbs;
* an isolated refusal (a share at or under ``high_share``, or fewer than
  ``min_events`` in the window) moves nothing: a margin step costs its share of every
  call from then on, one refusal costs one pause;
* every ``relax_s`` without a noise refusal gives back a ``step`` (towards ``ceiling``,
  which may be above where the key started: a key whose jitter turns out small is
  paced closer to its rate), so a loaded minute is not paid for the rest of the run.

Pure arithmetic: every method takes ``now`` from its caller.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field, model_validator

from playline.spec_model import SpecModel

__all__ = ["MarginConfig", "PacingMargin"]


class MarginConfig(SpecModel):
    """The constants of the margin (see the module docstring)."""

    floor: Annotated[float, Field(gt=0, le=1)] = 0.90
    ceiling: Annotated[float, Field(gt=0, le=1)] = 0.98
    step: Annotated[float, Field(gt=0)] = 0.01
    max_steps: Annotated[float, Field(ge=1)] = 3.0
    window_s: Annotated[float, Field(gt=0)] = 30.0
    high_share: float = 0.004
    min_events: int = 3
    relax_s: Annotated[float, Field(gt=0)] = 15.0

    @model_validator(mode="after")
    def _bounds(self) -> MarginConfig:
        if self.floor > self.ceiling:
            raise ValueError("margin bounds must satisfy floor <= ceiling")
        return self


@dataclass(slots=True)
class PacingMargin:
    """The margin of one pacing key: a fraction of the rate in force, in ``[floor, ceiling]``.

    Args:
        value: where it starts (the key's base margin).
        config: the constants.
    """

    value: float
    config: MarginConfig = field(default_factory=MarginConfig)
    #: when noise refusals came (clumps counted once by the caller), and calls were sent
    _events: deque[float] = field(default_factory=deque, init=False)
    _sent: deque[float] = field(default_factory=deque, init=False)
    #: when the margin last moved, or the last noise refusal (whichever is later)
    _since: float = field(default=-math.inf, init=False)

    def reset(self, value: float) -> None:
        """Start again at ``value`` (the key's limits changed)."""
        self.value = value
        self._events.clear()

    def on_sent(self, now: float) -> None:
        """A call of the key left."""
        self._sent.append(now)
        _trim(self._sent, now - self.config.window_s)

    def on_noise(self, now: float) -> bool:
        """A noise 429 came (one per clump); returns whether the margin widened."""
        cfg = self.config
        self._events.append(now)
        _trim(self._events, now - cfg.window_s)
        _trim(self._sent, now - cfg.window_s)
        self._since = now
        events = len(self._events)
        share = events / max(1, len(self._sent))
        if events < cfg.min_events or share <= cfg.high_share:
            return False
        steps = min(cfg.max_steps, share / cfg.high_share - 1.0)
        before = self.value
        self.value = max(cfg.floor, self.value * (1.0 - cfg.step * max(steps, 1.0)))
        # What widened it is paid for: the next refusals are measured against the new one.
        self._events.clear()
        return self.value < before

    def hold(self, now: float) -> None:
        """A 429 that was not noise (a cut): the clean period starts again."""
        self._since = now

    def relax(self, now: float, ceiling: float | None = None) -> bool:
        """Give back a step after ``relax_s`` clean, up to ``ceiling`` (default: the
        config's); whether the margin changed."""
        cfg = self.config
        top = cfg.ceiling if ceiling is None else min(ceiling, cfg.ceiling)
        if self.value >= top or now - self._since < cfg.relax_s:
            return False
        if math.isinf(self._since):
            self._since = now  # the first look starts the clean period
            return False
        self.value = min(top, self.value + cfg.step)
        self._since = now
        return True


def _trim(times: deque[float], before: float) -> None:
    while times and times[0] < before:
        times.popleft()
