"""A job's status request (path, or a POST body carrying the id) and its poll statuses."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from playline.calls.catalog import JobSpec
from playline.calls.job_status import status_request

BASE: dict[str, Any] = {
    "job_id": "item._id",
    "status_path": "/jobs/{job_id}",
    "state_field": "status",
    "done": ["DONE"],
    "running": ["NONE"],
    "results_field": "results",
}


def job(**changes: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, **changes})


def test_the_id_goes_quoted_in_the_path() -> None:
    assert status_request(job(), "a/b c") == ("/jobs/a%2Fb%20c", {})


def test_a_post_status_body_carries_the_id_as_is() -> None:
    spec = job(
        status_method="POST",
        status_path="/api/bulk-single-searchs/read",
        status_body={"id": "{job_id}", "mode": "single", "ids": ["{job_id}"]},
    )
    path, body = status_request(spec, "a/b")
    assert path == "/api/bulk-single-searchs/read"
    assert body == {"id": "a/b", "mode": "single", "ids": ["a/b"]}
    assert spec.status_body == {"id": "{job_id}", "mode": "single", "ids": ["{job_id}"]}


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"status_path": "/jobs"}, "must contain {job_id}"),
        ({"status_path": "/jobs", "status_body": {"id": "x"}, "status_method": "POST"}, "{job_id}"),
        ({"status_body": {"id": "{job_id}"}}, "status_method = POST"),
        ({"poll_pending_status": [429]}, "poll_pending_status 429"),
        ({"poll_failed_status": [500]}, "poll_failed_status 500"),
        ({"poll_pending_status": [404], "poll_failed_status": [404]}, "overlap"),
    ],
)
def test_a_status_request_that_cannot_work_is_refused(
    changes: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        job(**changes)
    assert problem in str(refused.value)
