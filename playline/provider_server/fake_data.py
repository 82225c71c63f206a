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
from collections.abc import Sequence
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
