"""The local provider server: a Starlette app that behaves like a paid, rate-limited GTM API.

Several fake providers share one server; the first path segment names the
provider and is its rate-limit key. Each endpoint bills its own way (``credits`` in
the ledger), as real enrichment APIs do:

* ``acme``  (auth header ``X-Api-Key``): ``/acme/v1/email/find`` (1 credit per
  request), ``/acme/v1/person/enrich`` (2);
* ``firmo`` (auth ``Authorization: Bearer``): ``/firmo/v1/company/lookup`` (0.5) and its
  ``/bulk`` variant (one charged call for many items, 0.5 each);
* ``mailfox`` (``X-Api-Key``): ``/mailfox/v1/email/find``, 1 credit per hit, free miss;
* ``prospectr`` (``Authorization: Bearer``): ``/prospectr/v1/email/find`` charges 2 and
  refunds them on a miss; ``/prospectr/v1/contact/enrich`` bills per field found
  (email 1, mobile 10, personal email 3) and says so in ``X-Credits-Charged``;
* ``verifly`` (``X-Api-Key``): ``/verifly/v1/verify``, 0.5 per request;
* real vendors' shapes, for the catalog presets (``playline/presets``), each under
  its own prefix: ``/hunter/v2/email-finder`` (GET, ``X-API-KEY``, 1 per email found),
  ``/findymail/api/search/name`` (Bearer, 1 per email found), ``/prospeo/enrich-person``
  and ``/prospeo/bulk-enrich-person`` (``X-KEY``, 1 per match unless the account
  enriched that record before: ``free_enrichment``, with ``total_cost`` in the body),
  ``/apollo/api/v1/people/match`` and ``/apollo/api/v1/people/bulk_match``
  (``X-Api-Key``, 1 per match, ``credits_consumed`` in the bulk body);
* asynchronous jobs (submit, then poll or webhook; see ``jobs``):
  ``fullenrich`` (Bearer): ``POST /fullenrich/api/v1/contact/enrich/bulk`` (free; 1 to
  100 contacts, answers an ``enrichment_id``) and ``GET
  /fullenrich/api/v1/contact/enrich/bulk/{enrichment_id}`` (free; the contacts
  finished so far), each contact billed as it finishes: 1 per work email, 3 per
  personal email, 10 per phone found; ``dropcontact`` (``X-Access-Token``): ``POST
  /dropcontact/batch`` (free; 1 to 250 records, answers a ``request_id``) and ``GET
  /dropcontact/batch/{request_id}`` (free; "not ready" until the job is done), 1 per
  record with an email found, billed when the job finishes. Both can POST the
  finished job to a webhook (FullEnrich's signed with HMAC-SHA1). Their polls are
  rate-limited under ``"<provider>:poll"``, their submits under the provider's name.

Each provider's account has a balance, reported by its vendor's balance endpoint
(``balances``: Hunter's ``/v2/account``, FullEnrich's ``/account/credits``, ...): the
config's ``starting_balance`` less what the ledger billed. A charged fault ("charged
then dropped": ``drop_after_charge``, ``500_after_charge``, ...) shows in it.

Whether an input is found is a digest of it against ``ServerConfig.hit_rates`` (see
``fake_data``), so tests compute every answer and its price without the server.
``X-Credits-Charged`` on a replayed answer repeats the original charge (the replay
itself costs nothing; the ledger says so). With ``answer_epoch`` above 0 a share
(``changed_fraction``) of the inputs get another answer than at epoch 0 (see
``epochs``), and ``GET /_admin/changed`` lists them per endpoint, old and new.

A provider request goes through, in order: authentication (401), the
rate limit and concurrency cap decided on arrival (429 + ``Retry-After``), body
validation (422), ``Idempotency-Key`` checks (422 on reuse with another body,
409 while the same key is in flight), injected faults, the latency sleep, and
finally the charge. A replay of a key whose call was charged returns the stored
response and is counted in ``duplicates``, not charged. With
``idempotency="ignore"`` the header is not even read: no replay, no 409, no 422,
every request that reaches the charge pays, as with most real enrichment APIs.

The charged faults fail *after* the charge: ``malformed`` (a 200 with a broken
body), ``500_after_charge`` (a 500 with a JSON error), ``drop_after_charge`` (the
headers announce the full ``Content-Length``, half the body is sent, then the
connection is aborted: the client sees a transport error, never a status) and
``timeout_after_charge`` (the answer is held ``timeout_sleep_s``, then a 504). In
``key`` mode each of them stores the *correct* response under the idempotency key
before failing: the provider's charge and its record of the answer are one step,
and what broke is the way back (a proxy, the wire, the process writing the
response). A client retrying with the same key therefore recovers without paying
twice; a provider that ignores keys charges the retry again.

After the response is computed the handler asks whether the client is still
connected: a client that timed out, was cancelled or was SIGKILLed during the
latency sleep is gone, yet its call was charged, as at a real provider. The
ledger records that call as not ``answered`` (``client_gone``), and counts it in
``charged_unanswered`` together with the charged faults.

Everything runs in one event loop; the state is mutated without locks and no
handler awaits between a check and the update it guards.
"""

from __future__ import annotations

import asyncio
import email.utils
import hmac
import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from playline.provider_server import epochs, fake_data
from playline.provider_server.balances import BALANCE_ROUTES, BalanceRoute
from playline.provider_server.config import (
    CHARGED_FAULTS,
    DEFAULT_HIT_RATES,
    FAULT_KINDS,
    ServerConfig,
    key_digest,
)
from playline.provider_server.crm import crm_routes
from playline.provider_server.jobs import JOB_ROUTES, JobBadRequest, JobEngine, JobRoute
from playline.provider_server.ledger import Bill, Charge, Ledger, idem_digest
from playline.provider_server.limiters import Decision, Limiter, build_limiter

JSON_TYPE = "application/json"


class BadRequest(Exception):
    """The request body is not what the endpoint expects (rendered as 422)."""


@dataclass(frozen=True)
class AuthScheme:
    """Which header carries a provider's key, and the scheme prefix if any."""

    header: str
    scheme: str | None = None

    def extract(self, request: Request) -> str | None:
        """The key sent with ``request``, or None when it is missing or malformed."""
        value = request.headers.get(self.header, "").strip()
        if self.scheme is not None:
            prefix, _, value = value.partition(" ")
            if prefix.lower() != self.scheme.lower():
                return None
            value = value.strip()
        return value or None

    def describe(self) -> str:
        return f"{self.header}: {self.scheme} <key>" if self.scheme else f"{self.header}: <key>"


PROVIDER_AUTH: dict[str, AuthScheme] = {
    "acme": AuthScheme("X-Api-Key"),
    "firmo": AuthScheme("Authorization", "Bearer"),
    "mailfox": AuthScheme("X-Api-Key"),
    "prospectr": AuthScheme("Authorization", "Bearer"),
    "verifly": AuthScheme("X-Api-Key"),
    "hunter": AuthScheme("X-API-KEY"),
    "findymail": AuthScheme("Authorization", "Bearer"),
    "prospeo": AuthScheme("X-KEY"),
    "apollo": AuthScheme("X-Api-Key"),
    "fullenrich": AuthScheme("Authorization", "Bearer"),
    "dropcontact": AuthScheme("X-Access-Token"),
}

#: The header a provider reports a call's charge in (``prospectr``'s contact enrich).
CREDITS_HEADER = "X-Credits-Charged"


Inputs = Sequence[Mapping[str, str]]
#: ``(inputs, results, free)`` -> the bill; ``free[i]`` marks a record the account
#: already paid for (Prospeo's lifetime de-duplication), else False.
Biller = Callable[[Inputs, Sequence[Any], Sequence[bool]], Bill]
#: ``(inputs, results, free)`` -> the response body (JSON-ready).
Renderer = Callable[[Inputs, Sequence[Any], Sequence[bool]], Any]


def per_request(credits: float) -> Biller:
    """``credits`` for every input (each member of a bulk request)."""
    return lambda inputs, results, free: Bill(credits * len(inputs))


def _found(result: Any, field_name: str) -> bool:
    return isinstance(result, Mapping) and result.get(field_name) is not None


def per_hit(credits: float, hit_field: str) -> Biller:
    """``credits`` per result whose ``hit_field`` is not null; a miss is free."""
    return lambda inputs, results, free: Bill(credits * sum(_found(r, hit_field) for r in results))


def refund_on_miss(credits: float, hit_field: str) -> Biller:
    """``credits`` per input up front, given back for every miss."""

    def bill(inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Bill:
        misses = sum(not _found(r, hit_field) for r in results)
        return Bill(credits * len(inputs), credits * misses, misses)

    return bill


def per_match_unless_free(credits: float) -> Biller:
    """``credits`` per matched record (not None) the account had not paid for before."""
    return lambda inputs, results, free: Bill(
        credits * sum(r is not None and not f for r, f in zip(results, free, strict=True))
    )


def _by_fields(inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Bill:
    return Bill(sum(fake_data.prospectr_enrich_credits(r) for r in results))


def _plain(inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Any:
    return results[0]


def _bulk_results(inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Any:
    return {"results": list(results)}


def _prospeo_single(inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Any:
    # The not-found answer is an assumption: the docs read do not show it.
    if results[0] is None:
        return {"error": True, "error_code": "NO_MATCH", "free_enrichment": False}
    return {"error": False, "free_enrichment": free[0], **results[0]}


def _prospeo_bulk(inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Any:
    return fake_data.prospeo_bulk_response(inputs, results, free)


def _apollo_single(inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Any:
    return {"person": results[0]}


def _apollo_bulk(inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Any:
    return fake_data.apollo_bulk_response(results)


_ONE_PER_REQUEST = per_request(1.0)

#: ``(input, hit_rate)`` -> one member's result (None: not found, for bulk vendors).
Compute = Callable[[Mapping[str, str], float], Any]


def _always(fn: Callable[..., dict[str, Any]]) -> Compute:
    """A lookup that always finds (the acme / firmo / verifly endpoints)."""
    return lambda item, hit_rate: fn(**item)


def _with_rate(fn: Callable[..., dict[str, Any]]) -> Compute:
    return lambda item, hit_rate: fn(**item, hit_rate=hit_rate)


def _prospeo_compute(item: Mapping[str, str], hit_rate: float) -> Any:
    return fake_data.prospeo_person(item, hit_rate)


def _apollo_compute(item: Mapping[str, str], hit_rate: float) -> Any:
    return fake_data.apollo_match(item, hit_rate)


@dataclass(frozen=True)
class Endpoint:
    """One charged provider endpoint: its input, its answer and its price."""

    provider: str
    path: str
    fields: tuple[str, ...]
    compute: Compute
    bulk: bool = False
    #: Whether each input is a company-lookup item (for item-level double-charge counts).
    company_items: bool = False
    method: str = "POST"
    bill: Biller = _ONE_PER_REQUEST
    render: Renderer | None = None
    #: where a bulk body lists its members
    items_field: str = "items"
    #: where a single body nests its input (Prospeo's ``data``); None: the body itself
    input_field: str | None = None
    #: the header reporting the call's net charge, if the provider sends one
    charged_header: str | None = None
    #: a record this account was billed for before is free (Prospeo's lifetime rule)
    account_dedupe: Callable[[Mapping[str, str]], bytes] | None = None

    def body(self, inputs: Inputs, results: Sequence[Any], free: Sequence[bool]) -> Any:
        """The response body for these inputs and results."""
        if self.render is not None:
            return self.render(inputs, results, free)
        return _bulk_results(inputs, results, free) if self.bulk else _plain(inputs, results, free)


_PERSON = ("first_name", "last_name", "domain")

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "acme",
        "/acme/v1/email/find",
        _PERSON,
        _always(fake_data.find_email),
        bill=per_request(1.0),
    ),
    Endpoint(
        "acme",
        "/acme/v1/person/enrich",
        ("email",),
        _always(fake_data.enrich_person),
        bill=per_request(2.0),
    ),
    Endpoint(
        "firmo",
        "/firmo/v1/company/lookup",
        ("domain",),
        _always(fake_data.lookup_company),
        company_items=True,
        bill=per_request(0.5),
    ),
    Endpoint(
        "firmo",
        "/firmo/v1/company/lookup/bulk",
        ("domain",),
        _always(fake_data.lookup_company),
        bulk=True,
        company_items=True,
        bill=per_request(0.5),
    ),
    Endpoint(
        "mailfox",
        "/mailfox/v1/email/find",
        _PERSON,
        _with_rate(fake_data.mailfox_finds),
        bill=per_hit(1.0, "email"),
    ),
    Endpoint(
        "prospectr",
        "/prospectr/v1/email/find",
        _PERSON,
        _with_rate(fake_data.prospectr_finds),
        bill=refund_on_miss(2.0, "email"),
    ),
    Endpoint(
        "prospectr",
        "/prospectr/v1/contact/enrich",
        ("email",),
        _always(fake_data.prospectr_enrich),
        bill=_by_fields,
        charged_header=CREDITS_HEADER,
    ),
    Endpoint(
        "verifly",
        "/verifly/v1/verify",
        ("email",),
        _always(fake_data.verifly_verify),
        bill=per_request(0.5),
    ),
    Endpoint(
        "hunter",
        "/hunter/v2/email-finder",
        _PERSON,
        _with_rate(fake_data.hunter_email_finder),
        method="GET",
        bill=lambda inputs, results, free: Bill(
            float(sum(r["data"]["email"] is not None for r in results))
        ),
    ),
    Endpoint(
        "findymail",
        "/findymail/api/search/name",
        ("name", "domain"),
        _with_rate(fake_data.findymail_search_name),
        bill=per_hit(1.0, "contact"),
    ),
    Endpoint(
        "prospeo",
        "/prospeo/enrich-person",
        ("first_name", "last_name", "company_website"),
        _prospeo_compute,
        input_field="data",
        bill=per_match_unless_free(1.0),
        render=_prospeo_single,
        account_dedupe=fake_data.prospeo_record_key,
    ),
    Endpoint(
        "prospeo",
        "/prospeo/bulk-enrich-person",
        ("identifier", "first_name", "last_name", "company_website"),
        _prospeo_compute,
        bulk=True,
        items_field="data",
        bill=per_match_unless_free(1.0),
        render=_prospeo_bulk,
        account_dedupe=fake_data.prospeo_record_key,
    ),
    Endpoint(
        "apollo",
        "/apollo/api/v1/people/match",
        _PERSON,
        _apollo_compute,
        bill=per_match_unless_free(1.0),
        render=_apollo_single,
    ),
    Endpoint(
        "apollo",
        "/apollo/api/v1/people/bulk_match",
        _PERSON,
        _apollo_compute,
        bulk=True,
        items_field="details",
        bill=per_match_unless_free(1.0),
        render=_apollo_bulk,
    ),
)


def _required_fields(value: Any, fields: tuple[str, ...], where: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise BadRequest(f"{where} must be a JSON object with fields {list(fields)}")
    result: dict[str, str] = {}
    for name in fields:
        item = value.get(name)
        if not isinstance(item, str) or not item.strip():
            raise BadRequest(f"{where}: field {name!r} is required and must be a non-empty string")
        result[name] = item
    return result


def parse_inputs(endpoint: Endpoint, body: Any, max_items: int) -> list[dict[str, str]]:
    """The validated input(s) of a request: one for a single call, all items for bulk."""
    if not endpoint.bulk:
        if endpoint.input_field is None:
            return [_required_fields(body, endpoint.fields, "body")]
        nested = body.get(endpoint.input_field) if isinstance(body, Mapping) else None
        return [_required_fields(nested, endpoint.fields, endpoint.input_field)]
    name = endpoint.items_field
    items = body.get(name) if isinstance(body, Mapping) else None
    if not isinstance(items, list) or not items:
        raise BadRequest(f'body must be {{"{name}": [...]}} with at least one item')
    if len(items) > max_items:
        raise BadRequest(f"too many items: {len(items)} > {max_items}")
    return [_required_fields(it, endpoint.fields, f"{name}[{i}]") for i, it in enumerate(items)]


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON error body ``{"error": message}``."""
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


class TokenBucket:
    """A token bucket: ``rate`` tokens per second, at most ``capacity`` saved up."""

    def __init__(self, rate: float, capacity: int) -> None:
        self.rate = rate
        self.capacity = float(capacity)
        self.tokens = float(capacity)
        self.updated = time.monotonic()

    def try_take(self, now: float) -> float:
        """Take a token; returns 0.0 on success, else the seconds until one is available."""
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass
class StoredResponse:
    """A charged response kept for ``Idempotency-Key`` replays."""

    request_digest: bytes
    status: int
    body: bytes
    #: headers the answer carried (``X-Credits-Charged``), repeated on a replay
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What a provider request ended as (for the call record)."""

    response: Response
    charged: bool = False
    items: int = 1
    duplicate: bool = False
    #: why the client got no usable answer (``ledger.UNANSWERED_REASONS``), ``""`` if it did
    unanswered: str = ""
    #: what the call was billed, net of refunds (0 unless charged)
    credits: float = 0.0


class _DroppedOnPurpose(Exception):
    """Raised by :class:`DroppedResponse` so the server aborts the connection mid-body."""


class DroppedResponse(Response):
    """A response that dies on the wire: full ``Content-Length``, half the body, then abort.

    Raising after the response started makes uvicorn close the transport without
    completing the message, which is what a crashed provider or a cut proxy looks
    like to a client: ``httpx.RemoteProtocolError`` (httpcore) or ``httpx.ReadError``
    (httpx-aiohttp), never a status code.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        partial = self.body[: len(self.body) // 2]
        await send({"type": "http.response.body", "body": partial, "more_body": True})
        raise _DroppedOnPurpose("connection dropped on purpose (drop_after_charge)")


class _QuietDrops(logging.Filter):
    """Keeps uvicorn from logging the intended drops as "Exception in ASGI application"."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _DroppedOnPurpose)


def _install_quiet_drops() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrops) for f in logger.filters):
        logger.addFilter(_QuietDrops())


@dataclass
class _Call:
    """A validated request on its way through faults, latency and charging."""

    endpoint: Endpoint
    inputs: list[dict[str, str]]
    request_digest: bytes
    idem_key: tuple[str, str] | None = None
    fault: str | None = field(default=None)
    #: the digest of the API key it was sent with (Prospeo's per-account rule)
    key: str = ""


@dataclass(frozen=True)
class _Answer:
    """A charged call's answer: the body, its headers and what it cost."""

    body: bytes
    headers: dict[str, str]
    credits: float


class ProviderServer:
    """The state behind the app: config, ledger, rate limiters, idempotency store."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.ledger = Ledger(self.config.max_call_records)
        self.idempotency: dict[tuple[str, str], StoredResponse] = {}
        self.idempotency_in_flight: set[tuple[str, str]] = set()
        self.buckets: dict[str, TokenBucket] = {}
        #: (provider, key digest, record digest) of records an account was billed for
        self.enriched: set[tuple[str, str, bytes]] = set()
        #: per endpoint path, the inputs whose latest answer differed from epoch 0's
        #: (``epochs``): ``{path: {input key: {"input", "old", "new"}}}``
        self.drifted: dict[str, dict[str, dict[str, Any]]] = {}
        #: the asynchronous jobs (``jobs``); they read the current config on each step
        self.jobs = JobEngine(lambda: self.config, self.ledger)
        self._reseed()
        self._rebuild_buckets()

    # -- state management ---------------------------------------------------

    def _reseed(self) -> None:
        self.fault_rng = random.Random(self.config.seed)
        self.latency_rng = random.Random(self.config.seed + 1)

    def _rebuild_buckets(self) -> None:
        self.buckets = {
            provider: TokenBucket(rps, self.config.burst_for(provider))
            for provider, rps in self.config.rate_limit_rps.items()
        }
        self.limiters: dict[tuple[str, int, str], Limiter] = {}
        self.key_in_flight: Counter[tuple[str, str]] = Counter()

    def reset(self) -> None:
        """Clear the ledger, the idempotency store, the accounts' enriched records, the
        jobs (their pending webhooks are not sent) and the rate limiters; reseed faults;
        restore the default ``hit_rates``.

        The hit rates are reset with the ledger because they decide what a call
        costs: a test that changed them must not leak its prices into the next one.
        """
        self.ledger.reset()
        self.idempotency.clear()
        self.enriched.clear()
        self.drifted.clear()
        self.jobs.reset()
        self.config = self.config.merged({"hit_rates": dict(DEFAULT_HIT_RATES)})
        self._reseed()
        in_flight = self.key_in_flight
        self._rebuild_buckets()
        self.key_in_flight = in_flight  # requests still in flight will leave

    def apply_config(self, config: ServerConfig) -> None:
        """Switch to a new config; limiters restart full, the RNGs reseed if the seed changed."""
        old = self.config
        self.config = config
        self.ledger.resize(config.max_call_records)
        self.jobs.config_changed()
        if config.seed != old.seed:
            self._reseed()
        if (config.rate_limit_rps, config.rate_limit_burst, config.limiters) != (
            old.rate_limit_rps,
            old.rate_limit_burst,
            old.limiters,
        ):
            in_flight = self.key_in_flight
            self._rebuild_buckets()
            self.key_in_flight = in_flight

    # -- the request pipeline -----------------------------------------------

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        """Serve one provider request and record it in the ledger."""
        idem = idem_digest(request.headers.get("idempotency-key"))
        in_flight = self.ledger.enter(endpoint.provider, idem)
        outcome = Outcome(error_response(500, "internal error"))
        scope: tuple[str, str] | None = None
        try:
            key = self._authenticate(request, endpoint.provider)
            if isinstance(key, Response):
                outcome = Outcome(key)
            else:
                scope = (endpoint.provider, key_digest(key))
                self.key_in_flight[scope] += 1
                outcome = await self._process(
                    endpoint.provider,
                    in_flight,
                    scope,
                    lambda: self._pipeline(request, endpoint, scope[1]),
                )
            if not outcome.unanswered and await request.is_disconnected():
                outcome.unanswered = "client_gone"
        finally:
            self.ledger.leave(endpoint.provider, idem)
            if scope is not None:
                self.key_in_flight[scope] -= 1
            self.ledger.record(
                endpoint.provider,
                endpoint.path,
                outcome.response.status_code,
                outcome.charged,
                outcome.items,
                outcome.duplicate,
                scope[1] if scope else "",
                idem,
                outcome.unanswered,
                outcome.credits,
            )
        return outcome.response

    async def _process(
        self,
        provider: str,
        in_flight: int,
        scope: tuple[str, str],
        pipeline: Callable[[], Awaitable[Outcome]],
    ) -> Outcome:
        """The limits of ``provider`` (a rate-limit key), then ``pipeline`` if admitted."""
        rejected = self._admit(provider, in_flight)
        if rejected is not None:
            return Outcome(rejected)
        decisions = self._admit_limiters(scope)
        if isinstance(decisions, Response):
            return Outcome(decisions)
        outcome = await pipeline()
        self._add_limit_headers(outcome.response.headers, self._describe(scope))
        return outcome

    async def _pipeline(self, request: Request, endpoint: Endpoint, key: str) -> Outcome:
        try:
            call = await self._parse(request, endpoint)
            call.key = key
            self._check_idempotency(call)
        except BadRequest as err:
            self.ledger.tally.invalid += 1
            return Outcome(error_response(422, str(err)))
        except _Conflict as err:
            self.ledger.tally.conflicts += 1
            return Outcome(error_response(409, str(err)))
        call.fault = self._pick_fault()
        failed = await self._failure(call)
        if failed is not None:
            return Outcome(failed)
        return await self._serve(call)

    def _authenticate(self, request: Request, provider: str) -> str | Response:
        """The key the request was sent with, or the 401 response."""
        scheme = PROVIDER_AUTH[provider]
        key = scheme.extract(request)
        expected = self.config.keys_for(provider)
        ok = key is not None and (
            expected is None or any(hmac.compare_digest(key.encode(), e.encode()) for e in expected)
        )
        if not ok or key is None:
            self.ledger.tally.unauthorized += 1
            headers = {"WWW-Authenticate": "Bearer"} if scheme.scheme else None
            problem = "missing" if key is None else "invalid"
            message = f"{problem} API key for {provider}: send {scheme.describe()}"
            if key is not None and self.config.echo_key_in_errors:
                # A badly behaved provider quotes the key back (playline must scrub it).
                message += f"; the key {key!r} is not valid for this account"
            return error_response(401, message, headers)
        self.ledger.saw_key(provider, key_digest(key))
        return key

    def _admit(self, provider: str, in_flight: int) -> Response | None:
        """The on-arrival decision of the simple knobs: a 429 response, or None to go ahead."""
        cap = self.config.max_concurrency.get(provider)
        if cap is not None and in_flight > cap:
            return self._too_many(provider, 1.0, f"more than {cap} concurrent requests")
        bucket = self.buckets.get(provider)
        if bucket is not None:
            wait = bucket.try_take(time.monotonic())
            if wait > 0:
                return self._too_many(provider, wait, f"over {bucket.rate:g} requests/s")
        return None

    def _limiters(self, scope: tuple[str, str]) -> list[tuple[Limiter, int]]:
        """The provider's limiters for this key, with the in-flight count each one sees."""
        provider, digest = scope
        found = []
        for index, spec in enumerate(self.config.limiters.get(provider, [])):
            owner = digest if spec.per_key else ""
            limiter = self.limiters.get((provider, index, owner))
            if limiter is None:
                limiter = self.limiters[(provider, index, owner)] = build_limiter(spec)
            if spec.per_key:
                in_flight = self.key_in_flight[scope]
            else:
                in_flight = sum(n for (p, _), n in self.key_in_flight.items() if p == provider)
            found.append((limiter, in_flight))
        return found

    def _admit_limiters(self, scope: tuple[str, str]) -> list[Decision] | Response:
        """Every limiter must admit the request; only then does each count it."""
        now = time.monotonic()
        limiters = self._limiters(scope)
        decisions = [limiter.check(now, in_flight) for limiter, in_flight in limiters]
        refused = [d for d in decisions if not d.allowed]
        if refused:
            waits = [d.wait_s for d in refused if d.wait_s is not None]
            why = ", ".join(f"{d.name}: {d.limit:g}" for d in refused)
            response = self._too_many(
                scope[0], max(waits) if waits else None, f"over the limit ({why})"
            )
            self._add_limit_headers(response.headers, decisions)
            return response
        for limiter, _ in limiters:
            limiter.commit(now)
        return decisions

    def _describe(self, scope: tuple[str, str]) -> list[Decision]:
        now = time.monotonic()
        return [limiter.describe(now, in_flight) for limiter, in_flight in self._limiters(scope)]

    def _add_limit_headers(self, headers: MutableHeaders, decisions: list[Decision]) -> None:
        mode = self.config.rate_limit_headers
        windows = [d for d in decisions if d.window_s > 0]
        if mode == "none" or not windows:
            return
        if mode == "x-ratelimit":
            tightest = min(windows, key=lambda d: (d.remaining, -d.reset_s))
            headers["X-RateLimit-Limit"] = f"{tightest.limit:g}"
            headers["X-RateLimit-Remaining"] = f"{tightest.remaining:g}"
            headers["X-RateLimit-Reset"] = str(math.ceil(tightest.reset_s))
            return
        headers["RateLimit-Policy"] = ", ".join(
            f'"{d.name}";q={d.limit:g};w={math.ceil(d.window_s)}' for d in windows
        )
        headers["RateLimit"] = ", ".join(
            f'"{d.name}";r={d.remaining:g};t={math.ceil(d.reset_s)}' for d in windows
        )

    def _too_many(self, provider: str, wait_s: float | None, why: str) -> Response:
        self.ledger.note_rate_limited(provider)
        headers = {}
        mode = self.config.retry_after if self.config.retry_after_header else "none"
        if wait_s is not None and mode != "none":
            if mode == "exact":
                headers["Retry-After"] = f"{max(0.001, wait_s):.3f}"
            elif mode == "ceil":
                headers["Retry-After"] = str(max(1, math.ceil(wait_s)))
            else:  # an HTTP date has whole seconds: round the instant up
                headers["Retry-After"] = email.utils.formatdate(
                    math.ceil(time.time() + wait_s), usegmt=True
                )
        return error_response(429, f"rate limit exceeded for {provider}: {why}", headers)

    async def _parse(self, request: Request, endpoint: Endpoint) -> _Call:
        body: Any
        if endpoint.method == "GET":
            body = dict(request.query_params)  # a GET endpoint takes its input in the query
        else:
            try:
                body = json.loads(await request.body())
            except (ValueError, UnicodeDecodeError):
                raise BadRequest("body is not valid JSON") from None
        inputs = parse_inputs(endpoint, body, self.config.bulk_max_items)
        call = _Call(endpoint, inputs, fake_data.digest(endpoint.path, body))
        if self.config.idempotency == "ignore":
            return call  # the header means nothing to this provider
        header = request.headers.get("idempotency-key")
        if header is not None:
            if not header.strip():
                raise BadRequest("Idempotency-Key header is empty")
            call.idem_key = (endpoint.provider, header)
        return call

    def _check_idempotency(self, call: _Call) -> None:
        if call.idem_key is None:
            return
        stored = self.idempotency.get(call.idem_key)
        if stored is not None and stored.request_digest != call.request_digest:
            raise BadRequest(
                "Idempotency-Key was already used with a different request; use a new key"
            )
        if stored is None and call.idem_key in self.idempotency_in_flight:
            raise _Conflict("a request with this Idempotency-Key is still in flight; retry later")

    def _pick_fault(self) -> str | None:
        """The fault for this request: ``fail_next`` first (exact), then the random rates."""
        pending = self.config.fail_next
        for kind in FAULT_KINDS:
            if pending.get(kind, 0) > 0:
                pending[kind] -= 1
                return kind
        roll = self.fault_rng.random()
        for kind, rate in self.config.fault_rates():
            if roll < rate:
                return kind
            roll -= rate
        return None

    async def _failure(self, call: _Call) -> Response | None:
        """The response of an uncharged injected fault, or None when the call goes ahead."""
        return await self._uncharged_fault(call.fault, call.endpoint.provider)

    async def _uncharged_fault(self, fault: str | None, provider: str) -> Response | None:
        if fault == "429":
            return self._too_many(provider, 1.0, "injected")
        if fault == "5xx":
            self.ledger.note_fault("5xx")
            return error_response(503, "injected fault: provider unavailable, retry later")
        if fault == "timeout":
            self.ledger.note_fault("timeout")
            await asyncio.sleep(self.config.timeout_sleep_s)
            return error_response(504, "injected fault: upstream timed out")
        return None

    async def _sleep_latency(self, provider: str) -> None:
        low, high = self.config.latency_for(provider)
        if high > 0:
            await asyncio.sleep(self.latency_rng.uniform(low, high) / 1000.0)

    async def _serve(self, call: _Call) -> Outcome:
        """Sleep the latency, then replay a stored response or compute and charge a new one.

        A replay is never charged, so a charged fault drawn for it has no effect.
        """
        stored = self.idempotency.get(call.idem_key) if call.idem_key else None
        if stored is not None:
            await self._sleep_latency(call.endpoint.provider)
            self.ledger.note_replay(call.endpoint.provider)
            response = Response(
                stored.body,
                status_code=stored.status,
                media_type=JSON_TYPE,
                headers={**stored.headers, "Idempotent-Replayed": "true"},
            )
            return Outcome(response, items=len(call.inputs), duplicate=True)
        if call.idem_key is not None:
            self.idempotency_in_flight.add(call.idem_key)
        try:
            await self._sleep_latency(call.endpoint.provider)
            answer = self._charge(call)
        finally:
            if call.idem_key is not None:
                self.idempotency_in_flight.discard(call.idem_key)
        items, credits = len(call.inputs), answer.credits
        if call.fault in CHARGED_FAULTS:
            assert call.fault is not None
            self.ledger.note_fault(call.fault)
            response = await self._charged_failure(call.fault, answer.body)
            return Outcome(
                response, charged=True, items=items, unanswered=call.fault, credits=credits
            )
        response = Response(answer.body, media_type=JSON_TYPE, headers=answer.headers)
        return Outcome(response, charged=True, items=items, credits=credits)

    async def _charged_failure(self, fault: str, body: bytes) -> Response:
        """How a charged call's answer ``body`` fails to reach the client under ``fault``."""
        if fault == "500_after_charge":
            return error_response(500, "injected fault: internal error after the charge")
        if fault == "drop_after_charge":
            return DroppedResponse(body, media_type=JSON_TYPE)
        if fault == "timeout_after_charge":
            await asyncio.sleep(self.config.timeout_sleep_s)
            return error_response(504, "injected fault: timed out after the charge")
        return Response(b'{"email": "trunc\x00<html>502 Bad Gateway', media_type=JSON_TYPE)

    def _charge(self, call: _Call) -> _Answer:
        """Compute the answer, bill it in the ledger and store it for replays."""
        endpoint = call.endpoint
        rate = self.config.hit_rate_for(endpoint.provider)
        results = [self._answer(endpoint, item, rate) for item in call.inputs]
        free = self._already_enriched(call, results)
        bill = endpoint.bill(call.inputs, results, free)
        body = json.dumps(endpoint.body(call.inputs, results, free), separators=(",", ":"))
        headers = {endpoint.charged_header: f"{bill.net:g}"} if endpoint.charged_header else {}
        items: tuple[bytes, ...] = ()
        if endpoint.company_items:
            items = tuple(fake_data.digest("company", item) for item in call.inputs)
        self.ledger.charge(
            Charge(
                endpoint.provider,
                endpoint.path,
                call.request_digest,
                items,
                len(call.inputs),
                bill,
            )
        )
        encoded = body.encode()
        if call.idem_key is not None:
            self.idempotency[call.idem_key] = StoredResponse(
                call.request_digest, 200, encoded, headers
            )
        return _Answer(encoded, headers, bill.net)

    def _answer(self, endpoint: Endpoint, item: Mapping[str, str], rate: float) -> Any:
        """One input's answer at the configured epoch (``epochs``), noting whether it
        differs from epoch 0's."""
        base = endpoint.compute(item, rate)
        epoch, fraction = self.config.answer_epoch, self.config.changed_fraction
        key = epochs.input_key(item)
        if not epochs.drifts(endpoint.path, item, epoch, fraction):
            self.drifted.get(endpoint.path, {}).pop(key, None)
            return base
        answer = epochs.drifted_answer(endpoint.path, item, base, epoch)
        seen = self.drifted.setdefault(endpoint.path, {})
        seen[key] = {"input": dict(item), "old": base, "new": answer, "epoch": epoch}
        return answer

    def _already_enriched(self, call: _Call, results: Sequence[Any]) -> list[bool]:
        """Per input, whether this account was billed for the matched record before
        (then it is free); marks the new matches as billed."""
        record = call.endpoint.account_dedupe
        if record is None:
            return [False] * len(results)
        free = []
        for item, result in zip(call.inputs, results, strict=True):
            key = (call.endpoint.provider, call.key, record(item))
            free.append(result is not None and key in self.enriched)
            if result is not None:
                self.enriched.add(key)
        return free

    # -- asynchronous jobs (see ``jobs``) ----------------------------------------

    async def handle_job(self, request: Request, route: JobRoute) -> Response:
        """Serve a job submit or status poll: auth, the limits of ``route.limit_key``,
        then the job engine; recorded in the ledger like any provider request.

        A submit's job counts as charged for the faults: ``*_after_charge`` creates
        the job, then breaks the answer (``submits_unanswered``, as for a client gone).
        """
        provider = route.shape.provider
        self.ledger.enter(provider)
        outcome = Outcome(error_response(500, "internal error"))
        scope: tuple[str, str] | None = None
        created = False
        try:
            key = self._authenticate(request, provider)
            if isinstance(key, Response):
                outcome = Outcome(key)
            else:
                scope = (route.limit_key, key_digest(key))
                self.key_in_flight[scope] += 1
                in_flight = sum(n for (p, _), n in self.key_in_flight.items() if p == scope[0])
                api_key = key
                answer: list[bool] = []
                outcome = await self._process(
                    route.limit_key,
                    in_flight,
                    scope,
                    lambda: self._job_pipeline(request, route, api_key, answer),
                )
                created = bool(answer)
            if not outcome.unanswered and await request.is_disconnected():
                outcome.unanswered = "client_gone"
        finally:
            self.ledger.leave(provider)
            if scope is not None:
                self.key_in_flight[scope] -= 1
            if created and outcome.unanswered:
                self.jobs.note_unanswered(route.shape)
            self.ledger.record(
                provider,
                route.path,
                outcome.response.status_code,
                False,
                outcome.items,
                False,
                scope[1] if scope else "",
                "",
                outcome.unanswered,
            )
        return outcome.response

    async def _job_pipeline(
        self, request: Request, route: JobRoute, key: str, created: list[bool]
    ) -> Outcome:
        shape, account = route.shape, key_digest(key)
        if route.kind == "status":
            await self._sleep_latency(route.limit_key)
            status, body = self.jobs.status(shape, account, request.path_params["job_id"])
            return Outcome(JSONResponse(body, status_code=status))
        try:
            submission = shape.parse(json.loads(await request.body()))
        except (ValueError, UnicodeDecodeError):
            self.ledger.tally.invalid += 1
            return Outcome(JSONResponse(shape.error("body is not valid JSON"), status_code=422))
        except JobBadRequest as err:
            self.ledger.tally.invalid += 1
            return Outcome(JSONResponse(err.body, status_code=422))
        fault = self._pick_fault()
        failed = await self._uncharged_fault(fault, shape.provider)
        if failed is not None:
            return Outcome(failed)
        await self._sleep_latency(shape.provider)
        wait = self.jobs.queue_wait(shape, account)  # no await from here to create()
        if wait is not None:
            cap = self.config.job_queue_for(shape.provider)
            return Outcome(self._too_many(shape.provider, wait, f"{cap} unfinished jobs"))
        job = self.jobs.create(shape, account, key, submission)
        created.append(True)
        items = len(job.members)
        body = json.dumps(self.jobs.accepted(job), separators=(",", ":")).encode()
        if fault in CHARGED_FAULTS:
            assert fault is not None
            self.ledger.note_fault(fault)
            response = await self._charged_failure(fault, body)
            return Outcome(response, items=items, unanswered=fault)
        return Outcome(Response(body, media_type=JSON_TYPE), items=items)

    # -- balances (see ``balances``) ------------------------------------------

    async def handle_balance(self, request: Request, route: BalanceRoute) -> Response:
        """The provider's balance: its starting balance less what the ledger billed.

        Authenticated like its calls; free, never rate-limited, and not a call (the
        ledger counts it in ``balance_reads_by_provider`` only)."""
        key = self._authenticate(request, route.provider)
        if isinstance(key, Response):
            return key
        started = self.config.balance_for(route.provider)
        used = self.ledger.used(route.provider)
        self.ledger.note_balance_read(route.provider)
        return JSONResponse(route.shape(started - used, used, started))

    # -- admin ----------------------------------------------------------------

    async def admin_ledger(self, request: Request) -> Response:
        return JSONResponse(self.ledger.snapshot())

    async def admin_calls(self, request: Request) -> Response:
        try:
            since = float(request.query_params.get("since", "0"))
            limit_text = request.query_params.get("limit")
            limit = int(limit_text) if limit_text is not None else None
        except ValueError:
            return error_response(422, "since must be a number and limit an integer")
        calls = self.ledger.calls_since(since, limit)
        return JSONResponse({"now": time.monotonic(), "calls": calls})

    async def admin_changed(self, request: Request) -> Response:
        """The inputs whose latest answer differed from epoch 0's, per endpoint path,
        each ``{"input", "old", "new", "epoch"}``, in input order."""
        changed = {
            path: [found[key] for key in sorted(found)]
            for path, found in sorted(self.drifted.items())
            if found
        }
        return JSONResponse({"epoch": self.config.answer_epoch, "changed": changed})

    async def admin_reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse({"reset": True})

    async def admin_get_config(self, request: Request) -> Response:
        return JSONResponse(self.config.public_dump())

    async def admin_post_config(self, request: Request) -> Response:
        try:
            changes = json.loads(await request.body() or b"{}")
            if not isinstance(changes, dict):
                raise ValueError("config changes must be a JSON object")
            new = self.config.merged(changes)
        except ValueError as err:  # includes pydantic.ValidationError and bad JSON
            return error_response(422, f"invalid config change: {err}")
        self.apply_config(new)
        return JSONResponse(self.config.public_dump())


class _Conflict(Exception):
    """The same Idempotency-Key is being processed right now (rendered as 409)."""


async def _healthz(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return error_response(status, f"{detail}: {request.method} {request.url.path}")


def _provider_route(server: ProviderServer, endpoint: Endpoint) -> Route:
    async def endpoint_fn(request: Request) -> Response:
        return await server.handle(request, endpoint)

    return Route(endpoint.path, endpoint_fn, methods=[endpoint.method], name=endpoint.path)


def _job_route(server: ProviderServer, route: JobRoute) -> Route:
    async def endpoint_fn(request: Request) -> Response:
        return await server.handle_job(request, route)

    return Route(route.path, endpoint_fn, methods=[route.method], name=route.path)


def _balance_route(server: ProviderServer, route: BalanceRoute) -> Route:
    async def endpoint_fn(request: Request) -> Response:
        return await server.handle_balance(request, route)

    return Route(route.path, endpoint_fn, methods=["GET"], name=route.path)


def create_app(config: ServerConfig | None = None) -> Starlette:
    """The ASGI app; its ``ProviderServer`` state is ``app.state.provider_server``."""
    server = ProviderServer(config)
    _install_quiet_drops()
    routes = [_provider_route(server, ep) for ep in ENDPOINTS]
    routes += [_job_route(server, route) for route in JOB_ROUTES]
    routes += [_balance_route(server, route) for route in BALANCE_ROUTES]
    routes += crm_routes()  # the CRM mode (sinks): see crm.py
    routes += [
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/_admin/ledger", server.admin_ledger, methods=["GET"]),
        Route("/_admin/calls", server.admin_calls, methods=["GET"]),
        Route("/_admin/changed", server.admin_changed, methods=["GET"]),
        Route("/_admin/reset", server.admin_reset, methods=["POST"]),
        Route("/_admin/config", server.admin_get_config, methods=["GET"]),
        Route("/_admin/config", server.admin_post_config, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.provider_server = server
    return app
