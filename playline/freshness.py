"""Freshness rules: how long a value stays good, by what it turned out to be.

Contact data decays (about 2 % a month), so enrichment is re-run; but a re-run must
pay only for what went stale. A rule says how old a value may be before it is
fetched again, and the answer depends on the value: a found email stays good for
90 days, a miss (``no_match``) is worth retrying after 14, an ``invalid`` or
``catch_all`` verdict after 7. Misses are retried sooner than hits because a miss
is where new data appears.

A :class:`Freshness` applies at two levels:

* a **tool's** (``fresh_for`` in the catalog): a completed receipt older than the
  rule allows for its answer is not an answer any more; the next claim pays for a
  fresh one (in a new receipt generation, so under a new ``Idempotency-Key``);
* a **column's** (``with_column(..., fresh_for=...)``): a cell computed earlier is
  kept, with no resolver run and no call, while it is fresh; once due, the
  resolver runs again and its tool calls refuse receipts older than the rule.

Durations are seconds or strings such as ``"90d"``, ``"14d"``, ``"12h"``, ``"30m"``,
``"45s"``, ``"2w"``; ``None`` means for ever. Everything here is pure (no I/O, no
clock), so the workflow, the activities and the estimator share one rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from playline.spec_model import SpecModel

__all__ = [
    "Freshness",
    "Outcome",
    "PreviousCell",
    "dig",
    "freshness_of",
    "is_present",
    "outcome_of",
    "parse_duration",
    "stricter",
    "within_age",
]

#: What a value turned out to be: something was found, or the answer was empty.
Outcome = Literal["found", "no_match"]

#: A duration as users write it: seconds, a ``timedelta`` or ``"90d"``-style text.
DurationLike = float | int | str | timedelta

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_duration(value: DurationLike | None) -> float | None:
    """Seconds from ``90d``/``12h``/``30m``/``45s``/``2w``, a number or a ``timedelta``.

    ``None`` stays ``None`` (for ever). A bad value raises ``ValueError`` with one line
    saying what is accepted.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"a duration is seconds or text like '90d', not {value!r}")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(
                f"{value!r} is not a duration; use seconds or a number with s, m, h, d or w "
                "(e.g. '90d', '12h')"
            )
        seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    else:
        raise ValueError(f"a duration is seconds or text like '90d', not {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration must be a finite number of seconds >= 0, not {value!r}")
    return seconds


def within_age(fetched_at: float | None, limit: float | None, now: float) -> bool:
    """Whether an answer fetched at ``fetched_at`` is at most ``limit`` seconds old at
    ``now`` (``None`` limit: any age; an answer of unknown date counts as very old)."""
    return limit is None or (fetched_at or 0.0) >= now - limit


def stricter(a: float | None, b: float | None) -> float | None:
    """The shorter of two age limits (``None`` is no limit)."""
    if a is None or b is None:
        return b if a is None else a
    return min(a, b)


def is_present(value: Any) -> bool:
    """Whether a value counts as found: not ``None``, ``""``, ``[]`` or ``{}``."""
    if value is None:
        return False
    if isinstance(value, str):
        return value.strip() != ""
    if isinstance(value, Mapping | Sequence) and not isinstance(value, bytes | bytearray):
        return len(value) > 0
    return True


def dig(value: Any, path: str) -> Any:
    """A dotted path into nested mappings and lists (``"data.status"``), or ``None``."""
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def outcome_of(value: Any, hit: str | None = None, get: Callable[[Any, str], Any] = dig) -> Outcome:
    """``found`` if ``value`` (or its ``hit`` part, read with ``get``) is present."""
    probe = get(value, hit) if hit is not None and isinstance(value, Mapping) else value
    return "found" if is_present(probe) else "no_match"


@dataclass(frozen=True, slots=True)
class PreviousCell:
    """A cell as an earlier run left it: what a resolver re-running it may read
    (``rc.previous``) to decide, for instance, to keep a value a new answer lacks."""

    value: Any
    #: when the value was fetched (epoch seconds; for a value answered by a receipt, the
    #: receipt's date), ``None`` if the run that wrote it did not record it
    fetched_at: float | None
    outcome: Outcome


class Freshness(SpecModel):
    """How long a value stays fresh, by outcome and by value."""

    found: Annotated[float | None, Field(ge=0)] = None
    """how long a found value stays fresh: seconds or a duration ("90d", "12h", "30m", "45s", "2w");
    unset: for ever"""
    no_match: Annotated[float | None, Field(ge=0)] = None
    """how long an empty answer stays fresh before it is retried (a duration; unset: for ever)"""
    by_value: dict[str, float] = {}
    """durations keyed by the value itself (a column holding a verdict), or by the part `by` names
    (a tool's answer): `{invalid = "7d"}`; a key listed here wins over `found` and `no_match`"""
    by: str | None = None
    """the part of an answer (a getter name or dotted path: `"status"`) whose text picks
    `by_value`"""
    hit: str | None = None
    """the part of an answer whose presence makes it found (a tool defaults to its billing rule's
    `hit`; unset: the whole answer counts)"""
    rule: str | None = None
    """a function registered with `@playline.resolver`, called as `rule(value, outcome)` and
    returning a duration (or `None`: for ever); it wins over everything else. A column's
    `fresh_for` only: a catalog refuses it"""

    @field_validator("found", "no_match", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float | None:
        return parse_duration(value)

    @field_validator("by_value", mode="before")
    @classmethod
    def _durations(cls, value: Any) -> dict[str, float]:
        if not isinstance(value, Mapping):
            raise ValueError("by_value maps values to durations, e.g. {'invalid': '7d'}")
        parsed: dict[str, float] = {}
        for key, duration in value.items():
            seconds = parse_duration(duration)
            if seconds is None:
                raise ValueError(f"by_value[{key!r}] needs a duration")
            parsed[str(key)] = seconds
        return parsed

    @classmethod
    def every(cls, duration: DurationLike) -> Freshness:
        """The same duration whatever the value (``fresh_for="30d"``)."""
        seconds = parse_duration(duration)
        return cls(found=seconds, no_match=seconds)

    def outcome(self, value: Any, get: Callable[[Any, str], Any] = dig) -> Outcome:
        return outcome_of(value, self.hit, get)

    def max_age(
        self,
        value: Any,
        *,
        get: Callable[[Any, str], Any] = dig,
        lookup: Callable[[str], Callable[..., Any]] | None = None,
    ) -> float | None:
        """How old ``value`` may be and still be fresh, in seconds (``None``: for ever).

        ``get`` reads ``by``/``hit`` out of a mapping value (a tool passes its getters);
        ``lookup`` finds the ``rule`` function by its registered name.
        """
        outcome = self.outcome(value, get)
        if self.rule is not None:
            if lookup is None:
                from playline.resolvers import lookup as registered

                lookup = registered
            return parse_duration(lookup(self.rule)(value, outcome))
        if self.by_value:
            picked = get(value, self.by) if self.by is not None else value
            if isinstance(picked, str | int | float) and not isinstance(picked, bool):
                seconds = self.by_value.get(str(picked))
                if seconds is not None:
                    return seconds
        return self.found if outcome == "found" else self.no_match


def freshness_of(given: Any) -> Freshness | None:
    """A :class:`Freshness` from what a user wrote: a rule, a duration (the same for
    every outcome), a mapping of the rule's fields, a registered function, or ``None``."""
    if given is None or isinstance(given, Freshness):
        return given
    if isinstance(given, Mapping):
        try:
            return Freshness.model_validate(given)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'rule'}: {e['msg']}" for e in err.errors()
            )
            raise ValueError(problems) from None
    if callable(given):
        from playline.resolvers import registered_name

        return Freshness(rule=registered_name(given))
    return Freshness.every(given)
