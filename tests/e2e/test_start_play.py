"""Starting plays from Python by their class: typed results, preview rows, early input errors."""

from __future__ import annotations

import pytest

import playline
from playline.contract import RunOptions
from playline.errors import InvalidPlayInput
from tests.conftest import new_id
from tests.payloads import history_text
from tests.plays import ToolColumnInput, ToolColumnOutput, lead, t_tool_column, write_csv


async def test_start_play_returns_the_plays_own_output_model(
    client, provider, worker, task_queue, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(7)])
    workflow_id = new_id("typed")
    async with worker():
        handle = await playline.start_play(
            client,
            t_tool_column,
            ToolColumnInput(csv_path=str(csv_path)),
            id=workflow_id,
            task_queue=task_queue,
        )
        result = await handle.result()
        again = await playline.get_play_handle(client, t_tool_column, workflow_id).result()

    assert handle.id == workflow_id
    assert isinstance(result.output, ToolColumnOutput)
    assert result.output.rows == 7 and result.output.rows_failed == 0
    assert len(result.output.preview) == 5
    assert result.stats.calls_made == 7
    assert again.output == result.output


async def test_preview_rows_zero_keeps_every_row_out_of_history(
    client, provider, worker, task_queue, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(7)])
    ids = {"default": new_id("preview5"), "off": new_id("preview0")}
    async with worker():
        default = await playline.execute_play(
            client,
            t_tool_column,
            ToolColumnInput(csv_path=str(csv_path)),
            id=ids["default"],
            task_queue=task_queue,
        )
        off = await playline.execute_play(
            client,
            t_tool_column,
            ToolColumnInput(csv_path=str(csv_path)),
            options=RunOptions(preview_rows=0),
            id=ids["off"],
            task_queue=task_queue,
        )
    histories = {
        name: history_text(await client.get_workflow_handle(wid).fetch_history())
        for name, wid in ids.items()
    }

    assert default.output is not None and len(default.output.preview) == 5
    assert off.output is not None and off.output.preview == []
    assert [d.preview for d in off.datasets] == [[]]
    assert off.output.rows == 7
    # Last names of the leads ("Ln0".."Ln6"): present by default, absent with 0.
    assert "Ln0" in histories["default"]
    assert not any(f"Ln{i}" in histories["off"] for i in range(7))


async def test_start_play_rejects_a_bad_input_before_starting_anything(client, task_queue) -> None:
    workflow_id = new_id("bad-input")
    with pytest.raises(InvalidPlayInput, match=r"invalid input for play 't_tool_column'.*csv_path"):
        await playline.start_play(
            client,
            t_tool_column,
            ToolColumnInput.model_construct(column_tool="email"),
            id=workflow_id,
            task_queue=task_queue,
        )
    assert [w async for w in client.list_workflows(f'WorkflowId="{workflow_id}"')] == []
