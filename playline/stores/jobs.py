"""The job ledger: asynchronous provider jobs (submit, then poll or webhook), durably.

An asynchronous tool (a catalog tool with a ``job`` table, see
:mod:`playline.calls.jobs`) does not answer its calls: it takes them as a *job*,
returns the job's id, and finishes seconds to minutes later. Each job is one row
here, keyed like a bulk aggregate (``<tool>#job:<digest of its members>``), with
its members (the receipt keys of the calls it carries, in submit order) indexed so a
call finds the job it is in.

The ledger is what makes a submit at most once:

1. :meth:`JobStore.open` records the job, its exact submit request and its members
   *before* the request is sent (state ``opened``); an attempt that finds a member
   already in an opened job re-sends that same request (an idempotent provider) or
   declares it ambiguous, never forms a new job from the same calls;
2. :meth:`JobStore.mark_submitting` marks it ``sending`` just before the request
   goes out (a crash after it: the submit may have reached the provider);
3. :meth:`JobStore.submitted` records the provider's job id as soon as the answer
   arrives, before anything else happens (state ``running``); every later attempt
   polls that job and never submits again;
4. a status answer (a poll, or a webhook delivery) is kept by
   :meth:`JobStore.record_status` (state ``running``, ``done`` or ``failed``), so the
   rows re-run after it read the job's results from here, whichever worker polled.

A job is never deleted by playline; its members' receipts hold each member's value
once it is done. Webhook deliveries carry no delivery id, so they are de-duplicated
by ``(job, status digest)`` (:meth:`JobStore.record_delivery`).

One implementation serves both databases: :mod:`~playline.stores.jobs_ledger`
(``DIR/jobs.db`` on SQLite, the fleet's database on PostgreSQL).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, cast

from playline.errors import UnknownJob
from playline.stores.rows import record_columns, record_from_row, record_values

__all__ = [
    "FINISHED_STATES",
    "JOB_COLUMNS",
    "JOB_STATES",
    "LIVE_STATES",
    "Job",
    "JobCounts",
    "JobState",
    "JobStore",
    "UnknownJob",
    "check_state",
    "job_from_row",
    "job_values",
    "member_ref",
    "new_token",
    "opened",
    "status_applied",
    "submitted_applied",
    "unknown_job",
]

#: ``opened``: recorded, not sent; ``sending``: the submit may have reached the
#: provider, no job id yet; ``running``: submitted, the provider's job id known;
#: ``done`` / ``failed``: finished (``failed`` also for a job that outlived its
#: longest wait); ``ambiguous``: sent, no job id came back, not safe to re-send.
JobState = Literal["opened", "sending", "running", "done", "failed", "ambiguous"]
JOB_STATES: tuple[str, ...] = ("opened", "sending", "running", "done", "failed", "ambiguous")
#: States in which a job is still the provider's (counts against its jobs in flight).
LIVE_STATES: tuple[str, ...] = ("opened", "sending", "running")
#: States in which a job is over (``finished_at`` is set on entering the first of them).
FINISHED_STATES: tuple[str, ...] = ("done", "failed", "ambiguous")


def member_ref(receipt_key: str, generation: int = 0) -> str:
    """The name of one member call in the ledger: its receipt key, and the claim's
    generation when it is not the first (a member claimed again for a fresh answer is
    a new call, in a new job)."""
    return receipt_key if generation == 0 else f"{receipt_key}#{generation}"


@dataclass
class Job:
    """One provider job and what playline knows of it."""

    #: ``<tool id>#job:<digest>``, from its members (:func:`playline.calls.jobs.job_key`)
    key: str
    tool_id: str
    provider: str
    #: the exact submit request: ``{"method", "path", "body"}`` (no secret: auth is
    #: added when it is sent)
    request: dict[str, Any]
    #: the members' refs (:func:`member_ref`), in submit order
    members: list[str]
    state: JobState = "opened"
    #: the provider's job id (known from ``running`` on)
    job_id: str | None = None
    #: a per-job secret for webhook URLs (random; it never leaves playline and the provider)
    token: str = ""
    opened_at: float = 0.0
    submitted_at: float | None = None
    polled_at: float | None = None
    finished_at: float | None = None
    #: the last status answer (a poll's body, or a webhook's), JSON
    status: Any = None
    #: why it failed (``failed``/``ambiguous``)
    error: str | None = None
    #: workflow ids of dataset runs waiting on it (a webhook delivery signals them)
    waiters: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class JobCounts:
    """One provider's jobs, for the run status and ``runs get``."""

    provider: str
    pending: int  # opened, sending or running
    finished: int  # done
    failed: int  # failed or ambiguous
    #: when the oldest pending job was opened (None: none pending)
    oldest_pending_at: float | None


class JobStore(Protocol):
    """Where jobs are kept; see the module docstring for the order of the steps."""

    async def open(self, job: Job) -> Job:
        """Record ``job`` and index its members, unless a job with its key exists:
        then return the stored one unchanged (the caller re-uses it). ``opened_at``
        is the store's clock when 0 and ``token`` a fresh random one when empty; the
        job as stored is returned. Atomic: of two opens of one key, one inserts (and
        indexes the members) and the other gets its job."""
        ...

    async def mark_submitting(self, key: str) -> bool:
        """``opened`` -> ``sending``, just before the submit is sent: a compare-and-set.

        True when this caller moved the job to ``sending`` (it, and only it, sends the
        submit); False when the job was in any other state, left as it is (another
        caller won, or it is past sending: the loser treats it as ``sending`` and does
        not send). :class:`UnknownJob` if there is no such job."""
        ...

    async def submitted(self, key: str, job_id: str) -> Job:
        """Record the provider's job id (state ``running``, ``submitted_at`` now).

        Idempotent: a job id already known is kept, ``submitted_at`` is set once, and
        a finished job stays finished (only a missing job id is filled in).
        :class:`UnknownJob` if there is no such job."""
        ...

    async def record_status(
        self, key: str, *, state: JobState, status: Any, error: str | None = None
    ) -> Job:
        """Keep a status answer (``polled_at`` now; ``finished_at`` now when ``state``
        is ``done``/``failed``/``ambiguous``). A finished job stays finished: a later
        call with a live state only updates ``status``/``polled_at`` if it is live.

        In full (:func:`status_applied`): a live job takes any state; a ``failed`` or
        ``ambiguous`` job takes a later finished answer (a late webhook may still say
        ``done``) but never a live one; a ``done`` job is final (its status holds the
        results its members read) and is returned unchanged. ``finished_at`` is set
        once, by the first finished state. :class:`UnknownJob` if there is no such job.
        """
        ...

    async def jobs_of(self, members: Sequence[str]) -> dict[str, Job]:
        """The latest job each member ref is in (members in none are absent): the one
        opened last, of two opened at the same time the one recorded last."""
        ...

    async def get(self, key: str) -> Job | None: ...

    async def by_job_id(self, provider: str, job_id: str) -> Job | None:
        """The job the provider calls ``job_id`` (a webhook names it this way); the
        latest opened if the provider re-used an id."""
        ...

    async def by_token(self, token: str) -> Job | None:
        """The job whose per-job secret is ``token`` (a per-job callback URL); None
        for an empty token."""
        ...

    async def add_waiter(self, keys: Sequence[str], workflow_id: str) -> None:
        """Remember that ``workflow_id`` waits on these jobs (idempotent; keys of no
        job are skipped)."""
        ...

    async def record_delivery(self, key: str, digest: str) -> bool:
        """Record one webhook delivery of job ``key`` (``digest``: of its status and
        body). True the first time; False for a duplicate delivery."""
        ...

    async def live(self, provider: str, *, max_age_s: float | None = None) -> int:
        """How many of ``provider``'s jobs are live (opened, sending or running); with
        ``max_age_s``, only those opened at most that long ago (the store's clock): a
        live job older than its longest wait is one whose rows are gone (a run ended
        with it in flight), not one the provider still queues, so it must not hold
        a place in ``max_jobs_in_flight`` for ever."""
        ...

    async def counts(self, waiter: str | None = None) -> list[JobCounts]:
        """Per provider, sorted by name: pending, finished, failed, oldest pending; of
        every job, or only of those ``waiter`` (a dataset run's workflow id) waits on."""
        ...

    async def unread(self, waiters: Sequence[str]) -> list[str]:
        """Jobs the dataset runs ``waiters`` waited on that are still live at the
        provider (it bills them when they finish; nobody has read them): one line each,
        ``"<provider> job <id>: <state>"`` (a run's audit)."""
        ...

    async def submitted_twice(self, waiters: Sequence[str]) -> list[str]:
        """Members of the jobs ``waiters`` waited on that were submitted in more than one
        job the provider took (neither failed nor never sent): a run's audit."""
        ...

    async def close(self) -> None: ...


# ------------------------------------------------------------ shared by the backends

#: The ``jobs`` table's columns: :class:`Job`'s fields, in order.
JOB_COLUMNS: tuple[str, ...] = record_columns(Job)
#: The columns of a job that hold JSON (:func:`~playline.stores.receipts.stored_json` text).
_JOB_JSON = frozenset({"request", "members", "status", "waiters"})


def check_state(state: str) -> JobState:
    """``state`` if it is one of :data:`JOB_STATES`, else ``ValueError``."""
    if state not in JOB_STATES:
        raise ValueError(f"job state {state!r} is not one of {', '.join(JOB_STATES)}")
    return cast(JobState, state)


def new_token() -> str:
    """A fresh per-job secret (URL-safe)."""
    return secrets.token_urlsafe(24)


def opened(job: Job, now: float) -> Job:
    """``job`` as :meth:`JobStore.open` stores it: ``opened_at`` ``now`` when 0, a
    fresh token when it has none, each waiter once."""
    check_state(job.state)
    return replace(
        job,
        members=list(job.members),
        token=job.token or new_token(),
        opened_at=job.opened_at or now,
        waiters=list(dict.fromkeys(job.waiters)),
    )


def submitted_applied(job: Job, job_id: str, now: float) -> Job | None:
    """``job`` with the provider's ``job_id`` recorded (see
    :meth:`JobStore.submitted`); None when nothing changes."""
    state: JobState = "running" if job.state in ("opened", "sending") else job.state
    changed = replace(
        job,
        state=state,
        job_id=job.job_id if job.job_id is not None else job_id,
        submitted_at=job.submitted_at if job.submitted_at is not None else now,
    )
    return None if changed == job else changed


def status_applied(
    job: Job, state: JobState, status: Any, error: str | None, now: float
) -> Job | None:
    """``job`` with a status answer kept (see :meth:`JobStore.record_status`); None
    when the job does not take it (a ``done`` job, or a live answer for a finished one)."""
    check_state(state)
    if job.state == "done" or (job.state in FINISHED_STATES and state in LIVE_STATES):
        return None
    finished_at = job.finished_at
    if state in FINISHED_STATES and finished_at is None:
        finished_at = now
    return replace(
        job, state=state, status=status, error=error, polled_at=now, finished_at=finished_at
    )


def job_values(job: Job) -> tuple[Any, ...]:
    """The row of :data:`JOB_COLUMNS` that stores ``job``."""
    return record_values(job, _JOB_JSON)


def job_from_row(row: Sequence[Any]) -> Job:
    """The job a row of :data:`JOB_COLUMNS` stores (``ValueError`` for an unknown state)."""
    job = record_from_row(Job, row, _JOB_JSON)
    check_state(job.state)
    return job


def unknown_job(key: str) -> UnknownJob:
    return UnknownJob(
        f"no job {key!r} in the job ledger; a job is opened (JobStore.open) before it is used"
    )
