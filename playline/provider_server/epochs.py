"""Answers that change between runs, deterministically: the provider side of a re-run.

Contact data decays, so teams re-run enrichment and want to know what changed. To test
that, the fake provider's answers must change too, but reproducibly: with
``answer_epoch > 0`` an input whose digest (with the epoch and the endpoint) falls under
``changed_fraction`` gets another answer than at epoch 0, the same one on every call
of that epoch. What changes is what a CRM would notice:

* email finders (``acme``, ``mailfox``): another address pattern, or a hit becomes a
  miss (and, for ``mailfox``, a miss becomes a hit), so cells appear and disappear;
* ``acme`` person enrichment: another title (and its seniority);
* ``firmo`` company lookups: another company name.

Other endpoints answer as at epoch 0. The server keeps, per endpoint, the inputs whose
latest answer differed from epoch 0 (``GET /_admin/changed``), so a test compares a
run's change report with the provider's own list. Pure functions (no I/O, no clock).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from playline.provider_server import fake_data
from playline.provider_server.fake_data import (
    _NAME_SUFFIXES,
    _TITLES,
    _domain,
    _local,
    _unit,
    digest,
)

__all__ = ["DRIFTING_PATHS", "drifted_answer", "drifts", "input_key"]


def drifts(path: str, item: Mapping[str, Any], epoch: int, fraction: float) -> bool:
    """Whether ``item``'s answer at ``path`` differs from epoch 0's at ``epoch``."""
    if epoch <= 0 or fraction <= 0.0 or path not in DRIFTING_PATHS:
        return False
    return _unit(digest(f"{path}/epoch/{epoch}", dict(item)), 0) < fraction


def _roll(path: str, item: Mapping[str, Any], epoch: int) -> bytes:
    """Digest bytes that pick how an answer changes (independent of :func:`drifts`)."""
    return digest(f"{path}/drift/{epoch}", dict(item))


def _other_pattern(item: Mapping[str, Any]) -> str:
    """``flast@domain``: another address than the finders' ``first.last@domain``."""
    first, last = _local(str(item["first_name"]), str(item["last_name"]))
    return f"{first[0]}{last}@{_domain(str(item['domain']))}"


def _acme_email(item: Mapping[str, Any], base: dict[str, Any], raw: bytes) -> dict[str, Any]:
    if raw[0] % 3 == 0:
        return {"email": None, "confidence": 0.0, "status": "not_found"}
    return {**base, "email": _other_pattern(item)}


def _mailfox_email(item: Mapping[str, Any], base: dict[str, Any], raw: bytes) -> dict[str, Any]:
    if base.get("email") is None:
        first, last = _local(str(item["first_name"]), str(item["last_name"]))
        email = f"{first}.{last}@{_domain(str(item['domain']))}"
        return {"email": email, "confidence": 40 + raw[1] % 60}
    if raw[0] % 3 == 0:
        return {"email": None, "confidence": 0}
    return {**base, "email": _other_pattern(item)}


def _person(item: Mapping[str, Any], base: dict[str, Any], raw: bytes) -> dict[str, Any]:
    titles = [t for t in _TITLES if t[0] != base.get("title")]
    title, seniority = titles[raw[0] % len(titles)]
    return {**base, "title": title, "seniority": seniority}


def _company(item: Mapping[str, Any], base: dict[str, Any], raw: bytes) -> dict[str, Any]:
    name = str(base.get("name", ""))
    stem = next((name[: -len(s)] for s in _NAME_SUFFIXES if s and name.endswith(s)), name)
    names = [stem + s for s in _NAME_SUFFIXES if stem + s != name]
    return {**base, "name": names[raw[0] % len(names)]}


_Drift = Callable[[Mapping[str, Any], dict[str, Any], bytes], dict[str, Any]]
#: The endpoints whose answers drift, and how.
DRIFTING_PATHS: dict[str, _Drift] = {
    "/acme/v1/email/find": _acme_email,
    "/acme/v1/person/enrich": _person,
    "/firmo/v1/company/lookup": _company,
    "/firmo/v1/company/lookup/bulk": _company,
    "/mailfox/v1/email/find": _mailfox_email,
}


def drifted_answer(path: str, item: Mapping[str, Any], base: Any, epoch: int) -> Any:
    """``item``'s answer at ``epoch`` given its epoch-0 answer ``base`` (which it never
    equals for a drifting endpoint)."""
    drift = DRIFTING_PATHS.get(path)
    if drift is None or not isinstance(base, dict):
        return base
    return drift(item, base, _roll(path, item, epoch))


def input_key(item: Mapping[str, Any]) -> str:
    """How the server files an input in its list of changed answers."""
    return fake_data.canonical_json(dict(item))
