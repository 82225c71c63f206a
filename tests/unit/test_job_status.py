"""Reading asynchronous providers' answers: job ids, states, members' results."""

from __future__ import annotations

import pytest

from playline.calls.catalog import Catalog, JobSpec, poll_pacing_key
from playline.calls.job_status import MISSING, job_id_of, member_results, put, read_state
from playline.errors import CatalogError

FULLENRICH = JobSpec(
    items_field="datas",
    max_items=100,
    id_field="custom.playline_id",
    job_id="enrichment_id",
    status_path="/bulk/{job_id}",
    state_field="status",
    done=("FINISHED",),
    running=("CREATED", "IN_PROGRESS"),
    failed=("CANCELED",),
    results_field="datas",
    partial=True,
)
DROPCONTACT = JobSpec(
    items_field="data",
    max_items=250,
    job_id="request_id",
    status_path="/batch/{job_id}",
    state_field="success",
    done=(True,),
    running=(False,),
    error_field="error",
    reason_field="reason",
    results_field="data",
)


def test_the_job_id_is_read_where_the_tool_says_and_nothing_else_passes_for_one() -> None:
    assert job_id_of(FULLENRICH, {"enrichment_id": "e-1"}) == "e-1"
    assert job_id_of(DROPCONTACT, {"request_id": 42}) == "42"
    for answer in ({}, {"enrichment_id": ""}, {"enrichment_id": True}, [], None):
        assert job_id_of(FULLENRICH, answer) is None


def test_states_by_value_and_type_a_json_true_is_not_a_1() -> None:
    assert read_state(FULLENRICH, {"status": "FINISHED"}) == ("done", None)
    assert read_state(FULLENRICH, {"status": "IN_PROGRESS"}) == ("running", None)
    assert read_state(FULLENRICH, {"status": "CANCELED"})[0] == "failed"
    # "not ready" with a 200 is running by the same rule
    not_ready = {"success": False, "reason": "Request not ready yet"}
    assert read_state(DROPCONTACT, not_ready) == ("running", None)
    assert read_state(DROPCONTACT, {"success": True, "data": []}) == ("done", None)
    state, reason = read_state(DROPCONTACT, {"success": 1, "reason": "odd"})
    assert state == "failed" and reason is not None and "odd" in reason
    # an error fails the job although its state alone would read "running"
    state, reason = read_state(DROPCONTACT, {"success": False, "error": True, "reason": "bad"})
    assert state == "failed" and reason is not None and "bad" in reason


def test_members_match_by_id_as_they_land_and_a_finished_job_without_one_is_a_miss() -> None:
    answer = {"datas": [{"custom": {"playline_id": "2"}, "contact": {"x": 1}}]}
    running = member_results(FULLENRICH, answer, 3, done=False)
    assert running[0] is MISSING and running[1] is MISSING and running[2]["contact"] == {"x": 1}
    done = member_results(FULLENRICH, answer, 3, done=True)
    assert done[:2] == [None, None] and done[2]["contact"] == {"x": 1}


def test_members_by_order_need_a_finished_job_with_one_result_each() -> None:
    answer = {"success": True, "data": [{"email": "a"}, {"email": "b"}]}
    assert member_results(DROPCONTACT, answer, 2, done=True) == [{"email": "a"}, {"email": "b"}]
    assert member_results(DROPCONTACT, answer, 3, done=True) == [MISSING] * 3
    assert member_results(DROPCONTACT, answer, 2, done=False) == [MISSING] * 2


def test_put_builds_nested_paths_without_touching_the_original() -> None:
    item = {"firstname": "A", "custom": {"crm": "7"}}
    out = put(item, "custom.playline_id", "3")
    assert out == {"firstname": "A", "custom": {"crm": "7", "playline_id": "3"}}
    assert item == {"firstname": "A", "custom": {"crm": "7"}}


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"status_path": "/x"}, "{job_id}"),
        ({"max_items": 5, "items_field": None}, "items_field"),
        ({"partial": True, "id_field": None}, "id_field"),
    ],
)
def test_a_job_table_that_cannot_work_is_rejected_with_the_reason(
    job: dict[str, object], message: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    base = {
        "items_field": "items",
        "max_items": 2,
        "job_id": "id",
        "status_path": "/s/{job_id}",
        "state_field": "state",
        "done": ["done"],
        "running": ["running"],
        "results_field": "results",
    }
    spec = {**base, **job}
    lines = ["[providers.p]", 'base_url = "http://x"', "[tools.t]", 'provider = "p"', 'path = "/j"']
    lines.append("[tools.t.job]")
    for name, value in spec.items():
        if value is None:
            continue
        literal = f'"{value}"' if isinstance(value, str) else str(value).lower()
        if isinstance(value, list):
            literal = "[" + ", ".join(f'"{v}"' for v in value) + "]"
        lines.append(f"{name} = {literal}")
    path = tmp_path / "catalog.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CatalogError, match="job"):
        Catalog.from_toml(path)


def test_the_presets_load_and_pace_polls_on_the_submits_account_limit() -> None:
    """G15: FullEnrich's 60/min is per account: its polls are paced on the same key as
    its submits (no second key doubling the rate); likewise Dropcontact's 60/s."""
    catalog = Catalog.model_validate({"include": ["fullenrich", "dropcontact"]})
    policies = catalog.pacing_policies()
    assert "fullenrich:poll" not in policies and "dropcontact:poll" not in policies
    for tool_id in ("fullenrich_contact", "dropcontact_contact"):
        tool = catalog.tools[tool_id]
        assert poll_pacing_key(tool.provider, tool.job) == tool.provider
    assert policies["fullenrich"].per_minute == 60
    assert policies["dropcontact"].sustained_rps() == 60
    job = catalog.tools["fullenrich_contact"].job
    assert job is not None and job.webhook is not None
    assert job.max_jobs_in_flight is not None and job.max_items * job.max_jobs_in_flight == 100
    assert job.webhook.signature == "hmac-sha1"
