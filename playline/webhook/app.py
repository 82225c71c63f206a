"""The webhook receiver's ASGI app: a provider's delivery becomes a job status.

``POST /hooks/{provider}/{token}``, where ``token`` is the job's per-job secret
(:attr:`playline.stores.jobs.Job.token`, in the callback URL sent with the submit). In
order:

1. the job is looked up by its token; an unknown token, or one of another provider's
   job, is ``404`` (the same answer for both: a guess learns nothing);
2. its tool (in this receiver's catalog) must take webhooks (``job.webhook``), else
   ``404``; when the tool's deliveries are signed, the secret must be set in the
   receiver's environment (``500`` naming the variable otherwise);
3. the body is read (at most :data:`MAX_BODY_BYTES`, else ``413``), its signature
   checked in constant time (``401``), and parsed as JSON (``400``);
4. the body must be this job's: the job id it names (the tool's ``status_job_id``,
   else ``job_id``) must be the job's, and a tool whose bodies name their job must
   name it (``409``, nothing recorded: a body captured for another job, even validly
   signed with the account's key, is refused); then
   :func:`~playline.calls.job_status.read_state` says what the body means (done,
   running, failed), with the same rule as a poll's answer;
5. providers send no delivery id, so a delivery is de-duplicated by its job and the
   digest of its state and canonical body (:meth:`JobStore.record_delivery`): a
   repeated delivery answers ``200 {"duplicate": true}`` and changes nothing;
6. the status is stored (:meth:`JobStore.record_status`) and every dataset run
   waiting on the job (``waiters``) is told (``notify``: the ``jobs_ready`` signal).
   A run that is gone is logged and ignored: the status is stored, and polling reads
   it. The answer is ``200 {"ok": true}``.

The job store failing is ``503``, so the provider delivers again later. (Should the
store fail *between* recording the delivery and its status, the provider's retry is
then a duplicate and the status arrives by the next poll instead: polling is the
fallback for every lost delivery.) Every error is
a one-line JSON object ``{"error": ...}`` that echoes nothing the request carried.
Nothing here logs the token, the signature, the secret or the body (the server must
also run without an access log, which would print the token in the path).

``GET /healthz`` answers ``200`` (for load balancers and the tests).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from playline.calls.catalog import Catalog, JobSpec, ToolSpec
from playline.calls.job_status import Reading, named_job_id, read_state
from playline.config import Settings
from playline.errors import UnknownJob
from playline.request_body import BodyTooLarge, read_capped_body
from playline.stores.jobs import JobState, JobStore
from playline.stores.receipts import stored_json
from playline.webhook.verify import WebhookSecretMissing, signature_matches, signing_secret

__all__ = [
    "MAX_BODY_BYTES",
    "NOTIFY_TIMEOUT_S",
    "Notify",
    "delivery_digest",
    "webhook_app",
    "webhook_tools",
]

logger = logging.getLogger("playline.webhook")

#: The largest delivery body read; a larger one is ``413`` (without reading it all).
MAX_BODY_BYTES = 1024 * 1024
#: How long one waiter's signal may take before it is given up (polling still works).
NOTIFY_TIMEOUT_S = 10.0

#: Tells one waiting workflow (by id) that its jobs moved: the ``jobs_ready`` signal.
Notify = Callable[[str], Awaitable[None]]

#: What :func:`read_state` says, as the job ledger's state.
_STATES: dict[Reading, JobState] = {"done": "done", "running": "running", "failed": "failed"}

_NOT_FOUND = "no such job for this provider"
_STORE_DOWN = "the job store is unavailable; deliver again later"


def delivery_digest(state: str, body: Any) -> str:
    """What identifies a delivery (providers send no delivery id): its state and its
    canonical JSON body, hashed."""
    return hashlib.sha256((state + stored_json(body)).encode()).hexdigest()


def webhook_tools(catalog: Catalog) -> list[ToolSpec]:
    """The catalog's tools whose jobs may be completed by a webhook."""
    return [
        tool
        for tool in catalog.tools.values()
        if tool.job is not None and tool.job.webhook is not None
    ]


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status)


def _problem(err: BaseException) -> str:
    """An exception for the log: its type and first line, short."""
    text = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _names_another_job(spec: JobSpec, body: Any, job_id: str | None) -> str | None:
    """Why a delivery's body is not this job's (None: it may be): the job id it names
    (:func:`named_job_id`) must be the job's; a tool whose bodies name their job
    (``status_job_id``) must name it. (The URL's token names a job, the signature only
    the account: a body captured for another job, validly signed, is refused here.)"""
    named = named_job_id(spec, body)
    if named is None:
        if spec.status_job_id is not None:
            return "the body names no job"
        return None
    if job_id is None or named != job_id:
        return "the body names another job than this URL's"
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def webhook_app(
    jobs: JobStore,
    catalog: Catalog,
    notify: Notify,
    environ: Mapping[str, str] | None = None,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    notify_timeout_s: float = NOTIFY_TIMEOUT_S,
) -> Starlette:
    """The receiver: deliveries into ``jobs``, read with ``catalog``'s tools.

    Args:
        jobs: the workers' job ledger.
        catalog: the catalog the workers use (the tools' ``job`` tables).
        notify: signals ``jobs_ready`` to one workflow id.
        environ: where the signing secrets' variables are read (default: the process
            environment, read through :meth:`Settings.from_env`, the one reader).
        max_body_bytes: larger bodies get ``413``.
        notify_timeout_s: the longest one signal may take.
    """
    secrets_from = Settings.from_env().environ if environ is None else environ

    async def tell(waiters: Sequence[str], key: str) -> None:
        async def one(workflow_id: str) -> None:
            try:
                await asyncio.wait_for(notify(workflow_id), notify_timeout_s)
            except Exception as err:  # the run is gone, or Temporal is slow: polling reads it
                logger.info(
                    "webhook: job %s: could not signal %s (%s); it will read the status "
                    "when it polls",
                    key,
                    workflow_id,
                    _problem(err),
                )

        await asyncio.gather(*(one(w) for w in waiters))

    async def deliver(request: Request) -> JSONResponse:
        provider = request.path_params["provider"]
        token = request.path_params["token"]
        try:
            job = await jobs.by_token(token)
        except Exception as err:
            logger.warning(
                "webhook: job store lookup failed: %s", _problem(err).replace(token, "<token>")
            )
            return _error(_STORE_DOWN, 503)
        if job is None or job.provider != provider:
            logger.info("webhook: a delivery for provider %r named no job of it", provider[:64])
            return _error(_NOT_FOUND, 404)
        tool = catalog.tools.get(job.tool_id)
        spec = tool.job if tool is not None else None
        webhook = spec.webhook if spec is not None else None
        if spec is None or webhook is None:
            logger.warning(
                "webhook: job %s is of tool %r, which takes no webhooks in this receiver's "
                "catalog (is it the workers' catalog?)",
                job.key,
                job.tool_id,
            )
            return _error("this job's tool takes no webhooks", 404)
        try:
            secret = signing_secret(webhook, secrets_from)
        except WebhookSecretMissing as err:
            logger.error("webhook: job %s: %s", job.key, err)
            return _error(str(err), 500)
        try:
            raw = await read_capped_body(request, max_body_bytes)
        except BodyTooLarge:
            return _error(f"the body is over {max_body_bytes} bytes", 413)
        if secret is not None:
            header = webhook.signature_header or ""
            if not signature_matches(webhook.signature, secret, raw, request.headers.get(header)):
                logger.warning(
                    "webhook: job %s: a delivery with a missing or wrong %s signature was refused",
                    job.key,
                    webhook.signature,
                )
                return _error(f"missing or wrong signature in header {header}", 401)
        try:
            body = json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            return _error("the body is not JSON", 400)

        refused = _names_another_job(spec, body, job.job_id)
        if refused is not None:
            logger.warning("webhook: job %s: a delivery was refused: %s", job.key, refused)
            return _error(refused, 409)
        reading, reason = read_state(spec, body)
        state = _STATES[reading]
        try:
            first = await jobs.record_delivery(job.key, delivery_digest(state, body))
        except Exception as err:
            logger.warning("webhook: job %s: recording the delivery failed: %s", job.key, err)
            return _error(_STORE_DOWN, 503)
        if not first:
            logger.info("webhook: job %s: duplicate %s delivery ignored", job.key, state)
            return JSONResponse({"duplicate": True})
        try:
            stored = await jobs.record_status(job.key, state=state, status=body, error=reason)
        except UnknownJob:
            return _error(_NOT_FOUND, 404)
        except Exception as err:  # its message may quote the body: the type only
            logger.warning(
                "webhook: job %s: storing its %s status failed: %s",
                job.key,
                state,
                type(err).__name__,
            )
            return _error(_STORE_DOWN, 503)
        logger.info(
            "webhook: job %s (%s): %s delivery stored, now %s",
            job.key,
            job.provider,
            state,
            stored.state,
        )
        await tell(list(dict.fromkeys([*job.waiters, *stored.waiters])), job.key)
        return JSONResponse({"ok": True})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/hooks/{provider}/{token}", deliver, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
