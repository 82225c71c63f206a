"""Reading an asynchronous provider's answers: the job id, its state, its members' results.

Pure functions over a tool's :class:`~playline.calls.catalog.JobSpec`, shared by the
job dispatcher (a poll's answer) and the webhook receiver (a delivery's body), so a
status means the same whichever way it arrived.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import quote

from playline.calls.catalog import JobSpec, ToolSpec
from playline.freshness import dig

__all__ = [
    "MISSING",
    "Reading",
    "dig",
    "job_id_of",
    "member_results",
    "named_job_id",
    "put",
    "read_state",
    "status_call",
    "status_request",
]

#: A member whose result is not (yet) in the answer.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()

Reading = Literal["done", "running", "failed"]


def put(target: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``target`` with ``value`` at the dotted ``path`` (dicts made as needed)."""
    head, _, rest = path.partition(".")
    out = dict(target)
    if not rest:
        out[head] = value
        return out
    inner = out.get(head)
    out[head] = put(inner if isinstance(inner, dict) else {}, rest, value)
    return out


def submit_body(spec: JobSpec, payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """The body of a job's submit for these members' inputs: the fixed ``body`` with
    the members' items (each ``item`` plus the input, its position at ``id_field``) at
    ``items_field``, or, without ``items_field``, the one input over ``body``."""
    if spec.items_field is None:
        return {**spec.body, **payloads[0]}
    items = [{**spec.item, **payload} for payload in payloads]
    if spec.id_field:
        items = [put(item, spec.id_field, str(at)) for at, item in enumerate(items)]
    return put(dict(spec.body), spec.items_field, items)


def status_request(spec: JobSpec, job_id: str) -> tuple[str, dict[str, Any]]:
    """The path and payload of a status poll of job ``job_id``: its id quoted in the path,
    and put as is in the ``status_body``'s ``"{job_id}"`` strings (no body: ``{}``)."""
    path = spec.status_path.replace("{job_id}", quote(job_id, safe=""))

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{job_id}", job_id)
        if isinstance(value, Mapping):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    return path, fill(spec.status_body) if spec.status_body is not None else {}


def status_call(tool: ToolSpec, job_id: str) -> tuple[ToolSpec, dict[str, Any]]:
    """The tool and payload that poll job ``job_id`` of ``tool``'s job: the status
    method and path, sent with a key, and no match or error rules of the submit's (a
    status answer is judged by the job's states, not the tool's)."""
    spec = tool.job
    assert spec is not None
    path, payload = status_request(spec, job_id)
    status_tool = tool.model_copy(
        update={
            "method": spec.status_method,
            "path": path,
            "job": None,
            "idempotency": "key",
            "no_match_status": (),
            "error_field": None,
        }
    )
    return status_tool, payload


def job_id_of(spec: JobSpec, answer: Any) -> str | None:
    """The job id in a submit's answer (a string), or ``None`` when it has none."""
    return _id_at(answer, spec.job_id)


def _id_at(answer: Any, path: str) -> str | None:
    value = dig(answer, path)
    if value is None or isinstance(value, bool | dict | list) or value == "":
        return None
    return str(value)


def named_job_id(spec: JobSpec, answer: Any) -> str | None:
    """The job id a status answer (a poll's or a webhook's body) names itself by, at
    ``status_job_id`` (else at ``job_id``); ``None`` when it names none."""
    return _id_at(answer, spec.status_job_id or spec.job_id)


def read_state(spec: JobSpec, answer: Any) -> tuple[Reading, str | None]:
    """What a status answer says of the job, and why it failed when it did."""
    value = dig(answer, spec.state_field)
    if spec.error_field is not None and dig(answer, spec.error_field):
        reason = dig(answer, spec.reason_field) if spec.reason_field else None
        told = f": {reason}" if isinstance(reason, str) and reason else ""
        return "failed", f"the provider reports an error{told}"[:300]
    if _member(value, spec.done):
        return "done", None
    if _member(value, spec.running):
        return "running", None
    reason = dig(answer, spec.reason_field) if spec.reason_field else None
    told = f": {reason}" if isinstance(reason, str) and reason else ""
    return "failed", f"job state {value!r}{told}"[:300]


def member_results(spec: JobSpec, answer: Any, count: int, *, done: bool) -> list[Any]:
    """Each member's result in a status answer, in submit order; :data:`MISSING` for a
    member not in it. Matched by ``id_field`` when the tool sets one (a member absent
    from a *finished* job's results is a miss: ``None``); otherwise by order, which
    needs a finished job answering one result per member (else every member is
    missing, and the caller fails the job as unusable)."""
    results = dig(answer, spec.results_field)
    if spec.items_field is None and count == 1 and not isinstance(results, list):
        return [results if results is not None or done else MISSING]
    if not isinstance(results, list):
        return [MISSING] * count
    if spec.id_field is not None:
        by_id = {
            str(dig(r, spec.id_field)): r
            for r in results
            if isinstance(r, Mapping) and dig(r, spec.id_field) is not None
        }
        return [by_id.get(str(at), None if done else MISSING) for at in range(count)]
    if not done or len(results) != count:
        return [MISSING] * count
    return list(results)


def _member(value: Any, choices: tuple[Any, ...]) -> bool:
    """``value`` in ``choices``, without ``True == 1`` (a JSON true is not a 1)."""
    return any(type(value) is type(c) and value == c for c in choices)
