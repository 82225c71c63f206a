"""Deterministic fake GTM data for the local provider server.

Every value is derived from a sha256 digest of the canonical input, never from a
random generator, so the same input always yields the same output: across calls,
across server restarts and across machines. That is what lets tests compare a
replayed (idempotent) response with a fresh one byte for byte, and lets the demo
show stable results.

All functions here are pure: no I/O, no clock, no global state.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

_TITLES: tuple[tuple[str, str], ...] = (
    ("Software Engineer", "individual_contributor"),
    ("Senior Software Engineer", "senior"),
    ("Account Executive", "individual_contributor"),
    ("Sales Development Representative", "entry"),
    ("Marketing Manager", "manager"),
    ("Head of Growth", "director"),
    ("Director of Engineering", "director"),
    ("VP of Sales", "vp"),
    ("VP of Marketing", "vp"),
    ("Chief Technology Officer", "c_level"),
    ("Chief Executive Officer", "c_level"),
    ("Product Manager", "manager"),
    ("Data Analyst", "individual_contributor"),
    ("Revenue Operations Lead", "senior"),
)
_LOCATIONS: tuple[str, ...] = (
    "San Francisco, US",
    "New York, US",
    "Austin, US",
    "London, GB",
    "Berlin, DE",
    "Paris, FR",
    "Amsterdam, NL",
    "Toronto, CA",
    "Sydney, AU",
    "Singapore, SG",
    "Bangalore, IN",
    "Sao Paulo, BR",
)
_INDUSTRIES: tuple[str, ...] = (
    "Software",
    "Financial Services",
    "Healthcare",
    "E-commerce",
    "Manufacturing",
    "Marketing & Advertising",
    "Cybersecurity",
    "Logistics",
    "Education",
    "Media",
)
_COUNTRIES: tuple[str, ...] = ("US", "US", "US", "GB", "DE", "FR", "CA", "NL", "AU", "IN")
_NAME_SUFFIXES: tuple[str, ...] = ("", " Inc", " Labs", " Group", " Technologies", " HQ")

_NOT_LOCAL_PART = re.compile(r"[^a-z0-9-]")


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a value: sorted keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(kind: str, value: Any) -> bytes:
    """The sha256 digest of ``kind`` and the canonical JSON of ``value``."""
    return hashlib.sha256(f"{kind}\n{canonical_json(value)}".encode()).digest()


def _unit(raw: bytes, offset: int) -> float:
    """A float in [0, 1) read from four bytes of a digest."""
    return int.from_bytes(raw[offset : offset + 4], "big") / 2**32


def _pick(raw: bytes, offset: int, options: Sequence[T]) -> T:
    """One of ``options`` chosen by two bytes of a digest."""
    return options[int.from_bytes(raw[offset : offset + 2], "big") % len(options)]


def _slug(text: str) -> str:
    """Lowercase ASCII suitable for an email local part (accents folded, spaces dropped)."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return _NOT_LOCAL_PART.sub("", folded.strip().lower())


def find_email(first_name: str, last_name: str, domain: str) -> dict[str, Any]:
    """An email guess for a person at a domain: ``first.last@domain`` lowercased."""
    raw = digest("email", {"first_name": first_name, "last_name": last_name, "domain": domain})
    confidence = round(0.3 + 0.69 * _unit(raw, 0), 3)
    email = f"{_slug(first_name)}.{_slug(last_name)}@{domain.strip().lower()}"
    return {
        "email": email,
        "confidence": confidence,
        "status": "valid" if confidence >= 0.6 else "risky",
    }


def enrich_person(email: str) -> dict[str, Any]:
    """A professional profile for an email address."""
    raw = digest("person", {"email": email})
    title, seniority = _pick(raw, 0, _TITLES)
    local = _slug(email.split("@", 1)[0].replace(".", "-")) or "member"
    return {
        "email": email,
        "title": title,
        "seniority": seniority,
        "linkedin_url": f"https://www.linkedin.com/in/{local}-{raw[4:7].hex()}",
        "location": _pick(raw, 8, _LOCATIONS),
    }


def _company_name(domain: str, raw: bytes) -> str:
    label = domain.strip().lower().split(".")[0] or "company"
    words = label.replace("_", "-").split("-")
    return " ".join(w.capitalize() for w in words if w) + _pick(raw, 10, _NAME_SUFFIXES)


def lookup_company(domain: str) -> dict[str, Any]:
    """Firmographics for a company domain."""
    raw = digest("company", {"domain": domain})
    employees = int(5 * (10_000 ** _unit(raw, 0)))  # log-uniform 5 .. 50,000
    return {
        "domain": domain,
        "name": _company_name(domain, raw),
        "industry": _pick(raw, 4, _INDUSTRIES),
        "employees": employees,
        "country": _pick(raw, 6, _COUNTRIES),
        "founded": 1950 + int.from_bytes(raw[8:10], "big") % 74,
    }


# -- found / not found, and the demo providers that bill by outcome -----------------
#
# Each function below is the whole answer of one endpoint for one input, so a test
# can compute what the server will say (and bill) without calling it. "Found" is
# decided by a digest of the input against a hit rate: the same input at the same
# rate always gets the same answer, and raising the rate only adds hits (an input
# found at 0.5 is found at 0.8 too).

#: Share of ``prospectr`` contacts with a mobile number / a personal email.
PROSPECTR_MOBILE_RATE = 0.3
PROSPECTR_PERSONAL_EMAIL_RATE = 0.5
#: What ``prospectr`` bills per field found by ``/contact/enrich``.
PROSPECTR_FIELD_CREDITS: dict[str, float] = {"email": 1.0, "mobile": 10.0, "personal_email": 3.0}
#: Share of emails the verifier calls ``invalid`` (the mailfox "bad" ones) and ``risky``.
BAD_EMAIL_RATE = 0.25
RISKY_EMAIL_RATE = 0.05

_PERSONAL_DOMAINS = ("gmail.com", "outlook.com", "yahoo.com", "proton.me")


def _person(first_name: str, last_name: str, domain: str) -> dict[str, str]:
    return {"first_name": first_name, "last_name": last_name, "domain": domain}


def is_found(kind: str, value: Any, hit_rate: float) -> bool:
    """Whether the input ``value`` is found by ``kind`` at ``hit_rate`` (deterministic)."""
    return _unit(digest(f"{kind}/hit", value), 0) < hit_rate


def _local(first_name: str, last_name: str) -> tuple[str, str]:
    return _slug(first_name) or "x", _slug(last_name) or "x"


def _domain(domain: str) -> str:
    return domain.strip().lower()


def email_is_bad(email: str) -> bool:
    """Whether ``email`` is one the verifier rejects (about ``BAD_EMAIL_RATE`` of all)."""
    return _unit(digest("bad-email", {"email": email}), 0) < BAD_EMAIL_RATE


def verify_status(email: str) -> str:
    """The verifier's verdict on ``email``: ``invalid``, ``risky`` or ``valid``."""
    if email_is_bad(email):
        return "invalid"
    if _unit(digest("risky-email", {"email": email}), 0) < RISKY_EMAIL_RATE:
        return "risky"
    return "valid"


def mailfox_finds(first_name: str, last_name: str, domain: str, hit_rate: float) -> dict[str, Any]:
    """``mailfox``: ``first.last@domain`` with a confidence 40..99, or a miss.

    About ``BAD_EMAIL_RATE`` of what it finds is an address the verifier calls
    ``invalid`` (decided by the email itself, see :func:`email_is_bad`).
    """
    person = _person(first_name, last_name, domain)
    if not is_found("mailfox", person, hit_rate):
        return {"email": None, "confidence": 0}
    first, last = _local(first_name, last_name)
    raw = digest("mailfox", person)
    return {"email": f"{first}.{last}@{_domain(domain)}", "confidence": 40 + raw[0] % 60}


def _valid_email(first_name: str, last_name: str, domain: str) -> str:
    """The first of the usual address patterns the verifier calls ``valid``."""
    first, last = _local(first_name, last_name)
    host = _domain(domain)
    patterns = (f"{first}.{last}", f"{first[0]}{last}", f"{first}{last}", f"{first}_{last}", first)
    for local in patterns:
        if verify_status(f"{local}@{host}") == "valid":
            return f"{local}@{host}"
    for n in range(2, 1000):  # never reached in practice: each pattern is valid 70 % of the time
        if verify_status(f"{first}.{last}{n}@{host}") == "valid":
            return f"{first}.{last}{n}@{host}"
    raise AssertionError("no valid address pattern")  # pragma: no cover


def prospectr_finds(
    first_name: str, last_name: str, domain: str, hit_rate: float
) -> dict[str, Any]:
    """``prospectr``: a verified address (always ``valid`` for the verifier) and a score."""
    person = _person(first_name, last_name, domain)
    if not is_found("prospectr", person, hit_rate):
        return {"email": None, "score": None}
    raw = digest("prospectr", person)
    return {"email": _valid_email(first_name, last_name, domain), "score": 50 + raw[0] % 50}


def prospectr_enrich(email: str) -> dict[str, Any]:
    """``prospectr`` contact enrichment: the email, and a mobile / personal email when known."""
    raw = digest("prospectr-contact", {"email": email})
    mobile = None
    if _unit(raw, 0) < PROSPECTR_MOBILE_RATE:
        mobile = "+1" + str(2_000_000_000 + int.from_bytes(raw[4:8], "big") % 8_000_000_000)
    personal = None
    if _unit(raw, 8) < PROSPECTR_PERSONAL_EMAIL_RATE:
        local = _slug(email.split("@", 1)[0].replace(".", "")) or "me"
        personal = f"{local}{raw[12] % 100}@{_pick(raw, 14, _PERSONAL_DOMAINS)}"
    return {"email": email, "mobile": mobile, "personal_email": personal}


def prospectr_enrich_credits(result: Mapping[str, Any]) -> float:
    """What ``prospectr`` bills for one enrichment answer: each field found, priced."""
    return sum(price for name, price in PROSPECTR_FIELD_CREDITS.items() if result.get(name))


def verifly_verify(email: str) -> dict[str, Any]:
    """``verifly``: the verdict on one address."""
    return {"email": email, "status": verify_status(email)}


# -- real vendors' shapes (the presets in playline/presets) --------------------------


def hunter_email_finder(
    first_name: str, last_name: str, domain: str, hit_rate: float
) -> dict[str, Any]:
    """Hunter ``GET /v2/email-finder``: ``{"data": {...}, "meta": {"params": ...}}``.

    A miss is a 200 with ``data.email`` and ``data.score`` null (an assumption: the
    documentation pages read do not show the not-found answer).
    """
    person = _person(first_name, last_name, domain)
    found = is_found("hunter", person, hit_rate)
    raw = digest("hunter", person)
    first, last = _local(first_name, last_name)
    data: dict[str, Any] = {
        "first_name": first_name,
        "last_name": last_name,
        "email": f"{first}.{last}@{_domain(domain)}" if found else None,
        "score": 50 + raw[0] % 50 if found else None,
        "domain": _domain(domain),
        "accept_all": False,
        "position": _pick(raw, 2, _TITLES)[0] if found else None,
        "twitter": None,
        "linkedin_url": None,
        "phone_number": None,
        "company": _company_name(domain, raw) if found else None,
        "sources": [],
        "verification": {"date": None, "status": "valid" if found else None},
    }
    return {"data": data, "meta": {"params": person}}


def findymail_search_name(name: str, domain: str, hit_rate: float) -> dict[str, Any]:
    """Findymail ``POST /api/search/name``: ``{"contact": {name, email, domain}}``.

    A miss is a 200 with ``contact`` null (an assumption, see the preset).
    """
    value = {"name": name, "domain": domain}
    if not is_found("findymail", value, hit_rate):
        return {"contact": None}
    parts = name.split()
    first, last = _local(parts[0] if parts else name, parts[-1] if len(parts) > 1 else "")
    local = f"{first}.{last}" if len(parts) > 1 else first
    return {"contact": {"name": name, "email": f"{local}@{_domain(domain)}", "domain": domain}}


@dataclass(frozen=True, slots=True)
class _Match:
    """A bulk person match's invented facts, as a provider derives them from its input."""

    raw: bytes
    domain: str
    first: str
    last: str
    title: str
    seniority: str

    @property
    def email(self) -> str:
        return f"{self.first}.{self.last}@{_domain(self.domain)}"


def _match(provider: str, item: Mapping[str, str], domain: str, hit_rate: float) -> _Match | None:
    """Whether ``provider`` matches the person ``item`` names at ``domain``, and if so
    what it knows of them (deterministic, from the input)."""
    person = _person(item["first_name"], item["last_name"], domain)
    if not is_found(provider, person, hit_rate):
        return None
    raw = digest(provider, person)
    first, last = _local(item["first_name"], item["last_name"])
    title, seniority = _pick(raw, 0, _TITLES)
    return _Match(raw, domain, first, last, title, seniority)


def prospeo_person(item: Mapping[str, str], hit_rate: float) -> dict[str, Any] | None:
    """Prospeo's matched person for one ``data`` record (``identifier`` excluded), or None."""
    found = _match("prospeo", item, item["company_website"], hit_rate)
    if found is None:
        return None
    return {
        "person": {
            "first_name": item["first_name"],
            "last_name": item["last_name"],
            "full_name": f"{item['first_name']} {item['last_name']}",
            "job_title": found.title,
            "seniority": found.seniority,
            "email": {"status": "VERIFIED", "email": found.email},
            "mobile": {"status": "NOT_REQUESTED", "mobile": None},
        },
        "company": {"name": _company_name(found.domain, found.raw), "website": found.domain},
    }


def prospeo_record_key(item: Mapping[str, str]) -> bytes:
    """The record Prospeo never bills twice per account (its lifetime de-duplication)."""
    return digest(
        "prospeo-record",
        _person(item["first_name"], item["last_name"], item["company_website"]),
    )


def prospeo_bulk_response(
    items: Sequence[Mapping[str, str]],
    matches: Sequence[dict[str, Any] | None],
    free: Sequence[bool],
) -> dict[str, Any]:
    """Prospeo ``POST /bulk-enrich-person``'s body: ``matched`` (by ``identifier``),
    ``not_matched`` (identifiers), ``total_cost`` (1 per match not ``free_enrichment``)."""
    matched = [
        {"identifier": item["identifier"], "free_enrichment": is_free, **match}
        for item, match, is_free in zip(items, matches, free, strict=True)
        if match is not None
    ]
    missed = [it["identifier"] for it, m in zip(items, matches, strict=True) if m is None]
    return {
        "error": False,
        "total_cost": sum(1 for m in matched if not m["free_enrichment"]),
        "matched": matched,
        "not_matched": missed,
        "invalid_datapoints": [],
    }


def apollo_match(item: Mapping[str, str], hit_rate: float) -> dict[str, Any] | None:
    """Apollo's enriched person for one ``details`` entry, or None (unmatched)."""
    found = _match("apollo", item, item["domain"], hit_rate)
    if found is None:
        return None
    raw = found.raw
    return {
        "id": raw[:12].hex(),
        "first_name": item["first_name"],
        "last_name": item["last_name"],
        "name": f"{item['first_name']} {item['last_name']}",
        "title": found.title,
        "seniority": found.seniority,
        "email": found.email,
        "email_status": "verified",
        "linkedin_url": f"http://www.linkedin.com/in/{found.first}-{found.last}-{raw[12:15].hex()}",
        "organization": {
            "name": _company_name(found.domain, raw),
            "primary_domain": _domain(found.domain),
        },
    }


def apollo_bulk_response(matches: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """Apollo ``POST /api/v1/people/bulk_match``'s body: ``matches`` in request order
    (null for a miss) and ``credits_consumed`` (1 per match)."""
    found = sum(1 for m in matches if m is not None)
    return {
        "status": "success",
        "error_code": None,
        "error_message": None,
        "total_requested_enrichments": len(matches),
        "unique_enriched_records": found,
        "missing_records": len(matches) - found,
        "credits_consumed": found,
        "matches": list(matches),
    }


# -- asynchronous job vendors (FullEnrich, Dropcontact; see ``jobs``) ---------------
#
# A job's member finds its email by the same digest rule as the other vendors, so a
# test computes each member's answer (and its price) from what it submitted.

#: What FullEnrich bills per field found, by ``enrich_fields`` entry (its docs).
FULLENRICH_FIELD_CREDITS: dict[str, float] = {
    "contact.emails": 1.0,
    "contact.personal_emails": 3.0,
    "contact.phones": 10.0,
}
#: Share of found FullEnrich contacts with a mobile phone / a personal email.
FULLENRICH_PHONE_RATE = 0.4
FULLENRICH_PERSONAL_EMAIL_RATE = 0.5
#: The input fields that name a FullEnrich contact (``custom`` and ``enrich_fields`` are
#: not part of who it is).
FULLENRICH_IDENTITY = ("firstname", "lastname", "domain", "company_name", "linkedin_url")
_FULLENRICH_EMAIL_STATUSES = ("DELIVERABLE", "DELIVERABLE", "HIGH_PROBABILITY", "CATCH_ALL")
_DROPCONTACT_QUALIFICATIONS = ("nominative@pro", "nominative@pro", "catch_all@pro")
_URL_PREFIX = re.compile(r"^(https?://)?(www\.)?")


def company_host(domain: str | None, company: str | None) -> str | None:
    """The email host of a company: its domain or website without scheme, ``www.`` or
    path; else its name's slug at ``.com``; None without either."""
    if domain and domain.strip():
        host = _URL_PREFIX.sub("", domain.strip().lower()).split("/", 1)[0]
        if host:
            return host
    if company and company.strip():
        return f"{_slug(company) or 'company'}.com"
    return None


def fullenrich_identity(item: Mapping[str, Any]) -> dict[str, str]:
    """Who a FullEnrich contact is: its non-empty ``FULLENRICH_IDENTITY`` fields."""
    return {name: item[name] for name in FULLENRICH_IDENTITY if item.get(name)}


def fullenrich_contact(item: Mapping[str, Any], hit_rate: float) -> dict[str, Any]:
    """The ``contact`` FullEnrich answers for one submitted contact (``datas[i]``).

    Only the fields asked for in ``enrich_fields`` (default ``["contact.emails"]``) are
    looked for. A found contact has its work email when a company is known (``domain``
    or ``company_name``; a LinkedIn URL alone finds no work email here), a mobile
    about ``FULLENRICH_PHONE_RATE`` of the time, a personal email about
    ``FULLENRICH_PERSONAL_EMAIL_RATE``; a contact not found has nothing.
    """
    person = fullenrich_identity(item)
    fields = item.get("enrich_fields") or ["contact.emails"]
    found = is_found("fullenrich", person, hit_rate)
    raw = digest("fullenrich", person)
    first, last = _local(str(item.get("firstname", "")), str(item.get("lastname", "")))
    host = company_host(item.get("domain"), item.get("company_name"))
    emails: list[dict[str, str]] = []
    if found and host is not None and "contact.emails" in fields:
        emails.append(
            {"email": f"{first}.{last}@{host}", "status": _pick(raw, 0, _FULLENRICH_EMAIL_STATUSES)}
        )
    personal: list[dict[str, str]] = []
    if (
        found
        and "contact.personal_emails" in fields
        and _unit(raw, 4) < FULLENRICH_PERSONAL_EMAIL_RATE
    ):
        address = f"{first}{last}{raw[8] % 100}@{_pick(raw, 10, _PERSONAL_DOMAINS)}"
        personal.append({"email": address, "status": "DELIVERABLE"})
    phones: list[dict[str, str]] = []
    if found and "contact.phones" in fields and _unit(raw, 12) < FULLENRICH_PHONE_RATE:
        number = "+1" + str(2_000_000_000 + int.from_bytes(raw[16:20], "big") % 8_000_000_000)
        phones.append({"number": number, "region": "US"})
    return {
        "firstname": item.get("firstname"),
        "lastname": item.get("lastname"),
        "domain": host,
        "most_probable_email": emails[0]["email"] if emails else None,
        "most_probable_email_status": emails[0]["status"] if emails else None,
        "most_probable_personal_email": personal[0]["email"] if personal else None,
        "most_probable_phone": phones[0]["number"] if phones else None,
        "emails": emails,
        "personal_emails": personal,
        "phones": phones,
    }


def fullenrich_credits(contact: Mapping[str, Any]) -> float:
    """What FullEnrich bills for one finished contact: each kind of field found, priced."""
    found = {
        "contact.emails": contact.get("emails"),
        "contact.personal_emails": contact.get("personal_emails"),
        "contact.phones": contact.get("phones"),
    }
    return sum(FULLENRICH_FIELD_CREDITS[name] for name, values in found.items() if values)


def dropcontact_identity(item: Mapping[str, Any]) -> dict[str, Any]:
    """Who a Dropcontact record is: every input field but ``custom_fields``."""
    return {name: value for name, value in item.items() if name != "custom_fields"}


def dropcontact_record(
    item: Mapping[str, Any], hit_rate: float, siren: bool = False
) -> dict[str, Any]:
    """Dropcontact's answer for one submitted record: the input echoed, plus ``email``
    (a list of ``{"email", "qualification"}``) when found, absent otherwise.

    A record is found by the digest rule and needs a company (``website`` or
    ``company``) for an address; ``siren`` adds a (fake) SIREN number to found records.
    """
    record = dict(item)
    record.pop("email", None)  # the answer's ``email`` is always the list found
    person = dropcontact_identity(item)
    raw = digest("dropcontact", person)
    names = str(item.get("full_name", "")).split()
    first_name = item.get("first_name") or (names[0] if names else "")
    last_name = item.get("last_name") or (names[-1] if len(names) > 1 else "")
    host = company_host(item.get("website"), item.get("company"))
    if host is not None and is_found("dropcontact", person, hit_rate):
        first, last = _local(str(first_name), str(last_name))
        qualification = _pick(raw, 0, _DROPCONTACT_QUALIFICATIONS)
        record["email"] = [{"email": f"{first}.{last}@{host}", "qualification": qualification}]
        if first_name and last_name:
            record.setdefault("full_name", f"{first_name} {last_name}")
        if siren:
            record["siren"] = f"{int.from_bytes(raw[4:8], 'big') % 1_000_000_000:09d}"
    return record


def dropcontact_credits(record: Mapping[str, Any]) -> float:
    """What Dropcontact bills for one record: 1 when an email was found."""
    return 1.0 if record.get("email") else 0.0
