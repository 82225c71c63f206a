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

from playline.plugin import PlaylinePlugin

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
