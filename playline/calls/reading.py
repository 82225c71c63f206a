"""``ReadingDispatcher``: a cancelled run reads what it paid for and sends nothing new.

When a run is cancelled while rows wait on provider jobs, those jobs are billed (or
will be) whatever happens next, so the run re-runs the rows that wait on them to read
their answers into the sheet. Those re-runs must not spend anything new: this
dispatcher, outermost in the chunk's chain, lets a call through only when it reads a
job already submitted for it (the job dispatcher polls it or reads its answer), and
refuses every other call before anything is reserved or sent with
:class:`~playline.errors.NotSentCancelled` (its receipt claim is released, so a later
run sends it as usual).
"""

from __future__ import annotations

from playline.calls.attempt import Attempt
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import ClaimedCall, Dispatcher, Settled
from playline.errors import NotSentCancelled
from playline.stores.jobs import JobStore, member_ref

__all__ = ["ReadingDispatcher"]


class ReadingDispatcher:
    """Passes on calls that read a submitted job; refuses the rest (see the module).

    Args:
        inner: the chain that settles calls (budgets, live, jobs).
        attempt: the chunk attempt (its leases and store breaker).
        jobs: the job ledger, which says whether a call's job was submitted.
    """

    def __init__(self, inner: Dispatcher, attempt: Attempt, jobs: JobStore) -> None:
        self.inner = inner
        self._attempt = attempt
        self._jobs = jobs

    def auth_scope(self, tool: ToolSpec) -> str:
        return self.inner.auth_scope(tool)

    async def settle(self, call: ClaimedCall) -> Settled:
        if await self._submitted(call):
            return await self.inner.settle(call)
        attempt = self._attempt
        await attempt.best_effort(
            lambda: attempt.receipts.release([call.key], lease_id=attempt.lease_id),
            what=f"release of {call.key}",
        )
        raise NotSentCancelled(call.tool.id)

    async def _submitted(self, call: ClaimedCall) -> bool:
        """Whether the call's job was sent (or may have been: ``sending``) and not given
        up: reading it costs nothing new. A job only ``opened`` was never sent."""
        if call.tool.job is None:
            return False
        ref = member_ref(call.key, call.generation)
        found = await self._attempt.persist(self._jobs.jobs_of([ref]))
        job = found.get(ref)
        return job is not None and job.state in ("sending", "running", "done")

    async def aclose(self) -> None:
        await self.inner.aclose()

    def abort(self) -> None:
        self.inner.abort()
