"""An activity's error text never carries the worker's secrets into history.

A play's step function raises with the worker's acme API key in its message (and in
its cause's), as user code quoting its own request would. The play's failure, the
activity's recorded failure and everything else in the history show ``[redacted]``
instead; a plain exception keeps its type, its traceback and its retries, a playline
error its type and its "not retryable".
"""

from __future__ import annotations

import pytest
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, WorkflowFailureError

import playline
from playline.calls.http import REDACTED
from playline.errors import root_cause
from playline.worker import import_plays
from tests.conftest import TEST_KEYS, new_id

import_plays(["tests.plays_secrets"])

from tests.plays_secrets import SECRET_VARIABLE, LeakyInput, t_leaky_step  # noqa: E402

KEY = TEST_KEYS[SECRET_VARIABLE]


async def failed_play(client: Client, worker, task_queue: str, kind: str) -> tuple[str, Exception]:
    workflow_id = new_id(f"leaky-{kind}")
    async with worker():
        with pytest.raises(WorkflowFailureError) as failed:
            await playline.execute_play(
                client, t_leaky_step, LeakyInput(kind=kind), id=workflow_id, task_queue=task_queue
            )
    return workflow_id, failed.value


async def activity_failure(client: Client, workflow_id: str) -> tuple[Failure, int]:
    """The recorded failure of the play's one activity, and the attempt it ended on."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    assert KEY not in history.to_json(), "the key reached the play's history"
    [started] = [e for e in history.events if e.HasField("activity_task_started_event_attributes")]
    [failed] = [e for e in history.events if e.HasField("activity_task_failed_event_attributes")]
    return (
        failed.activity_task_failed_event_attributes.failure,
        started.activity_task_started_event_attributes.attempt,
    )


async def test_a_plain_exception_quoting_a_key_reaches_history_redacted_and_keeps_its_type(
    client, provider, worker, task_queue
) -> None:
    workflow_id, error = await failed_play(client, worker, task_queue, "plain")

    cause = root_cause(error)  # the play fails with its innermost cause
    assert getattr(cause, "type", None) == "ConnectionError"
    assert getattr(cause, "message", "") == f"acme closed the connection for key {REDACTED}"
    failure, attempt = await activity_failure(client, workflow_id)
    assert failure.message == f"lookup with api_key={REDACTED} failed"
    assert failure.application_failure_info.type == "ValueError"
    assert not failure.application_failure_info.non_retryable
    assert attempt == 5  # retried as a plain exception always was (SETUP_RETRY)
    assert "t_leak" in failure.stack_trace  # the traceback is still the step's own
    assert failure.cause.application_failure_info.type == "ConnectionError"
    assert failure.cause.message == f"acme closed the connection for key {REDACTED}"


async def test_a_playline_error_quoting_a_key_reaches_history_redacted(
    client, provider, worker, task_queue
) -> None:
    workflow_id, error = await failed_play(client, worker, task_queue, "playline")

    cause = root_cause(error)
    assert getattr(cause, "type", None) == "StepRefused"
    assert getattr(cause, "message", "") == (
        f"acme refused Authorization: Bearer {REDACTED}; check the account"
    )
    failure, attempt = await activity_failure(client, workflow_id)
    assert failure.application_failure_info.type == "StepRefused"
    assert failure.application_failure_info.non_retryable
    assert attempt == 1
    assert KEY not in failure.message and REDACTED in failure.message
