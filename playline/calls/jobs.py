"""Asynchronous tools: a call is a provider *job*, submitted once, then polled or called back.

A tool whose catalog entry has a ``job`` table (:class:`~playline.calls.catalog.JobSpec`)
does not answer its calls: its provider takes them as a job, returns the job's id
and finishes seconds to minutes later. :class:`JobDispatcher` settles such calls
without holding a chunk's slot while the job runs:

1. A claimed call whose receipt is in no live job joins its tool's next submit (up
   to ``max_items`` members, ``linger_ms`` to fill one) and its row leaves the chunk
   at once (:class:`~playline.errors.JobPending`, parked like a row waiting for a
   quota), so a submit fills from every row of the chunk, not only from the rows at
   once. The call's receipt stays leased (renewed) until the submit's outcome is
   recorded; the chunk attempt waits for its submits before it reports.
2. Before the submit is sent the job is recorded in the job ledger
   (:mod:`playline.stores.jobs`) with its exact request and its members, and marked
   ``sending`` right before it goes out; the provider's job id is recorded as soon as
   the answer arrives, before anything else. Then the members' receipts are
   released. A crash after that never submits again: every later attempt finds the
   job by its member and looks at *that* job. A crash between sending and recording
   the id re-sends the same request under the same ``Idempotency-Key`` to a
   provider that de-duplicates; for any other the job (and its calls) become
   *ambiguous* (never re-sent without ``retry_ambiguous``), exactly like a bulk
   request. No slot, lease or heartbeat is held while the job runs: the dataset run
   re-runs the rows on a durable timer (or when a webhook delivery wakes it).
3. Re-run, the call finds its job: ``done`` (polled or delivered by webhook, by
   any worker) gives the member's result, which completes its receipt with what the
   tool's billing rule says it cost; ``running`` is polled when a poll is due (one
   poll per job per attempt, paced as :func:`~playline.calls.catalog.poll_pacing_key`
   says: on the submits' key unless the tool gives polls a limit of their own).
   **A job's answer is read before it may be expired**: a job past ``max_wait_s`` is
   polled then, and only when that poll still says it runs is it given up, as
   *ambiguous* (it may still finish and bill: never submitted again without
   ``retry_ambiguous``). A job that ended part way (``failed``, out of credits,
   cancelled; or given up) completes each member whose result its status holds, by
   the billing rule; only the others fail. Members a provider reports while the job
   runs (``partial``) land at once.

A provider's cap on jobs in flight (``max_jobs_in_flight``) is counted in the
ledger, over the live jobs young enough to still be looked at (an orphan of an
ended run holds no place): a submit that would exceed it is not sent, and its rows
submit again when they are re-run. Only the caller that moves a job from
``opened`` to ``sending`` (a compare-and-set) sends its submit.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from playline.calls.attempt import Attempt
from playline.calls.bulk import batch_idempotency_key
from playline.calls.catalog import JobSpec, ToolSpec, poll_pacing_key
from playline.calls.dispatch import ClaimedCall, Request, Settled
from playline.calls.job_status import (
    MISSING,
    dig,
    job_id_of,
    member_results,
    put,
    read_state,
    status_call,
    submit_body,
)
from playline.calls.outcome import Ambiguous, Answered, CallOutcome, Failed, Parked
from playline.calls.queueing import QueueingDispatcher
from playline.calls.settle import SingleReceipt, settle
from playline.errors import JobFailed, JobPending, ProviderError
from playline.stores.jobs import LIVE_STATES, Job, JobStore, member_ref

__all__ = ["JobDispatcher", "JobSender", "hook_url", "job_dispatcher"]

logger = logging.getLogger("playline.jobs")

#: A pending call is looked at again no sooner than this (seconds).
MIN_RECHECK_S = 1.0
#: How long past ``max_wait_s`` (and a poll interval) a live job still counts against
#: ``max_jobs_in_flight`` (seconds): the time its last poll takes to be made and kept.
LIVE_MARGIN_S = 60.0


class JobSender:
    """What the dispatcher needs of :class:`~playline.calls.live.PacedSender`."""

    async def send(self, request: Request) -> CallOutcome:  # pragma: no cover - protocol
        raise NotImplementedError


def job_dispatcher(dispatcher: Any) -> JobDispatcher | None:
    """The job dispatcher inside a chunk's dispatcher (a budget may wrap it), if any."""
    inner = getattr(dispatcher, "_inner", dispatcher)
    jobs = getattr(inner, "jobs", None)
    return jobs if isinstance(jobs, JobDispatcher) else None


def hook_url(base: str, provider: str, token: str) -> str:
    """The callback URL a job's webhook is delivered to (``playline webhook``)."""
    return f"{base.rstrip('/')}/hooks/{quote(provider, safe='')}/{token}"


@dataclass
class _Queued:
    call: ClaimedCall
    #: the lease kept renewed until the submit's outcome is recorded
    hold: Any = field(repr=False)


class JobDispatcher(QueueingDispatcher[_Queued]):
    """Settles claimed calls of asynchronous tools; see the module docstring.

    Args:
        attempt: the chunk attempt's shared state.
        sender: sends submits and polls through the governor (``PacedSender``).
        jobs: the job ledger.
        waiter: the dataset run's workflow id, remembered on each job so a webhook
            delivery can wake it.
        webhook_base: the public base URL of ``playline webhook`` (the worker's
            ``PLAYLINE_WEBHOOK_URL``); unset, webhooks are not asked for.
        clock: wall-clock seconds (the ledger's timestamps are wall clock).
    """

    def __init__(
        self,
        attempt: Attempt,
        sender: Any,
        jobs: JobStore,
        *,
        waiter: str | None = None,
        webhook_base: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self._attempt = attempt
        self._sender = sender
        self._jobs = jobs
        self._waiter = waiter
        self._webhook_base = webhook_base
        self._clock = clock
        self._looks: dict[str, asyncio.Future[Job]] = {}
        self._waited: set[str] = set()
        #: whether any call of this attempt was an asynchronous tool's
        self.touched = False

    async def settle(self, call: ClaimedCall) -> Settled:
        """Submit the call's job, or read what its job says; see the module docstring."""
        tool = call.tool
        self.touched = True
        assert tool.job is not None
        attempt = self._attempt
        ref = member_ref(call.key, call.generation)
        found = await attempt.persist(self._jobs.jobs_of([ref]))
        job = found.get(ref)
        if job is not None and job.state == "ambiguous" and self._submits_again(job):
            # Given up unanswered (past max_wait_s) but the provider knows it: read it
            # (it may have finished, and billed, since) before it is sent again.
            job = await self._recheck(tool, job) if job.job_id is not None else job
        if job is None or self._submits_again(job):
            # In no job, or its last one (of an earlier run) ended without an answer:
            # it joins a submit, and its row leaves the chunk at once, so the submit
            # fills from every row of the chunk, not only the rows at once.
            self._enqueue(call)
            resume = self._clock() + tool.job.first_poll
            raise JobPending(tool.provider, resume, tool_id=tool.id)
        job = await self._look(tool, job)
        return await self._settle(call, self._verdict(tool, job, ref))

    def _drop(self, member: _Queued) -> None:
        """Cancelled before it was submitted: its lease is let go (a submit already
        marked ``sending`` is resolved by the next attempt)."""
        member.hold.__exit__(None, None, None)

    def _submits_again(self, job: Job) -> bool:
        """Whether a call whose last job ended without an answer is submitted anew:
        only in a later run (a failed job fails every member's row of its own run), and
        an ambiguous one only when the user asked to retry ambiguous calls."""
        if job.state not in ("failed", "ambiguous"):
            return False
        if job.request.get("run") == self._attempt.force_token:
            return False
        return job.state == "failed" or self._attempt.retry_ambiguous

    # -- the member's verdict -----------------------------------------------------

    def _verdict(self, tool: ToolSpec, job: Job, ref: str) -> CallOutcome:
        """What ``job`` says of member ``ref`` now."""
        spec = tool.job
        assert spec is not None
        at = job.members.index(ref)
        if job.state == "done":
            result = member_results(spec, job.status, len(job.members), done=True)[at]
            if result is MISSING:
                return Failed(
                    JobFailed(
                        f"{tool.provider} job {job.job_id} finished without a result for "
                        f"this call ({len(job.members)} submitted)",
                        tool_id=tool.id,
                    )
                )
            return self._answered(tool, result)
        if job.state in ("failed", "ambiguous") and job.status is not None:
            # Ended part way (out of credits, cancelled, given up past max_wait_s): a
            # member whose result the status holds was enriched, and billed; it
            # completes with that result, by the billing rule. Only the others fail.
            result = _result_part_way(spec, job, at)
            if result is not MISSING:
                return self._answered(tool, result)
        if job.state == "failed":
            reason = job.error or "the provider reported the job failed"
            return Failed(JobFailed(f"{tool.provider} job {job.job_id}: {reason}", tool_id=tool.id))
        if job.state == "ambiguous":
            reason = job.error or "its submit was sent, no job id came back"
            err = ProviderError(
                f"{tool.provider} job {job.job_id or job.key}: {reason}",
                tool_id=tool.id,
                may_have_charged=True,
            )
            return Ambiguous(err)
        if spec.partial and job.state == "running" and job.status is not None:
            result = member_results(spec, job.status, len(job.members), done=False)[at]
            if result is not MISSING:
                return self._answered(tool, result)
        return Parked(
            JobPending(
                tool.provider,
                self._due(spec, job),
                tool_id=tool.id,
                job_id=job.job_id,
                submitted=job.state != "opened",
            )
        )

    @staticmethod
    def _answered(tool: ToolSpec, result: Any) -> Answered:
        charge = tool.charge(result)
        return Answered(result, charge.credits, charge.source)

    def _due(self, spec: JobSpec, job: Job) -> float:
        """When a running job is next worth a look (its next poll), never sooner than
        :data:`MIN_RECHECK_S` from now."""
        return max(_poll_due(spec, job), self._clock() + MIN_RECHECK_S)

    async def _settle(self, call: ClaimedCall, outcome: CallOutcome) -> Settled:
        target = SingleReceipt(self._attempt, call.key, call.payer)
        return await settle(self._attempt, target, outcome, call.tool)

    # -- looking at a job -----------------------------------------------------------

    async def _look(self, tool: ToolSpec, job: Job) -> Job:
        """The job after whatever is due now: a re-send of an unsent (or, to a provider
        that de-duplicates, maybe sent) submit, or a poll. One per job per attempt."""
        if job.state not in LIVE_STATES:
            return job
        looking = self._looks.get(job.key)
        if looking is None or (looking.done() and not self._fresh(tool, looking)):
            looking = asyncio.ensure_future(self._look_now(tool, job))
            self._looks[job.key] = looking
            self._track(looking)
        return await asyncio.shield(looking)

    async def _recheck(self, tool: ToolSpec, job: Job) -> Job:
        """One poll per attempt of a job given up ambiguous, shared by its members."""
        key = f"{job.key}#recheck"
        looking = self._looks.get(key)
        if looking is None:
            looking = asyncio.ensure_future(self._poll(tool, job))
            self._looks[key] = looking
            self._track(looking)
        return await asyncio.shield(looking)

    def _fresh(self, tool: ToolSpec, looked: asyncio.Future[Job]) -> bool:
        """Whether a finished look is still the news (no poll is due since)."""
        if looked.cancelled() or looked.exception() is not None:
            return False
        job = looked.result()
        assert tool.job is not None
        return job.state not in LIVE_STATES or _poll_due(tool.job, job) > self._clock()

    async def _look_now(self, tool: ToolSpec, job: Job) -> Job:
        spec = tool.job
        assert spec is not None
        if job.state == "opened":
            return await self._send_submit(tool, job, [])
        if job.state == "sending":
            if tool.resend_safe:
                return await self._send_submit(tool, job, [])
            reason = "the job's submit was sent and no job id came back (a crash or a cut)"
            return await self._record(job, "ambiguous", job.status, reason)
        await self._wait_on([job])
        if _poll_due(spec, job) > self._clock() and not _overdue(spec, job, self._clock()):
            return job  # polled recently (by any worker): its answer is the news
        # Due, or past ``max_wait_s``: a job is expired only by a poll made now that
        # still says it runs (never by its age alone: a job looked at late may well be
        # finished, and billed); see _poll.
        return await self._poll(tool, job)

    async def _expired(self, tool: ToolSpec, job: Job) -> Job:
        """A poll made now still says the job runs, past ``max_wait_s``: it is given up
        *ambiguous* (it may yet finish, and bill: never submitted again without
        ``retry_ambiguous``; a late webhook may still finish it). Members whose results
        its last status already holds complete with them (see _verdict)."""
        assert tool.job is not None
        state = read_state(tool.job, job.status)[0] if job.status is not None else "submitted"
        reason = (
            f"did not finish within max_wait_s = {tool.job.max_wait_s:g} s (last state: {state});"
            " it may still finish and bill: not submitted again without retry_ambiguous"
        )
        return await self._record(job, "ambiguous", job.status, reason)

    async def _poll(self, tool: ToolSpec, job: Job) -> Job:
        """Ask the provider for the job's status and keep the answer."""
        spec = tool.job
        assert spec is not None and job.job_id is not None
        status_tool, payload = status_call(tool, job.job_id)
        outcome = await self._sender.send(
            Request(
                status_tool,
                payload,
                idempotency_key=batch_idempotency_key(f"{job.key}#poll"),
                lease_keys=(),
                pacing_key=poll_pacing_key(tool.provider, spec),
                before_send=_nothing,
                poll=True,
            )
        )
        if isinstance(outcome, Answered):
            state, reason = read_state(spec, outcome.data)
            if state == "running" and _overdue(spec, job, self._clock()):
                job.status = outcome.data
                return await self._expired(tool, job)
            return await self._record(job, state, outcome.data, reason)
        status = getattr(outcome.error, "status", None) if isinstance(outcome, Failed) else None
        if status in spec.poll_pending_status:
            # "Not ready yet" told with an error status (Apollo's 404 result_pending).
            if _overdue(spec, job, self._clock()):
                return await self._expired(tool, job)
            return await self._record(job, "running", job.status, None)
        if status in spec.poll_failed_status:
            # The provider says the job failed (FullEnrich's 402: the credits ran out).
            assert isinstance(outcome, Failed)
            return await self._record(job, "failed", job.status, f"{outcome.error}"[:300])
        if status in (404, 410):
            assert isinstance(outcome, Failed)
            return await self._record(
                job, "failed", job.status, f"the provider does not know it ({outcome.error})"
            )
        # Not answered now (a transient failure after retries, the poll key parked): the
        # job is the provider's still; looked at again at the next poll.
        logger.info("poll of %s job %s: %s", tool.provider, job.job_id, _error_of(outcome))
        job.polled_at = self._clock()
        return job

    async def _record(self, job: Job, state: Any, status: Any, reason: str | None) -> Job:
        attempt = self._attempt
        stored = await attempt.durably(
            lambda: self._jobs.record_status(job.key, state=state, status=status, error=reason),
            what=f"status of job {job.key}",
        )
        return stored

    async def _wait_on(self, jobs: list[Job]) -> None:
        """Remember that this dataset run waits on these jobs (a webhook wakes it)."""
        fresh = [job.key for job in jobs if job.key not in self._waited]
        if self._waiter is None or not fresh:
            return
        waiter = self._waiter
        await self._attempt.best_effort(
            lambda: self._jobs.add_waiter(fresh, waiter), what="job waiters"
        )
        self._waited.update(fresh)

    # -- submitting -------------------------------------------------------------------

    def _enqueue(self, call: ClaimedCall) -> None:
        """Queue a claimed call for the next submit of its tool. Its receipt's lease is
        kept renewed until the submit's outcome is recorded, then released: the row,
        re-run, finds the call in its job (or, nothing sent, submits it again)."""
        tool = call.tool
        assert tool.job is not None
        hold = self._attempt.leases.holding([call.key])
        hold.__enter__()
        self._queue(tool, _Queued(call, hold), tool.job.max_items, tool.job.linger_ms)

    async def _send(self, tool: ToolSpec, members: list[_Queued]) -> None:
        """Open the job, send its submit, record the job id; then release the members'
        receipts whatever became of it (their rows read the job's state when re-run)."""
        spec = tool.job
        assert spec is not None
        attempt = self._attempt
        try:
            if spec.max_jobs_in_flight is not None:
                live = await attempt.persist(
                    self._jobs.live(tool.provider, max_age_s=_live_age_s(spec))
                )
                if live >= spec.max_jobs_in_flight:
                    logger.info("%s: %d jobs in flight, the queue's cap", tool.provider, live)
                    return  # nothing sent: the rows submit again when re-run
            opened = await attempt.persist(self._jobs.open(self._new_job(tool, members)))
            await self._send_submit(tool, opened, [m.call.key for m in members])
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the rows re-run: the ledger says what was sent
            logger.warning("submit of %d %s call(s): %s", len(members), tool.id, err)
        finally:
            keys = [m.call.key for m in members]
            for member in members:
                member.hold.__exit__(None, None, None)
            await attempt.best_effort(
                lambda: attempt.receipts.release(keys, lease_id=attempt.lease_id),
                what=f"release of {len(keys)} {tool.id} call(s)",
            )

    def _new_job(self, tool: ToolSpec, members: list[_Queued]) -> Job:
        spec = tool.job
        assert spec is not None
        token = secrets.token_urlsafe(24)
        body = submit_body(spec, [m.call.payload for m in members])
        if spec.webhook is not None and self._webhook_base:
            body = put(
                body, spec.webhook.url_field, hook_url(self._webhook_base, tool.provider, token)
            )
        return Job(
            key=f"{tool.id}#job:{uuid.uuid4().hex}",
            tool_id=tool.id,
            provider=tool.provider,
            # ``run``: the dataset run that opened it (never sent; see _submits_again)
            request={
                "method": tool.method,
                "path": tool.path,
                "body": body,
                "run": self._attempt.force_token,
            },
            members=[member_ref(m.call.key, m.call.generation) for m in members],
            token=token,
        )

    async def _send_submit(self, tool: ToolSpec, job: Job, lease_keys: list[str]) -> Job:
        """Send the job's stored submit; record the job id (or what became of it)."""
        attempt = self._attempt
        spec = tool.job
        assert spec is not None

        won = job.state == "sending"  # a re-send (resend_safe): already this caller's

        async def mark() -> None:
            # A compare-and-set: only the caller that moves the job to ``sending`` sends
            # (each retry of that caller's send passes here again and goes on).
            nonlocal won
            if not won:
                won = await attempt.persist(self._jobs.mark_submitting(job.key))
                if not won:
                    raise _LostRace

        submit_tool = tool.model_copy(update={"method": job.request.get("method", tool.method)})
        try:
            outcome = await self._sender.send(
                Request(
                    submit_tool,
                    job.request["body"],
                    idempotency_key=batch_idempotency_key(job.key),
                    lease_keys=tuple(lease_keys),
                    path=job.request.get("path"),
                    before_send=mark,
                )
            )
        except _LostRace:
            # Another caller marked it first and sends it: this one treats the job as
            # ``sending`` (not sent from here) and reads what the ledger says now.
            stored = await attempt.persist(self._jobs.get(job.key))
            return stored if stored is not None else job
        if isinstance(outcome, Answered):
            job_id = job_id_of(spec, outcome.data)
            if job_id is None:
                state = "failed" if tool.resend_safe else "ambiguous"
                reason = f"the submit's answer has no job id at {spec.job_id!r}"
                return await self._record(job, state, outcome.data, reason)
            submitted = await attempt.durably(
                lambda: self._jobs.submitted(job.key, job_id), what=f"job id of {job.key}"
            )
            await self._wait_on([submitted])
            return submitted
        if isinstance(outcome, Parked):
            return job  # nothing was sent: still ``opened``; the next look sends it
        if isinstance(outcome, Ambiguous):
            return await self._record(job, "ambiguous", None, str(outcome.error))
        assert isinstance(outcome, Failed)
        return await self._record(job, "failed", None, str(outcome.error))


def _result_part_way(spec: JobSpec, job: Job, at: int) -> Any:
    """Member ``at``'s result in the last status of a job that ended without finishing
    (``failed``/``ambiguous``), or :data:`MISSING`. Only where a result is unmistakably
    that member's: matched by ``id_field``, or, in submit order, when the status lists
    exactly one entry per member; an absent or null entry is MISSING (not known to be a
    miss: the provider never said so)."""
    count = len(job.members)
    if spec.id_field is not None:
        result = member_results(spec, job.status, count, done=False)[at]
    elif isinstance(found := dig(job.status, spec.results_field), list) and len(found) == count:
        result = found[at]
    else:
        return MISSING
    return MISSING if result is None else result


def _live_age_s(spec: JobSpec) -> float:
    """The oldest a live job may be and still count against ``max_jobs_in_flight``: a
    job whose rows still look at it is polled, and expired (or read), by then; one
    older is an orphan (its run ended with it in flight) and holds no place. (Were it
    still queued at the provider, the provider's own cap answers 429: nothing is
    charged, the rows park and submit again.)"""
    return spec.first_poll + spec.max_wait_s + spec.poll_interval_s + LIVE_MARGIN_S


def _overdue(spec: JobSpec, job: Job, now: float) -> bool:
    """Whether a running job is past its longest wait (``max_wait_s`` after its submit)."""
    return job.submitted_at is not None and now - job.submitted_at > spec.max_wait_s


class _LostRace(Exception):
    """Another caller moved the job to ``sending`` first (:meth:`JobStore.mark_submitting`)."""


def _poll_due(spec: JobSpec, job: Job) -> float:
    """When a running job's next poll is due: a poll interval after the last poll, or
    ``first_poll`` after the submit."""
    if job.polled_at is not None:
        return job.polled_at + spec.poll_interval_s
    return (job.submitted_at or job.opened_at) + spec.first_poll


async def _nothing() -> None:
    """A poll marks nothing before it is sent (it is free and safe to repeat)."""


def _error_of(outcome: CallOutcome) -> str:
    error = getattr(outcome, "error", None)
    return str(error) if error is not None else type(outcome).__name__
