"""Determinism: recorded histories replay against the current workflow code.

If this fails after an intentional workflow change, guard the change with
``workflow.patched`` or re-record with ``python tests/histories/record.py`` and say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from playline.errors import PlaylineError
from playline.plugin import PlaylinePlugin
from playline.replay import history_files, load_history
from playline.testing import assert_replays, replay_files

HISTORIES = sorted((Path(__file__).parent.parent / "histories").glob("*.json"))


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path) -> None:
    document = json.loads(path.read_text())
    history = WorkflowHistory.from_json(document["workflow_id"], document["history"])
    replayer = Replayer(workflows=[], plugins=[PlaylinePlugin()])
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


def test_histories_are_recorded() -> None:
    assert {p.stem for p in HISTORIES} >= {"enrich_leads", "dataset_run"}


def test_histories_hold_no_api_keys_and_no_rows_beyond_the_preview() -> None:
    for path in HISTORIES:
        text = path.read_text()
        assert "record-acme" not in text and "record-firmo" not in text
        # 12 leads were processed; only the 5 preview rows may appear in history.
        assert text.count("L0012") == 0, f"{path.name} carries rows"


# -- the replay helpers users get (playline.testing, playline.replay) ---------

HISTORIES_DIR = Path(__file__).parent.parent / "histories"


async def test_recorded_histories_replay_through_the_users_helper() -> None:
    outcomes = await assert_replays(HISTORIES_DIR)
    assert [o.verdict for o in outcomes] == ["ok"] * len(HISTORIES)
    assert {o.workflow_type for o in outcomes} == {"enrich_leads", "playline.DatasetRun"}
    assert {o.source for o in outcomes} == {str(p) for p in HISTORIES}


async def test_a_play_that_was_not_imported_is_reported_with_what_to_do() -> None:
    [outcome] = await replay_files(HISTORIES_DIR / "enrich_leads.json", plays=[])
    assert outcome.verdict == "unregistered"
    assert outcome.message == (
        "workflow type 'enrich_leads' is not registered: import the module that declares it "
        "first (playline replay --plays mypkg.plays)"
    )
    with pytest.raises(AssertionError, match="1 of 1 recorded histories no longer replay"):
        await assert_replays(HISTORIES_DIR / "enrich_leads.json", plays=[])


def test_a_history_loads_from_a_temporal_export_or_a_wrapped_document(tmp_path) -> None:
    document = json.loads((HISTORIES_DIR / "enrich_leads.json").read_text())
    exported = tmp_path / "exported.json"
    exported.write_text(json.dumps(document["history"]))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps(document))

    from_export, from_wrapped = load_history(exported), load_history(wrapped)
    assert from_wrapped.workflow_id == document["workflow_id"]
    # An export has only events: the id is the one the server recorded, else the file's stem.
    assert from_export.workflow_id in (document["workflow_id"], "exported")
    assert from_export.events == from_wrapped.events


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "is not JSON"),
        ('{"a": 1}', "holds no events"),
        ('{"events": []}', "holds no events"),
        ('{"events": [{"eventId": "x"}]}', "is not a Temporal history"),
        ('{"events": [{"eventId": "1"}]}', "does not start a workflow"),
    ],
)
def test_a_bad_history_file_is_a_one_line_error(tmp_path, content: str, problem: str) -> None:
    path = tmp_path / "h.json"
    path.write_text(content)
    with pytest.raises(PlaylineError, match=problem):
        load_history(path)


def test_a_directory_without_histories_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(PlaylineError, match="holds no"):
        history_files(tmp_path)
    with pytest.raises(PlaylineError, match="no such directory"):
        history_files(tmp_path / "missing")
