"""Behaviour knobs of the local provider server.

One pydantic model, ``ServerConfig``, describes everything that makes the fake
provider behave like a real paid API: latency, per-provider rate limits and
concurrency caps, injected faults, API keys, and whether ``Idempotency-Key`` is
honoured at all. It is passed to the subprocess as JSON and can be changed while
the server runs (``POST /_admin/config`` merges a partial update), so a test or
benchmark can turn a knob without restarting.

Faults come in two families, and the difference is the whole point of them:

* **uncharged, definitive**: ``"429"``, ``"5xx"`` (a ``503``: "not processed, retry
  later") and ``"timeout"`` (a slow ``504`` after ``timeout_sleep_s``) happen before the
  charge; re-sending costs nothing.
* **charged, ambiguous** ("charged then dropped"): ``"malformed"`` (a ``200`` with a broken body),
  ``"500_after_charge"`` (a ``500``), ``"drop_after_charge"`` (the connection dies
  mid-body: a transport error on the client) and ``"timeout_after_charge"`` (the answer
  is held ``timeout_sleep_s``, then a ``504``) all charge first. A client cannot tell
  them from an uncharged failure, which is why playline never re-sends such a call to a
  tool whose provider does not de-duplicate (``idempotency="ignore"`` models one).

Whether a lookup *finds* something is decided per input by a digest (see
:mod:`~playline.provider_server.fake_data`) against ``hit_rates[provider]``: 0.0
finds nothing, 1.0 everything, and the same input always gets the same answer.
Providers that bill by outcome (per hit, refund on a miss) bill from that answer.
``answer_epoch`` and ``changed_fraction`` make a share of the answers change between
runs, deterministically (:mod:`~playline.provider_server.epochs`).

The asynchronous job providers (``fullenrich``, ``dropcontact``; see
:mod:`~playline.provider_server.jobs`) have their own knobs, each a mapping by
provider: how long a contact takes (``job_latency_s``), how many unfinished jobs an
account may have (``job_queue``), jobs that never finish (``job_stuck``, or
``job_stuck_last_names`` for single contacts), and how the finished job's webhook is
delivered (``webhook_secret``, ``webhook_retry_s``, ``webhook_drop``,
``webhook_duplicates``). Their status polls are rate-limited under the key
``"<provider>:poll"`` in ``rate_limit_rps`` / ``limiters`` / ``max_concurrency``, their
submits under the provider's own name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

FaultKind = Literal[
    "429",
    "5xx",
    "timeout",
    "malformed",
    "500_after_charge",
    "drop_after_charge",
    "timeout_after_charge",
]

#: The kinds ``fail_next`` understands, checked in this order (``FaultKind``'s).
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)

#: The faults that charge the call and then fail to deliver its answer.
CHARGED_FAULTS: frozenset[str] = frozenset(
    ("malformed", "500_after_charge", "drop_after_charge", "timeout_after_charge")
)

#: ``"key"``: replay a charged call's response for a repeated ``Idempotency-Key``
#: (409 while it is in flight, 422 for reuse with another body), as Stripe-style APIs
#: do. ``"ignore"``: the header means nothing; every request that reaches the charge is
#: charged, as most enrichment APIs behave.
IdempotencyMode = Literal["key", "ignore"]

LatencyRange = tuple[float, float]

#: The share of inputs each outcome-billed provider finds, unless ``hit_rates`` says
#: otherwise. ``acme``, ``firmo`` and ``verifly`` always answer (no entry: 1.0).
DEFAULT_HIT_RATES: dict[str, float] = {
    "mailfox": 0.55,
    "prospectr": 0.8,
    "hunter": 0.6,
    "findymail": 0.5,
    "prospeo": 0.7,
    "apollo": 0.65,
    "fullenrich": 0.7,
    "dropcontact": 0.6,
}

#: The credits each provider's account starts with, unless ``starting_balance`` says
#: otherwise: its balance endpoint reports this less what the ledger billed.
DEFAULT_BALANCE = 10_000.0

#: How long one contact of an asynchronous job takes (seconds), unless
#: ``job_latency_s`` says otherwise for its provider.
DEFAULT_JOB_LATENCY_S: tuple[float, float] = (2.0, 6.0)
#: How many unfinished jobs one account may have per provider (``job_queue``).
DEFAULT_JOB_QUEUE = 100
#: The pause between two attempts of a failed webhook delivery (``webhook_retry_s``).
DEFAULT_WEBHOOK_RETRY_S = 60.0

LimiterKind = Literal["token_bucket", "gcra", "fixed_window", "sliding_log", "concurrency", "quota"]
#: ``Retry-After`` on a 429: exact delta seconds, delta rounded up to whole
#: seconds (at least 1), an HTTP date, or no header at all.
RetryAfterMode = Literal["exact", "ceil", "date", "none"]
#: Rate-limit headers on every response: none, ``X-RateLimit-*``, or the IETF
#: ``RateLimit`` / ``RateLimit-Policy`` fields (one item per limiter).
HeaderMode = Literal["none", "x-ratelimit", "ietf"]


class LimiterSpec(BaseModel):
    """One limit of one provider (see :mod:`playline.provider_server.limiters`).

    ``rate`` and ``burst`` describe ``token_bucket`` and ``gcra``; ``limit`` and
    ``window_s`` the windows (``fixed_window``, ``sliding_log``, ``quota``);
    ``limit`` alone the ``concurrency`` cap. ``per_key`` counts each API key
    separately instead of the provider as a whole.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: LimiterKind
    rate: float | None = Field(default=None, gt=0)
    burst: int = Field(default=1, ge=1)
    limit: int | None = Field(default=None, ge=1)
    window_s: float = Field(default=60.0, gt=0)
    per_key: bool = False
    name: str = Field(default="default", pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")

    @model_validator(mode="after")
    def _check_shape(self) -> LimiterSpec:
        if self.kind in ("token_bucket", "gcra") and self.rate is None:
            raise ValueError(f"a {self.kind} limiter needs rate")
        if self.kind not in ("token_bucket", "gcra") and self.limit is None:
            raise ValueError(f"a {self.kind} limiter needs limit")
        return self


def _check_range(name: str, value: LatencyRange) -> None:
    low, high = value
    if low < 0 or high < low:
        raise ValueError(f"{name} must be (low, high) with 0 <= low <= high, got {value!r}")


class ServerConfig(BaseModel):
    """How the fake provider behaves. Every field has a harmless default.

    ``fail_next`` maps a fault kind (any of ``FAULT_KINDS``) to how many of the
    next valid requests get that fault; the counts are decremented as they are
    used, so ``GET /_admin/config`` shows what is left. The ``fault_rate_*``
    fields draw the same faults at random (one roll per request, see
    ``fault_rates``). A charged fault drawn for a request that replays a stored
    response (``idempotency="key"``) is used up without effect: nothing is charged.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    latency_ms: LatencyRange = (5.0, 15.0)
    provider_latency_ms: dict[str, LatencyRange] = Field(default_factory=dict)
    rate_limit_rps: dict[str, float] = Field(default_factory=dict)
    rate_limit_burst: dict[str, int] = Field(default_factory=dict)
    retry_after_header: bool = True
    #: how ``Retry-After`` is written (``retry_after_header=False`` omits it regardless)
    retry_after: RetryAfterMode = "ceil"
    rate_limit_headers: HeaderMode = "none"
    #: per provider, the limits every request must pass (all of them), on top of
    #: ``rate_limit_rps`` (a token bucket) and ``max_concurrency``
    limiters: dict[str, list[LimiterSpec]] = Field(default_factory=dict)
    #: a 401 body quotes the key it received (a badly behaved provider)
    echo_key_in_errors: bool = False
    max_concurrency: dict[str, int] = Field(default_factory=dict)
    fault_rate_5xx: float = Field(default=0.0, ge=0.0, le=1.0)
    fault_rate_timeout: float = Field(default=0.0, ge=0.0, le=1.0)
    fault_rate_malformed: float = Field(default=0.0, ge=0.0, le=1.0)
    fault_rate_500_after_charge: float = Field(default=0.0, ge=0.0, le=1.0)
    fault_rate_drop_after_charge: float = Field(default=0.0, ge=0.0, le=1.0)
    fault_rate_timeout_after_charge: float = Field(default=0.0, ge=0.0, le=1.0)
    #: how long the ``timeout`` and ``timeout_after_charge`` faults hold the answer
    timeout_sleep_s: float = Field(default=30.0, ge=0.0)
    fail_next: dict[FaultKind, int] = Field(default_factory=dict)
    seed: int = 0
    idempotency: IdempotencyMode = "key"
    #: per provider, the key(s) accepted (none configured: any non-empty key)
    api_keys: dict[str, str | list[str]] = Field(default_factory=dict, repr=False)
    bulk_max_items: int = Field(default=100, ge=1)
    #: per provider, the share of inputs found (0.0 .. 1.0); a provider left out gets
    #: its ``DEFAULT_HIT_RATES`` entry. ``reset()`` restores the defaults.
    hit_rates: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_HIT_RATES))
    max_call_records: int = Field(default=100_000, ge=0)
    #: answers drift between runs (see :mod:`~playline.provider_server.epochs`): at an
    #: epoch above 0, the inputs whose digest (with the epoch) falls under
    #: ``changed_fraction`` get another answer than at epoch 0, the same one every time
    answer_epoch: int = Field(default=0, ge=0)
    changed_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    # -- asynchronous jobs (``jobs``), each per provider -----------------------------
    #: the range (seconds) one contact of a job takes, drawn per contact from a digest
    #: of its input (``DEFAULT_JOB_LATENCY_S``); a job finishes with its last contact
    job_latency_s: dict[str, LatencyRange] = Field(default_factory=dict)
    #: how many unfinished jobs an account may have; one more submit is a 429
    #: (``DEFAULT_JOB_QUEUE``)
    job_queue: dict[str, int] = Field(default_factory=dict)
    #: True: no contact of that provider's jobs finishes while it is set (the jobs stay
    #: in progress; they go on once it is cleared)
    job_stuck: dict[str, bool] = Field(default_factory=dict)
    #: a contact with one of these last names never finishes while it is listed (so
    #: neither does its job), whatever the provider
    job_stuck_last_names: list[str] = Field(default_factory=list)
    #: the HMAC-SHA1 key of signed webhooks (FullEnrich); none: the API key the job was
    #: submitted with, as FullEnrich documents
    webhook_secret: dict[str, str] = Field(default_factory=dict, repr=False)
    #: seconds between two attempts of a failed delivery (``DEFAULT_WEBHOOK_RETRY_S``)
    webhook_retry_s: dict[str, float] = Field(default_factory=dict)
    #: how many of the next deliveries are dropped: counted as sent, never sent (the
    #: count goes down as they are used, like ``fail_next``)
    webhook_drop: dict[str, int] = Field(default_factory=dict)
    #: how many times each delivery is sent (default 1)
    webhook_duplicates: dict[str, int] = Field(default_factory=dict)

    #: per provider, the credits its account starts with (``DEFAULT_BALANCE``); its
    #: balance endpoint reports this less what the ledger billed since the last reset
    starting_balance: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_values(self) -> ServerConfig:
        _check_range("latency_ms", self.latency_ms)
        for provider, value in self.provider_latency_ms.items():
            _check_range(f"provider_latency_ms[{provider!r}]", value)
        for provider, rps in self.rate_limit_rps.items():
            if rps <= 0:
                raise ValueError(f"rate_limit_rps[{provider!r}] must be > 0, got {rps}")
        for name, mapping in (
            ("rate_limit_burst", self.rate_limit_burst),
            ("max_concurrency", self.max_concurrency),
        ):
            for provider, count in mapping.items():
                if count < 1:
                    raise ValueError(f"{name}[{provider!r}] must be >= 1, got {count}")
        for provider, rate in self.hit_rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"hit_rates[{provider!r}] must be within [0, 1], got {rate}")
        for kind, count in self.fail_next.items():
            if count < 0:
                raise ValueError(f"fail_next[{kind!r}] must be >= 0, got {count}")
        self._check_job_values()
        return self

    def _check_job_values(self) -> None:
        for provider, value in self.job_latency_s.items():
            _check_range(f"job_latency_s[{provider!r}]", value)
        for name, mapping, least in (
            ("job_queue", self.job_queue, 1),
            ("webhook_duplicates", self.webhook_duplicates, 1),
            ("webhook_drop", self.webhook_drop, 0),
        ):
            for provider, count in mapping.items():
                if count < least:
                    raise ValueError(f"{name}[{provider!r}] must be >= {least}, got {count}")
        for provider, pause in self.webhook_retry_s.items():
            if pause < 0:
                raise ValueError(f"webhook_retry_s[{provider!r}] must be >= 0, got {pause}")

    def latency_for(self, provider: str) -> LatencyRange:
        """The latency range (milliseconds) that applies to ``provider``."""
        return self.provider_latency_ms.get(provider, self.latency_ms)

    def hit_rate_for(self, provider: str) -> float:
        """The share of inputs ``provider`` finds: ``hit_rates``, else its default, else 1.0."""
        return self.hit_rates.get(provider, DEFAULT_HIT_RATES.get(provider, 1.0))

    def fault_rates(self) -> tuple[tuple[FaultKind, float], ...]:
        """The random fault rates, in the order the roll visits them.

        The older kinds keep their places and the charged-then-failed ones come
        last, so a seed draws the same faults as before those existed.
        """
        return (
            ("5xx", self.fault_rate_5xx),
            ("timeout", self.fault_rate_timeout),
            ("malformed", self.fault_rate_malformed),
            ("500_after_charge", self.fault_rate_500_after_charge),
            ("drop_after_charge", self.fault_rate_drop_after_charge),
            ("timeout_after_charge", self.fault_rate_timeout_after_charge),
        )

    def balance_for(self, provider: str) -> float:
        """The credits ``provider``'s account started with (since the last reset)."""
        return self.starting_balance.get(provider, DEFAULT_BALANCE)

    def job_latency_for(self, provider: str) -> LatencyRange:
        """The range (seconds) one contact of ``provider``'s jobs takes."""
        return self.job_latency_s.get(provider, DEFAULT_JOB_LATENCY_S)

    def job_queue_for(self, provider: str) -> int:
        """How many unfinished jobs an account may have at ``provider``."""
        return self.job_queue.get(provider, DEFAULT_JOB_QUEUE)

    def webhook_retry_for(self, provider: str) -> float:
        """Seconds between two attempts of one of ``provider``'s webhook deliveries."""
        return self.webhook_retry_s.get(provider, DEFAULT_WEBHOOK_RETRY_S)

    def burst_for(self, provider: str) -> int:
        """The token-bucket capacity of ``provider`` (default 1: no bursting)."""
        return self.rate_limit_burst.get(provider, 1)

    def merged(self, changes: Mapping[str, Any]) -> ServerConfig:
        """A new, validated config with the top-level fields in ``changes`` replaced.

        The merge is shallow: ``{"rate_limit_rps": {"acme": 5}}`` replaces the
        whole ``rate_limit_rps`` mapping, so a limit can be removed by omission.
        """
        unknown = set(changes) - set(type(self).model_fields)
        if unknown:
            raise ValueError(
                f"unknown config field(s) {sorted(unknown)}; "
                f"known: {sorted(type(self).model_fields)}"
            )
        return type(self).model_validate({**self.model_dump(), **dict(changes)})

    def public_dump(self) -> dict[str, Any]:
        """The config as JSON-ready data with API keys replaced by short digests."""
        data = self.model_dump(mode="json")
        data["api_keys"] = {
            name: key_digest(keys) if isinstance(keys, str) else [key_digest(k) for k in keys]
            for name, keys in self.api_keys.items()
        }
        data["webhook_secret"] = {
            name: key_digest(secret) for name, secret in self.webhook_secret.items()
        }
        return data

    def keys_for(self, provider: str) -> list[str] | None:
        """The keys ``provider`` accepts, or ``None`` when any key is accepted."""
        keys = self.api_keys.get(provider)
        if keys is None:
            return None
        return [keys] if isinstance(keys, str) else list(keys)


def key_digest(key: str) -> str:
    """A short, non-reversible fingerprint of an API key, safe to log and store."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:12]
