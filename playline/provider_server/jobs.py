"""Asynchronous job providers of the local provider server: submit, then poll or webhook.

Two vendors take their work as *jobs*, in their documented shapes: the submit answers
at once with the job's id, each contact finishes on its own some seconds later, and
the result is read by polling the job or received on a webhook when it finishes.

Each vendor is served in its current API, the one the presets use, and in the legacy
one the older tests were written for:

* **FullEnrich API v2** (``FULLENRICH_V2``): ``POST /fullenrich/api/v2/contact/enrich/bulk``
  with ``{"name", "webhook_url"?, "data": [{"first_name", "last_name", "domain"?,
  "company_name"?, "linkedin_url"?, "enrich_fields", "custom"?}]}``, ``enrich_fields``
  among ``contact.work_emails``, ``contact.personal_emails``, ``contact.phones``; ``GET
  /fullenrich/api/v2/contact/enrich/bulk/{enrichment_id}`` answers ``{"id", "name",
  "status", "data": [{"input", "custom", "contact_info": {"most_probable_work_email":
  {"email", "status"}, "work_emails", "most_probable_personal_email",
  "personal_emails", "most_probable_phone", "phones"}}], "cost": {"credits"}}``. Billing,
  webhook and signature as v1 below. Where v2 answers a running enrichment with a 400
  ``error.enrichment.in_progress`` (unless ``forceResults``), this copy answers 200 with
  its progress, as v1 does: the preset's ``poll_pending_status`` covers the documented
  answer, checked against the contract server (``tests/contracts/fullenrich.toml``).
* **Dropcontact** ``/v1/enrich/all`` (``DROPCONTACT_ENRICH``): ``POST
  /dropcontact/v1/enrich/all`` and ``GET /dropcontact/v1/enrich/all/{request_id}``, the
  bodies and answers of ``/batch`` below, but billed as the current API is: a credit per
  record taken at the submit (``credits_left`` drops at once), refunded when the job
  finishes for each record without an email (the ledger counts the refunds).
* the legacy **FullEnrich v1** and Dropcontact ``/batch``, described below.

**FullEnrich** (``fullenrich``, ``Authorization: Bearer``; API v1)

* ``POST /fullenrich/api/v1/contact/enrich/bulk`` with ``{"name", "webhook_url"?,
  "datas": [{"firstname", "lastname", "domain"?, "company_name"?, "linkedin_url"?,
  "enrich_fields"?, "custom"?}]}``, 1 to 100 contacts, each named by first and last
  name and a company (``domain`` or ``company_name``) or by ``linkedin_url``;
  ``enrich_fields`` among ``contact.emails`` (the default), ``contact.personal_emails``
  and ``contact.phones``; ``custom`` an object of strings, echoed back. Answers
  ``{"enrichment_id": "<uuid>"}``.
* ``GET /fullenrich/api/v1/contact/enrich/bulk/{enrichment_id}``: ``{"id", "name",
  "status", "datas", "cost": {"credits"}}``; ``status`` is ``CREATED`` until the job
  starts, ``IN_PROGRESS``, then ``FINISHED`` (``CANCELED`` exists in the docs and is
  never produced here); ``datas`` lists the contacts finished so far, in submit order,
  each ``{"custom", "contact": {"most_probable_email", "emails": [{"email",
  "status"}], "phones": [{"number", "region"}], ...}}``, and ``cost.credits`` what
  they were billed. An unknown id, or another account's, is a 404.
* Billing, per contact as it finishes: 1 credit for a work email, 3 for a personal
  email, 10 for a phone, each only if asked for and found; nothing found costs 0.
* Webhook: when the job finishes, its final GET body is POSTed to ``webhook_url``
  with ``X-Signature-SHA1``: the lowercase hex HMAC-SHA1 of the raw body, keyed with
  ``webhook_secret["fullenrich"]``, or else with the API key the job was submitted
  with (as FullEnrich signs). There is no delivery id.

**Dropcontact** (``dropcontact``, ``X-Access-Token``; the ``/batch`` API)

* ``POST /dropcontact/batch`` with ``{"data": [{"first_name", "last_name",
  "website"?, "company"?, "full_name"?, "email"?, "linkedin"?, "custom_fields"?, ...}],
  "siren"?, "language"?, "custom_callback_url"?}``, 1 to 250 records (string fields,
  ``custom_fields`` an object). Answers ``{"success": true, "request_id", "error":
  false, "credits_left"}`` (from ``DROPCONTACT_CREDITS`` less what the account spent).
* ``GET /dropcontact/batch/{request_id}``: while the job runs ``{"success": false,
  "reason": "Request not ready yet, try again in 30 seconds", "error": false}``
  (a 200); once done ``{"success": true, "error": false, "data": [...]}``, one record
  per submitted record in order, the input echoed and ``email``: ``[{"email",
  "qualification"}]`` when found (absent otherwise). An unknown id is a 404 ``{"error":
  true, ...}``.
* Billing: 1 credit per record with an email found, charged when the job finishes.
* Callback: the done body is POSTed to ``custom_callback_url``, unsigned (the
  per-request URL is the secret).

**Both**: a contact finishes at a time drawn from ``job_latency_s[provider]`` by a
digest of its input (the same input always takes the same time), and a job finishes
with its last contact. While ``job_stuck[provider]`` is set none of its contacts
finish, and a contact whose last name is in ``job_stuck_last_names`` never does:
its job stays in progress (the other contacts go on). Clearing either lets them
finish. An account has at most ``job_queue[provider]`` unfinished jobs; one more
submit is a 429 with ``Retry-After`` (the time until its first job should end). A
failed webhook delivery (non-2xx, or no answer) is retried up to ``WEBHOOK_RETRIES``
times, ``webhook_retry_s`` apart; ``webhook_drop`` drops the next deliveries
(counted as sent, never sent) and ``webhook_duplicates`` sends each one N times.
``Idempotency-Key`` is ignored: every submit creates a new job. Submits go through
the provider's rate limits and injected faults (a ``*_after_charge`` fault creates the
job and then breaks the answer: the client cannot tell whether a job exists); status
polls are limited under ``"<provider>:poll"``. Whether a contact is found follows
``hit_rates`` (taken when the job is submitted) through :mod:`fake_data`
(``fullenrich_contact``, ``dropcontact_record``), so tests compute every answer.

Where this differs from the vendors' docs, on purpose: FullEnrich does not charge
again for a contact it enriched for the account in the last 3 months (here every
finished contact is billed: the worst case for a client), and answers bad input with
400 (422 here); Dropcontact answers a bad submit with 400 (422 here) and an unknown
``request_id`` like one not ready (a 404 here, so a client cannot poll one forever).

Sources: https://docs.fullenrich.com/api/v1/contact/enrich/bulk/post.md,
https://docs.fullenrich.com/api/v1/contact/enrich/bulk/get.md,
https://docs.fullenrich.com/api/v2/general/webhooks (signature header, retries),
https://docs.fullenrich.com/credit (billing), https://developer.dropcontact.io/
(``/batch``, ``X-Access-Token``, email qualifications),
https://developer.dropcontact.com/en/errors/ (not-ready answer, the 250 records limit).

Everything runs in the server's event loop: each job is a task that finishes its
contacts when they are due, and each webhook delivery is a task that POSTs with an
``httpx.AsyncClient``; ``reset`` cancels them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import string
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from playline.provider_server import fake_data
from playline.provider_server.config import ServerConfig
from playline.provider_server.ledger import Bill, Charge, Ledger

__all__ = [
    "DROPCONTACT",
    "DROPCONTACT_ENRICH",
    "FULLENRICH",
    "FULLENRICH_V2",
    "JOB_ROUTES",
    "Job",
    "JobBadRequest",
    "JobEngine",
    "JobRoute",
    "JobShape",
]

logger = logging.getLogger(__name__)

#: How many times a failed delivery is tried again (FullEnrich: "up to 5 times").
WEBHOOK_RETRIES = 5
WEBHOOK_TIMEOUT_S = 10.0
FULLENRICH_SIGNATURE_HEADER = "X-Signature-SHA1"
FULLENRICH_MAX_CONTACTS = 100
DROPCONTACT_MAX_RECORDS = 250
DROPCONTACT_NOT_READY = "Request not ready yet, try again in 30 seconds"
#: A Dropcontact account's balance before it spends anything (``credits_left``).
DROPCONTACT_CREDITS = 10_000.0
#: What ``/v1/enrich/all`` takes per record at submit (refunded on a miss).
DROPCONTACT_CREDIT_PER_RECORD = 1.0

_URL_SCHEMES = ("http://", "https://")


class JobBadRequest(Exception):
    """A submit the provider refuses; rendered as a 422 with ``body``."""

    def __init__(self, message: str, body: Any) -> None:
        super().__init__(message)
        self.body = body


@dataclass
class Submission:
    """A validated submit: the job's name, webhook, members and options."""

    name: str
    webhook_url: str | None
    items: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Member:
    """One contact of a job."""

    index: int
    item: dict[str, Any]
    #: digest of what the contact is (its input without the echoed custom fields)
    key: bytes
    #: seconds after the job's creation at which it finishes
    offset_s: float
    last_name: str
    result: Any = None
    credits: float = 0.0
    done: bool = False


@dataclass
class Job:
    """One submitted job and its progress."""

    id: str
    shape: JobShape
    account: str
    api_key: str
    name: str
    webhook_url: str | None
    options: dict[str, Any]
    members: list[Member]
    hit_rate: float
    created_at: float
    started: bool = False
    finished: bool = False
    credits: float = 0.0


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _unit(raw: bytes) -> float:
    return int.from_bytes(raw[:4], "big") / 2**32


def _is_url(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(_URL_SCHEMES) and len(value) > 8


class JobShape:
    """One vendor's job API: its paths, what it accepts, what it answers and bills."""

    provider: str
    submit_path: str
    status_path: str
    max_items: int
    #: True: each contact is billed as it finishes; False: all when the job finishes
    bill_per_member: bool

    def error(self, message: str) -> Any:
        return {"error": message}

    def bad(self, message: str) -> JobBadRequest:
        return JobBadRequest(message, self.error(message))

    def not_found(self, job_id: str) -> Any:
        return {"error": f"no job {job_id!r} for this account"}

    def new_id(self) -> str:
        return str(uuid.uuid4())

    def parse(self, body: Any) -> Submission:
        raise NotImplementedError

    def member_key(self, item: Mapping[str, Any]) -> bytes:
        raise NotImplementedError

    def last_name(self, item: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def compute(self, item: Mapping[str, Any], job: Job) -> tuple[Any, float]:
        """One member's result and what it costs."""
        raise NotImplementedError

    def refund(self, member: Member) -> float:
        """What the provider gives back of a finished member's charge (refund on miss)."""
        return 0.0

    def charged_at_submit(self, items: int) -> float:
        """What the submit takes from the balance at once (``credits_left``), before the
        job bills (and refunds) its members."""
        return 0.0

    def accepted(self, job: Job, credits_left: float) -> Any:
        raise NotImplementedError

    def status(self, job: Job) -> Any:
        raise NotImplementedError

    def status_code(self, job: Job) -> int:
        """The HTTP status of a poll's answer."""
        return 200

    def final(self, job: Job) -> Any:
        """The webhook's body once ``job`` finished."""
        return self.status(job)

    def signature(self, raw: bytes, secret: str) -> dict[str, str]:
        """The headers that sign a webhook body (none: unsigned)."""
        return {}

    def _items(self, body: Any, field_name: str) -> list[Any]:
        items = body.get(field_name) if isinstance(body, Mapping) else None
        if not isinstance(items, list) or not items:
            raise self.bad(f'body must be {{"{field_name}": [...]}} with at least one item')
        if len(items) > self.max_items:
            raise self.bad(f"too many items: {len(items)} > {self.max_items}")
        return items


class FullEnrichShape(JobShape):
    provider = "fullenrich"
    submit_path = "/fullenrich/api/v1/contact/enrich/bulk"
    status_path = "/fullenrich/api/v1/contact/enrich/bulk/{job_id}"
    max_items = FULLENRICH_MAX_CONTACTS
    bill_per_member = True
    #: the key holding the contacts, in a submitted body and a job's status alike
    items_field = "datas"

    def parse(self, body: Any) -> Submission:
        if not isinstance(body, Mapping):
            raise self.bad("body must be a JSON object")
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise self.bad("'name' is required and must be a non-empty string")
        webhook = body.get("webhook_url")
        if webhook is not None and not _is_url(webhook):
            raise self.bad("'webhook_url' must be an http(s) URL")
        items = self._items(body, self.items_field)
        return Submission(name, webhook, [self._checked(c, i) for i, c in enumerate(items)])

    def _checked(self, contact: Any, index: int) -> dict[str, Any]:
        """One submitted contact, checked as this API version defines it."""
        return self._contact(contact, index)

    def _contact(self, contact: Any, index: int) -> dict[str, Any]:
        where = f"datas[{index}]"
        if not isinstance(contact, Mapping):
            raise self.bad(f"{where} must be a JSON object")
        for name in fake_data.FULLENRICH_IDENTITY:
            if contact.get(name) is not None and not isinstance(contact[name], str):
                raise self.bad(f"{where}.{name} must be a string")
        named = contact.get("firstname") and contact.get("lastname")
        company = contact.get("domain") or contact.get("company_name")
        if not (named and company) and not contact.get("linkedin_url"):
            raise self.bad(
                f"{where} needs firstname, lastname and a domain or company_name, or a linkedin_url"
            )
        fields = contact.get("enrich_fields")
        if fields is not None and (
            not isinstance(fields, list)
            or not fields
            or any(f not in fake_data.FULLENRICH_FIELD_CREDITS for f in fields)
        ):
            raise self.bad(
                f"{where}.enrich_fields must be a non-empty list of "
                f"{sorted(fake_data.FULLENRICH_FIELD_CREDITS)}"
            )
        custom = contact.get("custom")
        if custom is not None and (
            not isinstance(custom, Mapping) or not all(isinstance(v, str) for v in custom.values())
        ):
            raise self.bad(f"{where}.custom must be an object of string values")
        return dict(contact)

    def member_key(self, item: Mapping[str, Any]) -> bytes:
        fields = sorted(item.get("enrich_fields") or ["contact.emails"])
        identity = {**fake_data.fullenrich_identity(item), "enrich_fields": fields}
        return fake_data.digest("fullenrich-member", identity)

    def last_name(self, item: Mapping[str, Any]) -> str:
        return str(item.get("lastname") or "")

    def compute(self, item: Mapping[str, Any], job: Job) -> tuple[Any, float]:
        contact = fake_data.fullenrich_contact(item, job.hit_rate)
        result = {"custom": dict(item.get("custom") or {}), "contact": contact}
        return result, fake_data.fullenrich_credits(contact)

    def accepted(self, job: Job, credits_left: float) -> Any:
        return {"enrichment_id": job.id}

    def status(self, job: Job) -> Any:
        state = "FINISHED" if job.finished else "IN_PROGRESS" if job.started else "CREATED"
        return {
            "id": job.id,
            "name": job.name,
            "status": state,
            self.items_field: [m.result for m in job.members if m.done],
            "cost": {"credits": _number(job.credits)},
        }

    def signature(self, raw: bytes, secret: str) -> dict[str, str]:
        digest = hmac.new(secret.encode(), raw, hashlib.sha1).hexdigest()
        return {FULLENRICH_SIGNATURE_HEADER: digest}


class DropcontactShape(JobShape):
    provider = "dropcontact"
    submit_path = "/dropcontact/batch"
    status_path = "/dropcontact/batch/{job_id}"
    max_items = DROPCONTACT_MAX_RECORDS
    bill_per_member = False

    def error(self, message: str) -> Any:
        return {"error": True, "reason": message, "success": False}

    def not_found(self, job_id: str) -> Any:
        return self.error(f"Request {job_id!r} not found")

    def new_id(self) -> str:
        return "".join(secrets.choice(string.ascii_lowercase) for _ in range(16))

    def parse(self, body: Any) -> Submission:
        if not isinstance(body, Mapping):
            raise self.bad("body must be a JSON object")
        items = body.get("data")
        if isinstance(items, list) and len(items) > self.max_items:
            raise self.bad(f"Too many records, you can only submit up to {self.max_items} records")
        if not isinstance(items, list) or not items:
            raise self.bad("Missing data in JSON")
        callback = body.get("custom_callback_url")
        if callback is not None and not _is_url(callback):
            raise self.bad("custom_callback_url must be an http(s) URL")
        siren = body.get("siren", False)
        language = body.get("language", "en")
        if not isinstance(siren, bool) or not isinstance(language, str):
            raise self.bad("siren must be a boolean and language a string")
        records = [self._record(r, i) for i, r in enumerate(items)]
        return Submission("", callback, records, {"siren": siren, "language": language})

    def _record(self, record: Any, index: int) -> dict[str, Any]:
        where = f"data[{index}]"
        if not isinstance(record, Mapping):
            raise self.bad(f"{where} must be a JSON object")
        for name, value in record.items():
            expected = Mapping if name == "custom_fields" else str
            if value is not None and not isinstance(value, expected):
                what = "an object" if name == "custom_fields" else "a string"
                raise self.bad(f"{where}.{name} must be {what}")
        named = record.get("first_name") and record.get("last_name")
        if not (named or any(record.get(k) for k in ("full_name", "email", "linkedin"))):
            raise self.bad(
                f"{where} needs first_name and last_name, or full_name, email or linkedin"
            )
        return dict(record)

    def member_key(self, item: Mapping[str, Any]) -> bytes:
        return fake_data.digest("dropcontact-member", fake_data.dropcontact_identity(item))

    def last_name(self, item: Mapping[str, Any]) -> str:
        names = str(item.get("full_name") or "").split()
        return str(item.get("last_name") or (names[-1] if names else ""))

    def compute(self, item: Mapping[str, Any], job: Job) -> tuple[Any, float]:
        record = fake_data.dropcontact_record(item, job.hit_rate, bool(job.options.get("siren")))
        return record, fake_data.dropcontact_credits(record)

    def accepted(self, job: Job, credits_left: float) -> Any:
        return {
            "success": True,
            "request_id": job.id,
            "error": False,
            "credits_left": _number(credits_left),
        }

    def status(self, job: Job) -> Any:
        if not job.finished:
            return {"success": False, "reason": DROPCONTACT_NOT_READY, "error": False}
        return {"success": True, "error": False, "data": [m.result for m in job.members]}


#: FullEnrich API v2 ``enrich_fields`` and the v1 ones the fake data is computed by.
FULLENRICH_V2_FIELDS = {
    "contact.work_emails": "contact.emails",
    "contact.personal_emails": "contact.personal_emails",
    "contact.phones": "contact.phones",
}
#: FullEnrich API v2 contact fields and their v1 names.
FULLENRICH_V2_IDENTITY = {
    "first_name": "firstname",
    "last_name": "lastname",
    "domain": "domain",
    "company_name": "company_name",
    "linkedin_url": "linkedin_url",
}


class FullEnrichV2Shape(FullEnrichShape):
    """FullEnrich's current API (v2): ``data``, ``first_name``/``last_name``, and each
    result's ``contact_info`` (``most_probable_work_email: {email, status}``, ...)."""

    submit_path = "/fullenrich/api/v2/contact/enrich/bulk"
    status_path = "/fullenrich/api/v2/contact/enrich/bulk/{job_id}"

    items_field = "data"

    def _checked(self, contact: Any, index: int) -> dict[str, Any]:
        """The contact, checked as v2 defines it, kept in its v2 form."""
        where = f"data[{index}]"
        if not isinstance(contact, Mapping):
            raise self.bad(f"{where} must be a JSON object")
        fields = contact.get("enrich_fields")
        if (
            not isinstance(fields, list)
            or not fields
            or any(f not in FULLENRICH_V2_FIELDS for f in fields)
        ):
            raise self.bad(
                f"{where}.enrich_fields must be a non-empty list of {sorted(FULLENRICH_V2_FIELDS)}"
            )
        unknown = set(contact) - set(FULLENRICH_V2_IDENTITY) - {"enrich_fields", "custom"}
        if unknown:
            raise self.bad(f"{where} has unknown fields {sorted(unknown)}")
        # The checks of a contact (names, company or LinkedIn URL, custom) are v1's.
        self._contact(self._as_v1(contact), index)
        return dict(contact)

    @staticmethod
    def _as_v1(item: Mapping[str, Any]) -> dict[str, Any]:
        v1: dict[str, Any] = {
            FULLENRICH_V2_IDENTITY[k]: v for k, v in item.items() if k in FULLENRICH_V2_IDENTITY
        }
        if item.get("enrich_fields") is not None:
            v1["enrich_fields"] = [FULLENRICH_V2_FIELDS.get(f, f) for f in item["enrich_fields"]]
        if item.get("custom") is not None:
            v1["custom"] = item["custom"]
        return v1

    def member_key(self, item: Mapping[str, Any]) -> bytes:
        return super().member_key(self._as_v1(item))

    def last_name(self, item: Mapping[str, Any]) -> str:
        return str(item.get("last_name") or "")

    def compute(self, item: Mapping[str, Any], job: Job) -> tuple[Any, float]:
        contact = fake_data.fullenrich_contact(self._as_v1(item), job.hit_rate)
        return (
            {
                "input": {k: v for k, v in item.items() if k in FULLENRICH_V2_IDENTITY},
                "custom": dict(item.get("custom") or {}),
                "contact_info": fullenrich_contact_info(contact),
            },
            fake_data.fullenrich_credits(contact),
        )


def fullenrich_contact_info(contact: Mapping[str, Any]) -> dict[str, Any]:
    """A v1 ``contact`` (as :func:`fake_data.fullenrich_contact` computes it) in v2's
    ``contact_info`` shape."""
    emails = list(contact.get("emails") or [])
    personal = list(contact.get("personal_emails") or [])
    phones = [
        {"number": p["number"], "region": p.get("region")} for p in contact.get("phones") or []
    ]
    return {
        "most_probable_work_email": emails[0] if emails else None,
        "work_emails": emails,
        "most_probable_personal_email": personal[0] if personal else None,
        "personal_emails": personal,
        "most_probable_phone": phones[0] if phones else None,
        "phones": phones,
    }


class DropcontactEnrichShape(DropcontactShape):
    """Dropcontact's current API: ``POST /v1/enrich/all`` takes a credit per record at
    once, ``GET /v1/enrich/all/{request_id}``; a record without an email found is
    refunded when the job finishes."""

    submit_path = "/dropcontact/v1/enrich/all"
    status_path = "/dropcontact/v1/enrich/all/{job_id}"

    def compute(self, item: Mapping[str, Any], job: Job) -> tuple[Any, float]:
        record = fake_data.dropcontact_record(item, job.hit_rate, bool(job.options.get("siren")))
        return record, DROPCONTACT_CREDIT_PER_RECORD

    def refund(self, member: Member) -> float:
        found = isinstance(member.result, Mapping) and member.result.get("email")
        return 0.0 if found else member.credits

    def charged_at_submit(self, items: int) -> float:
        return DROPCONTACT_CREDIT_PER_RECORD * items


FULLENRICH = FullEnrichShape()
FULLENRICH_V2 = FullEnrichV2Shape()
DROPCONTACT = DropcontactShape()
DROPCONTACT_ENRICH = DropcontactEnrichShape()


@dataclass(frozen=True)
class JobRoute:
    """One job endpoint: a shape's submit or status path."""

    shape: JobShape
    kind: Literal["submit", "status"]

    @property
    def path(self) -> str:
        return self.shape.submit_path if self.kind == "submit" else self.shape.status_path

    @property
    def method(self) -> str:
        return "POST" if self.kind == "submit" else "GET"

    @property
    def limit_key(self) -> str:
        """The rate-limit key: the provider for submits, ``"<provider>:poll"`` for polls."""
        provider = self.shape.provider
        return provider if self.kind == "submit" else f"{provider}:poll"


JOB_ROUTES: tuple[JobRoute, ...] = tuple(
    JobRoute(shape, kind)
    for shape in (FULLENRICH_V2, DROPCONTACT_ENRICH, FULLENRICH, DROPCONTACT)
    for kind in ("submit", "status")
)


class JobEngine:
    """The jobs of every job provider, their progress, charges and webhooks."""

    def __init__(self, config: Callable[[], ServerConfig], ledger: Ledger) -> None:
        self._config = config
        self.ledger = ledger
        self.jobs: dict[tuple[str, str], Job] = {}
        self._unfinished: dict[tuple[str, str], set[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._submitted: set[tuple[str, bytes]] = set()
        self._contents: set[tuple[str, bytes]] = set()
        self._spent: dict[tuple[str, str], float] = {}
        self._changed = asyncio.Event()

    # -- state ----------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every job; cancel their progress and pending webhook deliveries."""
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        self.jobs.clear()
        self._unfinished.clear()
        self._submitted.clear()
        self._contents.clear()
        self._spent.clear()
        self.config_changed()

    def config_changed(self) -> None:
        """Wake the jobs waiting on a knob (``job_stuck``, ``job_stuck_last_names``)."""
        self._changed.set()
        self._changed = asyncio.Event()

    # -- the endpoints' steps ----------------------------------------------------------

    def queue_wait(self, shape: JobShape, account: str) -> float | None:
        """None if ``account`` may have one more job, else the wait for ``Retry-After``."""
        config = self._config()
        unfinished = self._unfinished.get((shape.provider, account), set())
        if len(unfinished) < config.job_queue_for(shape.provider):
            return None
        now = time.monotonic()
        ends = []
        for job_id in unfinished:
            job = self.jobs[(shape.provider, job_id)]
            ends.append(job.created_at + max(m.offset_s for m in job.members) - now)
        wait = min(ends, default=0.0)
        return wait if wait > 0 else max(1.0, config.job_latency_for(shape.provider)[1])

    def create(self, shape: JobShape, account: str, api_key: str, submission: Submission) -> Job:
        """Record a new job and start it (synchronous: call it right after ``queue_wait``)."""
        config = self._config()
        provider = shape.provider
        low, high = config.job_latency_for(provider)
        members = []
        for index, item in enumerate(submission.items):
            key = shape.member_key(item)
            offset = low + (high - low) * _unit(fake_data.digest("job-latency", key.hex()))
            members.append(Member(index, item, key, offset, shape.last_name(item)))
            if (provider, key) in self._submitted:
                self.ledger.note_job(provider, "duplicate_submits")
            self._submitted.add((provider, key))
        job = Job(
            id=shape.new_id(),
            shape=shape,
            account=account,
            api_key=api_key,
            name=submission.name,
            webhook_url=submission.webhook_url,
            options=submission.options,
            members=members,
            hit_rate=config.hit_rate_for(provider),
            created_at=time.monotonic(),
        )
        content = hashlib.sha256(b"".join(m.key for m in members))
        content.update(fake_data.canonical_json(submission.options).encode())
        if (provider, content.digest()) not in self._contents:
            self._contents.add((provider, content.digest()))
            self.ledger.note_job(provider, "jobs")
        self.ledger.note_job(provider, "job_submits")
        self.ledger.note_job(provider, "job_members", len(members))
        upfront = shape.charged_at_submit(len(members))
        if upfront:
            spent = self._spent.get((provider, account), 0.0)
            self._spent[(provider, account)] = spent + upfront
        self.jobs[(provider, job.id)] = job
        self._unfinished.setdefault((provider, account), set()).add(job.id)
        self._spawn(self._run(job))
        return job

    def accepted(self, job: Job) -> Any:
        """The submit's answer for ``job``."""
        left = DROPCONTACT_CREDITS - self._spent.get((job.shape.provider, job.account), 0.0)
        return job.shape.accepted(job, max(0.0, left))

    def status(self, shape: JobShape, account: str, job_id: str) -> tuple[int, Any]:
        """A poll's status code and body."""
        self.ledger.note_job(shape.provider, "polls")
        job = self.jobs.get((shape.provider, job_id))
        if job is None or job.account != account or job.shape is not shape:
            return 404, shape.not_found(job_id)
        return shape.status_code(job), shape.status(job)

    def note_unanswered(self, shape: JobShape) -> None:
        """A submit created its job, but the client got no usable answer."""
        self.ledger.note_job(shape.provider, "submits_unanswered")

    # -- progress ------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a provider job task failed", exc_info=task.exception())

    def _stuck(self, job: Job, member: Member) -> bool:
        config = self._config()
        if config.job_stuck.get(job.shape.provider, False):
            return True
        name = member.last_name.strip().lower()
        return any(name == stuck.strip().lower() for stuck in config.job_stuck_last_names)

    async def _run(self, job: Job) -> None:
        """Finish each contact when it is due (and not stuck), then the job."""
        job.started = True
        pending = sorted(job.members, key=lambda m: m.offset_s)
        while pending:
            changed = self._changed
            now = time.monotonic()
            waits = []
            for member in pending:
                if self._stuck(job, member):
                    continue
                due = job.created_at + member.offset_s - now
                if due <= 0:
                    self._finish_member(job, member)
                else:
                    waits.append(due)
            pending = [m for m in pending if not m.done]
            if not pending:
                break
            with contextlib.suppress(TimeoutError):  # due, or a knob changed
                await asyncio.wait_for(changed.wait(), min(waits) if waits else None)
        self._finish_job(job)

    def _finish_member(self, job: Job, member: Member) -> None:
        member.result, member.credits = job.shape.compute(member.item, job)
        member.done = True
        if job.shape.bill_per_member:
            self._charge(job, [member])

    def _charge(self, job: Job, members: list[Member]) -> None:
        provider, shape = job.shape.provider, job.shape
        for member in members:
            refunded = shape.refund(member)
            charge = Charge(
                provider,
                shape.submit_path,
                member.key,
                bill=Bill(member.credits, refunded, 1 if refunded else 0),
            )
            self.ledger.charge(charge)
            job.credits += charge.bill.net
            spent = self._spent.get((provider, job.account), 0.0)
            # What the submit took up front is already spent: only the rest, less refunds.
            upfront = shape.charged_at_submit(1)
            self._spent[(provider, job.account)] = spent + member.credits - upfront - refunded

    def _finish_job(self, job: Job) -> None:
        if not job.shape.bill_per_member:
            self._charge(job, job.members)
        job.finished = True
        self._unfinished.get((job.shape.provider, job.account), set()).discard(job.id)
        self.ledger.note_job(job.shape.provider, "jobs_finished")
        if job.webhook_url is not None:
            self._spawn(self._deliver(job, job.webhook_url))

    # -- webhooks ------------------------------------------------------------------

    async def _deliver(self, job: Job, url: str) -> None:
        """Send ``job``'s final body to ``url``: dropped, once, or several times."""
        config = self._config()
        provider = job.shape.provider
        raw = json.dumps(job.shape.final(job), separators=(",", ":")).encode()
        secret = config.webhook_secret.get(provider) or job.api_key
        headers = {"Content-Type": "application/json", **job.shape.signature(raw, secret)}
        drops = config.webhook_drop.get(provider, 0)
        if drops > 0:
            config.webhook_drop[provider] = drops - 1  # used up, like ``fail_next``
            self.ledger.note_job(provider, "webhooks_sent")
            self.ledger.note_job(provider, "webhooks_dropped")
            return
        copies = config.webhook_duplicates.get(provider, 1)
        async with httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S, trust_env=False) as client:
            for _ in range(copies):
                await self._send(client, provider, url, raw, headers)

    async def _send(
        self,
        client: httpx.AsyncClient,
        provider: str,
        url: str,
        raw: bytes,
        headers: dict[str, str],
    ) -> None:
        """POST one copy of a delivery, retrying a failure ``WEBHOOK_RETRIES`` times."""
        for attempt in range(WEBHOOK_RETRIES + 1):
            if attempt:
                await asyncio.sleep(self._config().webhook_retry_for(provider))
            self.ledger.note_job(provider, "webhooks_sent")
            try:
                response = await client.post(url, content=raw, headers=headers)
            except httpx.HTTPError:
                delivered = False
            else:
                delivered = response.is_success
            if delivered:
                self.ledger.note_job(provider, "webhooks_delivered")
                return
            self.ledger.note_job(provider, "webhooks_failed")
        self.ledger.note_job(provider, "webhooks_abandoned")
