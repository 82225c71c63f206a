"""A preset tool's call, sent the way playline sends it, and what playline made of the answer.

Single tools go through the ``ProviderClient``; bulk tools through the bulk request
builder (``bulk_items``/``split_results``) and the tool's bulk billing; job tools
through the job submit builder (``submit_body``), then status polls read as the job
dispatcher reads them (``read_state``, ``member_results``): a poll answered with a
status in the job's ``poll_pending_status`` still runs, one in ``poll_failed_status``
fails the job, a 404/410 fails it (the provider does not know it), any other error is
"not answered now" and polled again; a job still running
after the documented polls is given up (``job_failed``), as ``max_wait_s`` would.
The whole dispatcher (ledger, webhook, re-runs) runs in the end-to-end play test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from playline.calls.bulk import bulk_items, split_results
from playline.calls.catalog import ToolSpec
from playline.calls.http import ProviderClient
from playline.calls.job_status import (
    MISSING,
    job_id_of,
    member_results,
    read_state,
    status_call,
    submit_body,
)
from playline.errors import (
    ProviderError,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTransientError,
)
from playline.freshness import is_present


@dataclass
class Observed:
    """What playline made of one documented answer."""

    outcome: str
    results: list[Any] = field(default_factory=list)
    credits: float = 0.0
    error: str | None = None


def is_hit(tool: ToolSpec, result: Any) -> bool:
    """Whether a result holds what the tool's billing counts as found."""
    if result is None or result is MISSING:
        return False
    billing = tool.billing
    if billing.rule == "per_field":
        return any(is_present(tool.get(result, name)) for name in billing.fields)
    if billing.hit is not None:
        return is_present(tool.get(result, billing.hit))
    return is_present(result)


def _answered(tool: ToolSpec, results: list[Any], credits: float) -> Observed:
    hit = any(is_hit(tool, r) for r in results)
    return Observed("hit" if hit else "no_match", results, credits)


def _failed(err: ProviderError) -> Observed:
    if isinstance(err, ProviderRateLimited):
        return Observed("rate_limited", error=str(err))
    if isinstance(err, ProviderRejected):
        return Observed("rejected", error=str(err))
    if isinstance(err, ProviderTransientError):
        return Observed("transient", error=str(err))
    return Observed(type(err).__name__, error=str(err))


async def call(
    client: ProviderClient, tool: ToolSpec, payloads: list[dict[str, Any]], *, max_polls: int
) -> Observed:
    """Send ``payloads`` as one call (single tools: one input) and read the answer."""
    key = f"contract-{tool.id}"
    payloads = [tool.validate_input(p) for p in payloads]  # as the runner does first
    try:
        if tool.job is not None:
            return await _job(client, tool, payloads, key, max_polls)
        if tool.batch is not None:
            body = {tool.batch.items_field: bulk_items(tool, payloads)}
            response = await client.send(tool, body, idempotency_key=key, path=tool.batch.path)
            members = split_results(tool, response, len(payloads))
            shares, _ = tool.bulk_charges(response, members)
            return _answered(tool, members, sum(shares))
        assert len(payloads) == 1, "a single tool takes one input per call"
        result = await client.send(tool, payloads[0], idempotency_key=key)
        return _answered(tool, [result], tool.charge(result).credits)
    except ProviderError as err:
        return _failed(err)


async def _job(
    client: ProviderClient, tool: ToolSpec, payloads: list[dict[str, Any]], key: str, polls: int
) -> Observed:
    spec = tool.job
    assert spec is not None
    answer = await client.send(tool, submit_body(spec, payloads), idempotency_key=key)
    job_id = job_id_of(spec, answer)
    if job_id is None:
        return Observed("transient", error=f"the submit's answer has no job id at {spec.job_id!r}")
    status_tool, status_payload = status_call(tool, job_id)
    for at in range(polls):
        try:
            status = await client.send(
                status_tool, status_payload, idempotency_key=f"{key}#poll{at}"
            )
        except ProviderError as err:
            code = getattr(err, "status", None)
            if code in spec.poll_pending_status:
                continue  # "not ready yet", told with an error status
            if code in spec.poll_failed_status:
                return Observed("job_failed", error=f"the provider says it failed ({err})")
            if code in (404, 410):
                return Observed("job_failed", error=f"the provider does not know it ({err})")
            continue  # not answered now: the dispatcher polls again at the next interval
        state, reason = read_state(spec, status)
        if state == "failed":
            return Observed("job_failed", error=reason)
        if state == "done":
            members = member_results(spec, status, len(payloads), done=True)
            credits = sum(tool.charge(m).credits for m in members if m is not MISSING)
            return _answered(tool, members, credits)
    return Observed("job_failed", error=f"still running after {polls} polls (past max_wait_s)")
