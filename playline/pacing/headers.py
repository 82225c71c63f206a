"""What a provider says about its own limits: ``Retry-After`` and rate-limit headers.

Pure parsing, no I/O: :func:`parse_rate_limit` turns a response's headers into a
:class:`RateLimitReport` the governor can pace by (see
:class:`~playline.pacing.budget.HeaderBudget`). Understood, in this order:

* ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (the de-facto form; ``Reset``
  as delta seconds, or as Unix epoch seconds when it is larger than a year);
* the IETF draft fields: ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` with an
  optional ``RateLimit-Policy: 100;w=60`` (drafts 00-06), the dictionary form
  ``RateLimit: limit=100, remaining=50, reset=30`` (draft 07) and the list form
  ``RateLimit: "min";r=50;t=30`` with ``RateLimit-Policy: "min";q=100;w=60``
  (draft 08 and later), which may name several windows at once;
* ``Retry-After`` as delta seconds or as an HTTP date.

Anything malformed is ignored rather than guessed at: a header the governor
cannot read must not make it send faster.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["QuotaReport", "RateLimitReport", "parse_rate_limit", "parse_retry_after"]

#: ``X-RateLimit-Reset`` values above this are Unix epoch seconds, not deltas.
EPOCH_THRESHOLD_S = 365 * 86400.0


@dataclass(frozen=True, slots=True)
class QuotaReport:
    """One window the provider reported: ``remaining`` calls may go in ``reset_s`` seconds.

    Attributes:
        name: the policy name (``""`` when the provider names none).
        limit: calls the window holds when full (``None``: not reported).
        remaining: calls left in the current window.
        reset_s: seconds until the window's quota is restored.
        window_s: the window's length, when the provider says (IETF ``w``).
    """

    name: str
    limit: float | None
    remaining: float
    reset_s: float
    window_s: float | None = None


@dataclass(frozen=True, slots=True)
class RateLimitReport:
    """Everything one response said about the provider's limits."""

    quotas: tuple[QuotaReport, ...] = ()
    retry_after_s: float | None = None

    @property
    def empty(self) -> bool:
        return not self.quotas and self.retry_after_s is None


def parse_retry_after(value: str | None, *, now_wall: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    number = _number(value)
    if number is not None:
        return max(0.0, number)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT
        return None
    return max(0.0, when.timestamp() - now_wall)


def parse_rate_limit(headers: Mapping[str, str], *, now_wall: float) -> RateLimitReport:
    """The limits reported by one response's headers (case-insensitive ``headers``)."""
    lower = {k.lower(): v for k, v in headers.items()}
    quotas = _ietf_list(lower) or _ietf_dictionary(lower)
    if not quotas:
        for prefix in ("x-ratelimit-", "ratelimit-"):
            quota = _triple(lower, prefix, now_wall)
            if quota is not None:
                quotas = [quota]
                break
    return RateLimitReport(
        quotas=tuple(quotas),
        retry_after_s=parse_retry_after(lower.get("retry-after"), now_wall=now_wall),
    )


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _triple(lower: Mapping[str, str], prefix: str, now_wall: float) -> QuotaReport | None:
    """``<prefix>limit`` / ``remaining`` / ``reset`` (the first value of a list)."""
    remaining = _number(_first(lower.get(prefix + "remaining")))
    reset = _number(_first(lower.get(prefix + "reset")))
    if remaining is None or reset is None or remaining < 0 or reset < 0:
        return None
    if reset > EPOCH_THRESHOLD_S:
        reset = max(0.0, reset - now_wall)
    limit = _number(_first(lower.get(prefix + "limit")))
    window = None
    policy = lower.get(prefix + "policy")
    if policy and prefix == "ratelimit-":
        params = _params(_first(policy) or "")
        window = _number(params.get("w"))
    return QuotaReport("", limit, remaining, reset, window)


def _first(value: str | None) -> str | None:
    return None if value is None else value.split(",")[0]


def _params(item: str) -> dict[str, str]:
    """``a;b=1;c="x"`` -> ``{"b": "1", "c": "x"}`` (bare first member dropped)."""
    out: dict[str, str] = {}
    for part in item.split(";")[1:]:
        name, sep, value = part.partition("=")
        if sep:
            out[name.strip().lower()] = value.strip().strip('"')
    return out


_NAME = re.compile(r'^\s*("([^"]*)"|[A-Za-z*][A-Za-z0-9_.*:/%-]*)\s*$')


def _items(value: str) -> dict[str, dict[str, str]]:
    """A structured-field list of named items: ``"n";k=v, m;k=v`` -> ``{n: {k: v}}``."""
    out: dict[str, dict[str, str]] = {}
    for item in value.split(","):
        head = item.split(";")[0]
        match = _NAME.match(head)
        if match is None:
            continue
        name = match.group(2) if match.group(2) is not None else match.group(1).strip()
        out[name] = _params(item)
    return out


def _ietf_list(lower: Mapping[str, str]) -> list[QuotaReport]:
    """Draft 08+: ``RateLimit: "n";r=..;t=..`` joined with ``RateLimit-Policy: "n";q=..;w=..``."""
    value = lower.get("ratelimit")
    if not value or "=" not in value or "limit=" in value.replace(" ", ""):
        return []
    policies = _items(lower.get("ratelimit-policy", ""))
    quotas = []
    for name, params in _items(value).items():
        remaining, reset = _number(params.get("r")), _number(params.get("t"))
        if remaining is None or remaining < 0:
            continue
        policy = policies.get(name, {})
        window = _number(policy.get("w"))
        if reset is None:
            reset = window
        if reset is None or reset < 0:
            continue
        quotas.append(QuotaReport(name, _number(policy.get("q")), remaining, reset, window))
    return quotas


def _ietf_dictionary(lower: Mapping[str, str]) -> list[QuotaReport]:
    """Draft 07: ``RateLimit: limit=100, remaining=50, reset=30``."""
    value = lower.get("ratelimit")
    if not value:
        return []
    fields: dict[str, str] = {}
    for part in value.split(","):
        name, sep, number = part.partition("=")
        if sep:
            fields[name.strip().lower()] = number.strip()
    remaining, reset = _number(fields.get("remaining")), _number(fields.get("reset"))
    if remaining is None or reset is None or remaining < 0 or reset < 0:
        return []
    return [QuotaReport("", _number(fields.get("limit")), remaining, reset)]
