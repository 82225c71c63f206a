"""The provider catalog: which tools exist, where they live, what they cost, how fast they may go.

A catalog is declarative (a TOML file) so that pointing playline at real providers
is an edit, not a code change. It is validated as a whole when it is loaded; a bad
catalog is rejected before any play starts.

```toml
[providers.acme]
base_url = "http://127.0.0.1:8787"
base_url_env = "ACME_URL"                 # optional override from the environment
auth = { env = "ACME_API_KEY", header = "X-Api-Key", account = "acme-prod" }  # or env = [...]
idempotency = "none"                      # "key" | "natural" | "none" (default), see below
pacing = { rps = 50, burst = 5, per_minute = 2000, per_day = 50000, max_concurrency = 16 }
key_pacing = { rps = 20, per_day = 10000 }              # each key's own budget (optional)
timeout_s = 15                                          # default HTTP timeout of its tools

[tools.email_finder]
provider = "acme"
method = "POST"
path = "/v1/email/find"
input = { first_name = "str", last_name = "str", domain = "str" }
getters = { email = "email", confidence = "confidence" }
credits = 1.0                                           # per request, unless billing says more
billing = { rule = "per_hit", hit = "email" }           # optional, see playline.calls.billing
fresh_for = { found = "90d", no_match = "14d" }         # optional, see playline.freshness
version = "1"
batch = { path = "/v1/email/find/bulk", max_items = 25 }   # optional bulk endpoint
timeout_s = 3.0                                         # optional, overrides the provider's
source = "https://docs.acme.example/email-finder"       # optional: the doc it was written from

[waterfalls.work_email]                                 # see playline.calls.waterfall_spec
steps = ["email_finder", "other_finder"]
value = "email"
```

``include = ["hunter", "prospeo"]`` at the top pulls in the presets shipped in
:mod:`playline.presets` (real providers, each entry citing its doc), and the presets an
included preset includes itself (one level: ``include = ["waterfalls"]`` brings the
finders its waterfalls chain); the file's own
tools and waterfalls win over a preset's of the same name, and its own
``[providers.X]`` table is merged key by key over the preset's (its keys win), so

```toml
include = ["apollo"]
[providers.apollo]
plan = "basic"          # the plan you pay for: its limits and price, not the free plan's
```

is a whole catalog. A provider's ``plans`` (presets list the documented ones) each
carry limits and a price; ``plan`` picks the one in force, and a key the provider
table sets itself (``pacing``, ``credit_price``, ...) wins over the plan's.

A provider with several API keys (several accounts) lists their variables in
``auth.env``; each key is its own pacing key (``acme:key=ACME_KEY_A``) with the
``key_pacing`` budget, on top of the provider-wide ``pacing``, and the governor
spreads calls across the keys.

**Idempotency** is a contract each tool states (or inherits from its provider):

* ``"key"``: the provider de-duplicates ``Idempotency-Key`` (a repeat is answered
  from its store, not charged again);
* ``"natural"``: the provider does not charge twice for the same input ("not
  charged twice for the same contact");
* ``"none"`` (the default): every request that reaches the provider may be charged.

For ``key`` and ``natural`` tools an ambiguous outcome (sent, no definitive answer)
is re-sent like any transient failure; for ``none`` tools it never is: the receipt
becomes ``ambiguous`` and only an explicit ``retry_ambiguous`` run re-sends it.

``auth.account`` names the account the keys belong to: receipts are scoped by it
instead of by the key values, so rotating a key (or adding one) keeps them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from playline.calls.answer_errors import ErrorFieldSpec
from playline.calls.balance_spec import BalanceSpec
from playline.calls.billing import BillingSpec, Charge, bulk_charges, single_charge
from playline.calls.waterfall_spec import WaterfallSpec
from playline.errors import (
    BlankInput,
    CatalogError,
    InvalidToolInput,
    UnknownTool,
    format_validation_errors,
)
from playline.freshness import Freshness, dig, freshness_of
from playline.pacing.policy import PacingPolicy
from playline.sinks.spec import SinkSpec
from playline.spec_model import SpecModel

_FIELD_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}

#: How a tool's provider treats a repeated request; see the module docstring.
Idempotency = Literal["key", "natural", "none"]
#: Tools that may be re-sent after an ambiguous outcome without paying twice.
RESEND_SAFE: frozenset[str] = frozenset({"key", "natural"})
#: 4xx statuses about timing or limits, never "no match" (see ``ToolSpec.no_match_status``).
NOT_A_MISS_STATUSES = frozenset({408, 409, 425, 429})
#: An ISO 4217 currency code ("USD", "EUR"): what a provider's credit price is in.
CurrencyCode = Annotated[str, Field(pattern=r"^[A-Z]{3}$")]
#: The largest provider response body a call reads by default (a bulk answer included).
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class AuthSpec(SpecModel):
    """Where a provider's API key(s) come from and where a request carries them.

    ``env`` names one environment variable, or several for a provider used
    with several keys (accounts). The key goes in a header (``header``, by default
    ``Authorization``) or, for a provider that documents no header, in a query
    parameter (``query``): exactly one of the two. A key in the query string is part
    of the request's URL, so every URL playline logs or quotes is scrubbed of it
    (see :mod:`playline.calls.http`).
    """

    env: str | tuple[str, ...]
    """the environment variable holding the API key, or a list of variables for a provider used with
    several keys (accounts): calls are spread across them and each key is paced on its own
    (`<provider>:key=<VARIABLE>`); the key itself is never logged or stored"""
    header: str | None = None
    """the request header carrying the key (unset, and no `query`: `Authorization`)"""
    query: Annotated[str | None, Field(min_length=1)] = None
    """the query parameter carrying the key instead of a header, for a provider that documents no
    header (ZeroBounce's `api_key`); never with `header` or `scheme`; the key is scrubbed from every
    URL playline logs"""
    scheme: str | None = None
    """a word sent before the key in the header (e.g. "Bearer"); unset sends the bare key"""
    account: Annotated[str | None, Field(min_length=1)] = None
    """the account the key(s) belong to: receipts are scoped by it instead of by the key values, so
    a rotated or added key keeps them (unset: scoped by the keys)"""

    @model_validator(mode="before")
    @classmethod
    def _one_place(cls, data: Any) -> Any:
        """The key goes in a header or in the query, never both; the header by default."""
        if not isinstance(data, Mapping):
            return data
        if data.get("query") is not None:
            if data.get("header") is not None or data.get("scheme") is not None:
                raise ValueError(
                    "auth names a query parameter and a header (or scheme); the key goes in "
                    "exactly one of them"
                )
            return data
        return data if data.get("header") is not None else {**data, "header": "Authorization"}

    @model_validator(mode="after")
    def _check_env(self) -> AuthSpec:
        envs = self.envs
        if not envs or any(not name for name in envs) or len(set(envs)) != len(envs):
            raise ValueError("auth.env must name one variable or a list of distinct ones")
        return self

    @property
    def envs(self) -> tuple[str, ...]:
        """The variables holding the keys, in catalog order."""
        return (self.env,) if isinstance(self.env, str) else tuple(self.env)


#: The provider keys a plan may set; a key the provider table sets itself wins.
PLAN_KEYS = ("pacing", "key_pacing", "credit_price", "currency")


class PlanSpec(SpecModel):
    """One of a provider's plans: the limits and price that plan comes with.

    A preset lists the plans the provider documents (``[providers.X.plans.NAME]``) and
    names the one in force (``plan``); a user's catalog picks another with
    ``[providers.X]`` ``plan = "NAME"``. The plan's keys fill the provider's where the
    provider table does not set them, so a user's own ``pacing`` (or ``credit_price``)
    wins over the plan's.
    """

    source: str | None = None
    """the page the plan's figures were read from"""
    description: str | None = None
    """what the plan is, in a few words (its price, its credits a month, ...)"""
    pacing: PacingPolicy | None = None
    """the plan's limits, as the provider's `pacing` (unset: the provider's `pacing`, or playline's
    defaults)"""
    key_pacing: PacingPolicy | None = None
    """the plan's limits of each API key, as the provider's `key_pacing`"""
    credit_price: Annotated[float | None, Field(ge=0)] = None
    """what one credit costs on this plan, as the provider's `credit_price`"""
    currency: CurrencyCode | None = None
    """the ISO 4217 code the plan's `credit_price` is in (unset: the provider's)"""


class ProviderSpec(SpecModel):
    """One provider: its base URL, its auth and its pacing (or its plans').

    With ``plans``, ``plan`` names the one in force and its keys (``PLAN_KEYS``) fill
    those the provider table leaves unset: a plan is a default, never an override.
    """

    base_url: str
    """the provider's base URL; each tool's `path` is appended"""
    base_url_env: str | None = None
    """an environment variable that, when set and not empty, replaces `base_url`"""
    auth: AuthSpec | None = None
    """where the API key(s) come from; unset: no key is sent"""
    pacing: PacingPolicy = PacingPolicy()
    """how fast the provider may be called, all its keys and tools together"""
    key_pacing: PacingPolicy | None = None
    """the limits of each API key, when `auth.env` lists several (or one); with several keys and no
    `key_pacing`, each key gets `pacing`"""
    timeout_s: Annotated[float, Field(gt=0)] = 15.0
    """the HTTP timeout of its tools' calls, in seconds"""
    idempotency: Idempotency = "none"
    """the idempotency contract of its tools, unless a tool states its own: "key" (the provider
    de-duplicates `Idempotency-Key`), "natural" (it never charges twice for the same input) or
    "none" (every request may be charged, so a call sent without a definitive answer is never
    re-sent automatically)"""
    max_response_bytes: Annotated[int, Field(ge=1)] = DEFAULT_MAX_RESPONSE_BYTES
    """the most bytes one response (a bulk answer included) may hold; a larger one is a provider
    error"""
    source: str | None = None
    """the documentation the entry was written from (presets cite theirs)"""
    credit_price: Annotated[float | None, Field(ge=0)] = None
    """what one of its credits costs, in `currency` (your plan's price: a credit pack's price over
    its credits); set, estimates, summaries and `runs get` show money next to credits"""
    currency: CurrencyCode = "USD"
    """the ISO 4217 code `credit_price` is in"""
    balance: BalanceSpec | None = None
    """where the provider reports the account's credits left or used (see `playline runs
    reconcile`): read before and after each run and compared with what playline says the run cost;
    unset: no balance is read"""
    plan: str | None = None
    """the plan in force, one of `plans`: its pacing and price apply where this table sets none
    (presets name the provider's entry plan; set yours to change it)"""
    plans: dict[str, PlanSpec] = {}
    """the provider's plans, by name, each with its limits and price as documented (presets list
    them); `plan` picks one"""

    @model_validator(mode="before")
    @classmethod
    def _apply_plan(cls, data: Any) -> Any:
        """Fill the keys the table leaves unset from the plan in force."""
        if not isinstance(data, Mapping):
            return data
        plans, plan = data.get("plans") or {}, data.get("plan")
        if not isinstance(plans, Mapping):
            return data
        if plan is None:
            if plans:
                raise ValueError(
                    f"plans {', '.join(sorted(plans))} are listed but no plan is chosen; "
                    f"set plan = one of them"
                )
            return data
        if plan not in plans:
            listed = ", ".join(sorted(plans)) or "none"
            raise ValueError(f"unknown plan {plan!r}; the provider's plans: {listed}")
        chosen = plans[plan]
        chosen = chosen.model_dump(exclude_none=True) if isinstance(chosen, PlanSpec) else chosen
        if not isinstance(chosen, Mapping):
            return data
        filled = {k: chosen[k] for k in PLAN_KEYS if k in chosen and k not in data}
        return {**data, **filled} if filled else data

    @property
    def plan_in_force(self) -> PlanSpec | None:
        """The plan ``plan`` names (``None``: no plans)."""
        return self.plans.get(self.plan) if self.plan is not None else None

    def key_envs(self) -> tuple[str, ...]:
        """The variables of the keys calls are spread across (none without auth)."""
        return self.auth.envs if self.auth is not None else ()

    def resolved_base_url(self, environ: Mapping[str, str]) -> str:
        """The base URL, overridden by ``environ[base_url_env]`` when that is set."""
        if self.base_url_env and environ.get(self.base_url_env):
            return environ[self.base_url_env].rstrip("/")
        return self.base_url.rstrip("/")


class BatchSpec(SpecModel):
    """A bulk endpoint: member inputs go in ``items_field``, results come back in order.

    Claimed calls wait up to ``linger_ms`` for company, then go out in requests of
    at most ``max_items`` (see :mod:`playline.calls.bulk`).
    """

    path: str
    """the bulk endpoint's path on the provider's base URL (sent with the tool's `method`)"""
    max_items: Annotated[int, Field(ge=1, le=1000)] = 25
    """the most member calls in one bulk request"""
    linger_ms: Annotated[float, Field(ge=0, le=5000)] = 20.0
    """how long a claimed call waits for company before a request that is not full goes out, in
    milliseconds"""
    items_field: str = "items"
    """the request body's field holding the members' inputs"""
    results_field: str = "results"
    """the response's field holding the members' results"""
    id_field: str | None = None
    """a field playline sets on each item to its position (a string) and matches the results by, for
    providers that answer matches only or out of order; unset: one result per item, in request
    order"""


class WebhookSpec(SpecModel):
    """How an asynchronous provider announces a finished job by calling playline back.

    The submit carries a callback URL (``url_field`` in the body) of the worker's
    ``PLAYLINE_WEBHOOK_URL`` with a per-job secret in its path
    (``<base>/hooks/<provider>/<token>``); ``signature`` adds a check of the
    provider's signature of the body: ``hmac-sha1`` / ``hmac-sha256`` of the raw body
    with the secret in ``secret_env``, hex, in header ``signature_header``. Polling
    stays the fallback: a lost delivery costs time, not rows.
    """

    url_field: str
    """where the callback URL goes in the submit body (a dotted path)"""
    signature: Literal["none", "hmac-sha1", "hmac-sha256"] = "none"
    """how the provider signs a callback: not at all, or an HMAC of the raw body (hex) with the
    secret in `secret_env`"""
    signature_header: str | None = None
    """the header holding the signature (needed when `signature` is not none)"""
    secret_env: str | None = None
    """the environment variable holding the signing secret, read by the webhook receiver (needed
    when `signature` is not none)"""

    @model_validator(mode="after")
    def _check_signature(self) -> WebhookSpec:
        if self.signature != "none" and (not self.signature_header or not self.secret_env):
            raise ValueError(
                f"webhook signature {self.signature!r} needs signature_header and secret_env"
            )
        return self


class JobSpec(SpecModel):
    """An asynchronous tool: the call is a job submitted, then polled (or called back).

    The tool's ``method``/``path`` is the submit. Members go in ``items_field`` (up to
    ``max_items`` per submit, ``linger_ms`` to fill one), each with its position at
    ``id_field`` when results are matched by it (else: in submit order); without
    ``items_field`` one call is one job and its input is the body. ``job_id`` is where
    the submit's answer holds the job's id; ``status_path`` (``{job_id}`` in it) is
    polled every ``poll_interval_s``. The status answer's ``state_field`` says
    ``done`` / ``running`` (any other value, or one in ``failed``, fails the job's
    calls with ``reason_field`` as the reason); a provider answering "not ready" with
    a 200 is ``running`` by the same rule. The members' results are at
    ``results_field``; with ``partial`` (and ``id_field``) members listed while the job
    runs land at once. A job running longer than ``max_wait_s`` fails its calls.
    ``max_jobs_in_flight`` is the provider's queue. Polls are requests to the same
    account: they are paced with the submits, on the provider's key, so the two
    together stay within its limit; only a provider that documents a separate limit
    for status requests sets ``poll_pacing``, which paces polls on their own key
    (``<provider>:poll``, see :func:`poll_pacing_key`).
    """

    items_field: str | None = None
    """the submit body's field holding the member items; unset: one call is one job and its input is
    the body"""
    max_items: Annotated[int, Field(ge=1, le=10000)] = 1
    """the most member calls in one submit (more than 1 needs `items_field`)"""
    linger_ms: Annotated[float, Field(ge=0, le=60000)] = 500.0
    """how long a claimed call waits for company to fill a submit, in milliseconds"""
    id_field: str | None = None
    """a field set on each item to its position (a string) that results are matched by; unset:
    results come back in submit order"""
    body: dict[str, Any] = {}
    """fixed fields of every submit body (e.g. a job name, options)"""
    item: dict[str, Any] = {}
    """fixed fields of every member item (e.g. which fields to enrich)"""
    job_id: str
    """where the submit's answer holds the job's id (a dotted path)"""
    status_job_id: str | None = None
    """where a status answer (a poll's, a webhook's) names the job's id, when not at `job_id`
    (FullEnrich: `id`); set, a webhook body must name its job there"""
    status_method: Literal["GET", "POST"] = "GET"
    """the HTTP method of a status poll"""
    status_path: str
    """the path polled for the job's status; contains `{job_id}` unless `status_body` carries the
    id"""
    status_body: dict[str, Any] | None = None
    """the JSON body of a POST status poll, `"{job_id}"` in a string value standing for the job's id
    (Icypeas: `{ id = "{job_id}" }`); unset: no body"""
    poll_pending_status: tuple[int, ...] = ()
    """HTTP statuses (4xx) by which a poll answers "not ready yet" (Apollo's 404 `result_pending`):
    the job still runs (until `max_wait_s`), instead of a 404 meaning the provider does not know
    it"""
    poll_failed_status: tuple[int, ...] = ()
    """HTTP statuses (4xx) by which a poll says the job failed (FullEnrich's 402 when the credits
    ran out): its calls fail at once with the answer as the reason (another rejected poll is polled
    again, and past `max_wait_s` given up ambiguous)"""
    state_field: str
    """where a status answer holds the job's state (a dotted path)"""
    done: tuple[Any, ...]
    """the states that mean the job is done"""
    running: tuple[Any, ...]
    """the states that mean the job still runs (a provider answering "not ready" with a 200 is
    running by the same rule)"""
    failed: tuple[Any, ...] = ()
    """states that fail the job's calls; a state in none of `done`, `running` and `failed` fails
    them too"""
    error_field: str | None = None
    """a value that, when truthy in a status answer, fails the job whatever its state says
    (Dropcontact's `error`: its failures also answer `success: false`)"""
    reason_field: str | None = None
    """where a failed job's status answer gives the reason its calls fail with"""
    results_field: str
    """where a status answer holds the members' results (a dotted path)"""
    partial: bool = False
    """members listed while the job still runs land at once (needs `id_field`)"""
    poll_interval_s: Annotated[float, Field(gt=0)] = 30.0
    """seconds between two status polls of a job"""
    first_poll_s: Annotated[float | None, Field(ge=0)] = None
    """the first poll comes this long after the submit, in seconds (unset: `poll_interval_s`)"""
    max_wait_s: Annotated[float, Field(gt=0)] = 3600.0
    """a job running longer than this, in seconds, fails its calls"""
    max_jobs_in_flight: Annotated[int | None, Field(ge=1)] = None
    """the provider's queue: the most jobs of the tool running at once (unset: no cap)"""
    poll_pacing: PacingPolicy | None = None
    """a separate limit for status polls, paced on the key `<provider>:poll` (unset: polls share the
    provider's limit with the submits)"""
    webhook: WebhookSpec | None = None
    """how the provider calls back when a job ends (unset: polling only)"""

    @model_validator(mode="after")
    def _check_shape(self) -> JobSpec:
        if self.status_body is not None and self.status_method != "POST":
            raise ValueError("job.status_body needs status_method = POST")
        if "{job_id}" not in self.status_path and "{job_id}" not in _strings_of(self.status_body):
            raise ValueError("job.status_path (or job.status_body) must contain {job_id}")
        for name in ("poll_pending_status", "poll_failed_status"):
            for status in getattr(self, name):
                if not 400 <= status < 500 or status in NOT_A_MISS_STATUSES:
                    raise ValueError(
                        f"job.{name} {status}: name 4xx statuses other than 408, 409, 425 "
                        "and 429 (about timing or limits)"
                    )
        if set(self.poll_pending_status) & set(self.poll_failed_status):
            raise ValueError("job.poll_pending_status and job.poll_failed_status overlap")
        if self.max_items > 1 and self.items_field is None:
            raise ValueError("job.max_items > 1 needs job.items_field (where members go)")
        if self.partial and self.id_field is None:
            raise ValueError("job.partial needs job.id_field (to match results as they land)")
        return self

    @property
    def first_poll(self) -> float:
        return self.poll_interval_s if self.first_poll_s is None else self.first_poll_s


def _strings_of(value: Any) -> str:
    """Every string inside a JSON value, joined (to look for a placeholder)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "\x00".join(_strings_of(v) for v in value.values())
    if isinstance(value, list):
        return "\x00".join(_strings_of(v) for v in value)
    return ""


def poll_pacing_key(provider: str, job: JobSpec | None = None) -> str:
    """The pacing key of an asynchronous provider's status polls: the provider's own
    key (the submits'), since a limit per account counts every request, unless the
    tool's ``job`` gives polls a limit of their own (``poll_pacing``): then
    ``<provider>:poll``."""
    if job is not None and job.poll_pacing is None:
        return provider
    return f"{provider}:poll"


class ToolSpec(SpecModel):
    """One tool: a provider endpoint with a typed input and named value getters."""

    id: str
    """the tool's id, filled in from its table's name (`[tools.ID]`): what `rc.tool(...)` and
    waterfall steps name"""
    provider: str
    """the provider (a `[providers.NAME]` of the catalog) whose base URL, auth and pacing the tool
    uses"""
    method: Literal["GET", "POST"] = "POST"
    """the HTTP method of a call (of the submit, for a job tool); GET sends the input as query
    parameters, POST as a JSON body"""
    path: str
    """the endpoint's path on the provider's base URL (the submit's, for a job tool)"""
    input: dict[str, str] = {}
    """the input fields and their types: "str", "int", "float" or "bool", a "?" suffix for an
    optional one; a call with another field or a wrong type is refused before it is sent (empty: any
    input is sent as given); a call leaving a required field blank (missing, null, or an empty or
    whitespace-only string) is never sent: its cell or waterfall step is `skipped_input`, free"""
    getters: dict[str, str] = {}
    """named values of an answer: `{name = "dotted.path"}`; a name without a getter is read as a
    path itself"""
    credits: Annotated[float, Field(ge=0)] = 1.0
    """the price of one request, unless `billing` says more"""
    typical_hit_rate: Annotated[float | None, Field(ge=0, le=1)] = None
    """the share of calls that find a value, as the provider states or you measured elsewhere:
    estimates price calls at it until this playline has enough receipts of the tool (their basis
    then reads `stated hit rate`)"""
    version: str = "1"
    """part of every receipt's key: a new version makes earlier receipts of the tool no answer (they
    are paid for again)"""
    batch: BatchSpec | None = None
    """a bulk endpoint the tool's calls are grouped into (not with `job`)"""
    job: JobSpec | None = None
    """an asynchronous tool: the call is a job submitted, then polled or called back (not with
    `batch`)"""
    timeout_s: Annotated[float | None, Field(gt=0)] = None
    """the HTTP timeout of this tool's calls, in seconds (unset: the provider's `timeout_s`)"""
    idempotency: Idempotency = "none"
    """the tool's idempotency contract, as the provider's `idempotency`; unset: the provider's"""
    billing: BillingSpec = BillingSpec()
    """how the provider bills an answer (default: `credits` per request)"""
    fresh_for: Freshness | None = None
    """how long an answer stays fresh: a duration ("90d") for every answer, or a table by outcome
    and value; an older receipt is paid for again (unset: a receipt answers for ever, unless a call
    asks for a fresher one)"""
    source: str | None = None
    """the documentation the entry was written from (presets cite theirs)"""
    no_match_status: tuple[int, ...] = ()
    """HTTP statuses (4xx) by which the provider answers "nothing found" (People Data Labs' 404):
    such an answer is a miss, not an error; its result is null, billed by the rule (0 for per_hit)
    and kept as a miss by `fresh_for`"""

    error_field: ErrorFieldSpec | None = None
    """where a 2xx answer says the call failed, for providers that answer errors with a 200
    (NeverBounce's `status`, Findymail's `error`): `{ field = "status", when = { throttle_triggered
    = "rate_limited" }, any = "rejected", message = "message" }`; a string is a field any present
    value of which rejects the call; such an answer is a provider error, not a result"""

    @field_validator("no_match_status")
    @classmethod
    def _no_match_status(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        for status in value:
            if not 400 <= status < 500 or status in NOT_A_MISS_STATUSES:
                raise ValueError(
                    f"no_match_status {status} is not a status that can mean no match: name "
                    "4xx statuses other than 408, 409, 425 and 429 (about timing or limits)"
                )
        return value

    @field_validator("fresh_for", mode="before")
    @classmethod
    def _fresh_for(cls, value: Any) -> Any:
        if isinstance(value, Mapping) and value.get("rule") is not None:
            raise ValueError(
                "a catalog freshness rule cannot name a function; use found, no_match, "
                "by and by_value (a column's fresh_for may take a function)"
            )
        return value if isinstance(value, Mapping | Freshness) else freshness_of(value)

    def max_age(self, result: Any) -> float | None:
        """How old a receipt of this tool answering ``result`` may be (``None``: for
        ever): ``fresh_for`` judged on the answer, a hit read through the tool's getters
        (the billing rule's ``hit`` unless the rule names its own)."""
        rule = self.fresh_for
        if rule is None:
            return None
        if rule.hit is None and self.billing.hit is not None:
            rule = rule.model_copy(update={"hit": self.billing.hit})
        return rule.max_age(result, get=self.get)

    @property
    def max_credits(self) -> float:
        """The most one answer (or bulk member) of this tool can cost."""
        return self.billing.worst_case(self.credits)

    def charge(self, result: Any, reported: float | None = None) -> Charge:
        """What one answer cost: the provider's reported figure, else the rule's."""
        return single_charge(self.billing, self.credits, result, reported, self.get)

    def bulk_charges(
        self, response: Any, members: list[Any], reported: float | None = None
    ) -> tuple[list[float], str]:
        """Each member's credits of a bulk answer, and where the figure came from."""
        return bulk_charges(self.billing, self.credits, response, members, reported, self.get)

    @property
    def resend_safe(self) -> bool:
        """Whether a request that may have been charged can be sent again for free."""
        return self.idempotency in RESEND_SAFE

    @model_validator(mode="after")
    def _check_input_types(self) -> ToolSpec:
        if self.job is not None and self.batch is not None:
            raise ValueError(f"tool {self.id!r}: a job tool cannot also declare batch")
        if self.job is not None and self.no_match_status:
            raise ValueError(
                f"tool {self.id!r}: a job tool's misses are in its results; no_match_status "
                "is for single and bulk tools"
            )
        for name, type_name in self.input.items():
            if type_name.rstrip("?") not in _FIELD_TYPES:
                raise ValueError(
                    f"tool {self.id!r}: input field {name!r} has type {type_name!r}; "
                    f"use one of {sorted(_FIELD_TYPES)} (suffix '?' for optional)"
                )
        return self

    @cached_property
    def input_model(self) -> type[BaseModel]:
        """A pydantic model built from ``input``; unknown fields are rejected."""
        fields: dict[str, Any] = {}
        for name, type_name in self.input.items():
            py_type = _FIELD_TYPES[type_name.rstrip("?")]
            if type_name.endswith("?"):
                fields[name] = (py_type | None, None)
            else:
                fields[name] = (py_type, ...)
        model: type[BaseModel] = create_model(
            f"{self.id}_input", __config__=ConfigDict(extra="forbid"), **fields
        )
        return model

    def blank_fields(self, value: Mapping[str, Any]) -> list[str]:
        """The required input fields (declared without ``?``) that ``value`` leaves
        blank: missing, ``None``, or an empty or whitespace-only string. A value of
        another type (an estimate's unknown one included) is not blank."""
        blank: list[str] = []
        for name, type_name in self.input.items():
            if type_name.endswith("?"):
                continue
            given = value.get(name)
            if given is None or (isinstance(given, str) and not given.strip()):
                blank.append(name)
        return blank

    def validate_input(self, value: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and normalise a call's input.

        Raises ``InvalidToolInput`` for a bug in the play (an unknown field, a wrong
        type), else ``BlankInput`` when a required field is blank (missing data: the
        call is never sent). A valid input is normalised as it always was (nothing is
        stripped: the receipt key stays the same).
        """
        if not self.input:
            return dict(value)
        data = dict(value)
        blank = self.blank_fields(data)
        try:
            payload = self.input_model.model_validate(data).model_dump(exclude_none=True)
        except ValidationError as err:
            # A blank required field's own complaint ("field required", "not a valid
            # integer" for a None or "") is the blank; anything else is the play's bug.
            errors = [e for e in err.errors() if not (e["loc"] and e["loc"][0] in blank)]
            if errors or not blank:
                problems = format_validation_errors(errors or err.errors())
                raise InvalidToolInput(f"tool {self.id!r} got invalid input: {problems}") from None
            raise BlankInput(self.id, blank) from None
        if blank:
            raise BlankInput(self.id, blank)
        return payload

    def get(self, result: Any, name: str) -> Any:
        """Read a named value from a result through its getter (a dotted path)."""
        return dig(result, self.getters.get(name, name))


class Catalog(SpecModel):
    """All providers and tools a worker can call."""

    providers: dict[str, ProviderSpec]
    """the providers, by name: where they live, their keys, their limits"""
    tools: dict[str, ToolSpec] = {}
    """the tools, by id: one provider endpoint each, with its input, getters and billing (none in a
    catalog that only declares sinks)"""
    waterfalls: dict[str, WaterfallSpec] = {}
    """named waterfalls: tools tried in order until one gives an accepted value"""
    sinks: dict[str, SinkSpec] = {}
    """where `playline sync` writes a run's rows back (a CRM, a warehouse table), by name; see
    playline.sinks"""

    @model_validator(mode="before")
    @classmethod
    def _fill_tool_ids(cls, data: Any) -> Any:
        data = _with_presets(data)
        if isinstance(data, Mapping) and isinstance(data.get("tools"), Mapping):
            providers = data.get("providers")
            providers = providers if isinstance(providers, Mapping) else {}
            tools = {}
            for tool_id, spec in data["tools"].items():
                if isinstance(spec, Mapping):
                    spec = {"id": tool_id, **spec}
                    provider = providers.get(spec.get("provider"))
                    if "idempotency" not in spec and isinstance(provider, Mapping):
                        spec["idempotency"] = provider.get("idempotency", "none")
                tools[tool_id] = spec
            data = {**data, "tools": tools}
        return data

    @model_validator(mode="after")
    def _check_references(self) -> Catalog:
        for tool in self.tools.values():
            if tool.provider not in self.providers:
                raise ValueError(
                    f"tool {tool.id!r} names provider {tool.provider!r}, which the catalog "
                    f"does not declare (declared: {sorted(self.providers)})"
                )
            auth = self.providers[tool.provider].auth
            if auth is not None and auth.query is not None and auth.query in tool.input:
                raise ValueError(
                    f"tool {tool.id!r} has an input field {auth.query!r}, the query parameter "
                    f"provider {tool.provider!r} takes its API key in; rename the field"
                )
        for name, waterfall in self.waterfalls.items():
            unknown = [t for t in waterfall.tools() if t not in self.tools]
            if unknown:
                raise ValueError(
                    f"waterfall {name!r} names tool(s) {unknown} the catalog does not declare"
                )
        for name, sink in self.sinks.items():
            if sink.kind != "postgres" and sink.provider not in self.providers:
                raise ValueError(
                    f"sink {name!r} names provider {sink.provider!r}, which the "
                    "catalog does not declare"
                )
        return self

    def waterfall(self, name: str) -> WaterfallSpec:
        """The named waterfall, or ``UnknownTool`` naming the ones that exist."""
        try:
            return self.waterfalls[name]
        except KeyError:
            declared = ", ".join(sorted(self.waterfalls)) or "none"
            raise UnknownTool(
                f"unknown waterfall {name!r}; the catalog declares: {declared}"
            ) from None

    def tool(self, tool_id: str) -> ToolSpec:
        """The tool with this id, or ``UnknownTool`` naming the ones that exist."""
        try:
            return self.tools[tool_id]
        except KeyError:
            raise UnknownTool(
                f"unknown tool {tool_id!r}; the catalog declares: {', '.join(sorted(self.tools))}"
            ) from None

    def provider_of(self, tool_id: str) -> ProviderSpec:
        return self.providers[self.tool(tool_id).provider]

    @classmethod
    def from_toml(cls, path: str | Path) -> Catalog:
        """Load and validate a catalog file; every problem is reported at once."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise CatalogError(f"catalog file {path} does not exist") from None
        except tomllib.TOMLDecodeError as err:
            raise CatalogError(f"catalog file {path} is not valid TOML: {err}") from None
        try:
            return cls.model_validate(data)
        except CatalogError as err:  # an include naming no preset
            raise CatalogError(f"catalog file {path}: {err}") from None
        except ValidationError as err:
            problems = format_validation_errors(err.errors(), top="catalog")
            raise CatalogError(f"catalog file {path} is invalid: {problems}") from None

    def pacing_policies(self) -> dict[str, PacingPolicy]:
        """The governor's policies: one per provider, plus one per key of a provider
        that declares ``key_pacing`` or several keys (see :func:`key_pacing_key`)."""
        policies: dict[str, PacingPolicy] = {}
        for name, spec in self.providers.items():
            policies[name] = spec.pacing
            envs = spec.key_envs()
            if spec.key_pacing is not None or len(envs) > 1:
                for env in envs:
                    policies[key_pacing_key(name, env)] = spec.key_pacing or spec.pacing
        for tool in self.tools.values():
            if tool.job is not None and tool.job.poll_pacing is not None:
                policies.setdefault(poll_pacing_key(tool.provider, tool.job), tool.job.poll_pacing)
        return policies

    def pacing_keys(self, provider: str) -> list[str]:
        """The per-key pacing keys of ``provider`` (empty: it is paced as a whole only)."""
        spec = self.providers[provider]
        envs = spec.key_envs()
        if spec.key_pacing is None and len(envs) < 2:
            return []
        return [key_pacing_key(provider, env) for env in envs]

    def key_parameters(self) -> list[str]:
        """The query parameters providers take their keys in (``auth.query``)."""
        return sorted(
            {spec.auth.query for spec in self.providers.values() if spec.auth and spec.auth.query}
        )

    def secret_variables(self) -> list[str]:
        """Every environment variable that holds an API key, over all providers."""
        return sorted({env for spec in self.providers.values() for env in spec.key_envs()})


#: The package holding the presets (``include = [...]``).
PRESETS_PACKAGE = "playline.presets"
_MERGED_TABLES = ("providers", "tools", "waterfalls", "sinks")


def preset_names() -> list[str]:
    """The presets shipped with playline (``include`` takes these names)."""
    folder = resources.files(PRESETS_PACKAGE)
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_preset(name: str) -> dict[str, Any]:
    """One preset's tables, or ``CatalogError`` naming the presets that exist."""
    if not isinstance(name, str) or name not in preset_names():
        raise CatalogError(
            f"catalog includes unknown preset {name!r}; presets: {', '.join(preset_names())}"
        )
    text = resources.files(PRESETS_PACKAGE).joinpath(f"{name}.toml").read_text()
    return tomllib.loads(text)


def _included(names: Any, *, by: str | None = None) -> list[str]:
    """The presets ``names`` pulls in, in merge order: each one's own ``include`` (one
    level: a preset naming presets, e.g. ``waterfalls`` over the finders it chains)
    before it, each preset once."""
    if isinstance(names, str) or not isinstance(names, list):
        where = f"preset {by!r}" if by else "catalog"
        raise CatalogError(f"{where} 'include' must be a list of preset names")
    order: list[str] = []
    for name in names:
        if by is None:
            inner = load_preset(name).get("include")
            if inner is not None:
                for nested in _included(inner, by=name):
                    if nested not in order:
                        order.append(nested)
        elif load_preset(name).get("include") is not None:
            raise CatalogError(
                f"preset {by!r} includes {name!r}, which includes presets itself; "
                "a preset's include is followed one level only"
            )
        if name not in order:
            order.append(name)
    return order


def _with_presets(data: Any) -> Any:
    """``data`` with its ``include``d presets merged under its own tables (its own win).

    A preset's own ``include`` is followed one level, its presets merged under it."""
    if not isinstance(data, Mapping) or "include" not in data:
        return data
    names = _included(data["include"])
    merged: dict[str, Any] = {k: v for k, v in data.items() if k != "include"}
    for table in _MERGED_TABLES:
        combined: dict[str, Any] = {}
        for name in names:
            combined.update(load_preset(name).get(table, {}))
        own = data.get(table, {})
        for key, value in (own if isinstance(own, Mapping) else {}).items():
            preset = combined.get(key)
            if table == "providers" and isinstance(preset, Mapping) and isinstance(value, Mapping):
                # Key by key: `[providers.apollo]` `plan = "basic"` alone keeps the rest.
                combined[key] = {**preset, **value}
            else:
                combined[key] = value
        if combined or table in data:
            merged[table] = combined
    return merged


def key_pacing_key(provider: str, env: str) -> str:
    """The pacing key of one API key: the provider and the *name* of its variable.

    The name, not the key, so it is safe to log, show in ``playline limits`` and
    store in the fleet tables.
    """
    return f"{provider}:key={env}"
