"""Starting a play from Python is typed end to end: mypy --strict on user-style modules.

A user's module is written to a temporary directory and checked with ``mypy --strict``
the way a user's CI would (playline's own modules are followed silently: their
types are used, their own findings are ``mypy playline``'s business). The clean
module must pass and mypy must see ``result.output`` as the play's output model;
the broken one must fail exactly where the input or the output is misused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

CLEAN = '''
"""Start the demo play by its class, three ways, and read its typed output."""

from temporalio.client import Client

import playline
from playline import RunOptions
from playline.demo.enrich_leads import EnrichLeadsInput, EnrichLeadsOutput, enrich_leads


async def rows_enriched(client: Client, csv_path: str) -> int:
    handle = await playline.start_play(
        client,
        enrich_leads,
        EnrichLeadsInput(csv_path=csv_path),
        options=RunOptions(preview_rows=0),
        id="leads-1",
    )
    result = await handle.result()
    reveal_type(result.output)
    output: EnrichLeadsOutput | None = result.output
    return output.rows if output is not None else 0


async def failed_rows(client: Client) -> int:
    result = await playline.execute_play(client, enrich_leads, EnrichLeadsInput(csv_path="/x"))
    return result.output.rows_failed if result.output else 0


async def by_run_method(client: Client) -> list[str]:
    result = await client.execute_workflow(
        enrich_leads.run, EnrichLeadsInput(csv_path="/x"), id="leads-2", task_queue="playline"
    )
    again = await playline.get_play_handle(client, enrich_leads, "leads-2").result()
    return [result.play, again.play]
'''

BROKEN = """
from pydantic import BaseModel
from temporalio.client import Client

import playline
from playline.demo.enrich_leads import EnrichLeadsInput, enrich_leads


class SomethingElse(BaseModel):
    domain: str


async def wrong_input(client: Client) -> None:
    await playline.start_play(client, enrich_leads, SomethingElse(domain="x"))


async def wrong_output(client: Client) -> int:
    result = await playline.execute_play(client, enrich_leads, EnrichLeadsInput(csv_path="/x"))
    return result.output.rows
"""


def mypy_strict(tmp_path: Path, name: str, source: str) -> subprocess.CompletedProcess[str]:
    module = tmp_path / f"{name}.py"
    module.write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(REPO / ".mypy_cache" / "typed-client-test"),
            str(module),
        ],
        cwd=tmp_path,
        # The editable install is an import hook mypy cannot follow; a user's
        # installed wheel is a plain package. MYPYPATH points at the same sources.
        env={**os.environ, "MYPYPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_user_module_starting_plays_by_class_is_clean_under_mypy_strict(tmp_path) -> None:
    checked = mypy_strict(tmp_path, "user_client", CLEAN)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert 'Revealed type is "playline.demo.enrich_leads.EnrichLeadsOutput | None"' in (
        checked.stdout
    )


def test_mypy_strict_rejects_a_wrong_input_model_and_an_unchecked_output(tmp_path) -> None:
    checked = mypy_strict(tmp_path, "user_broken", BROKEN)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, checked.stdout
    wrong_input, wrong_output = errors
    # The play fixes the input model: another model cannot be the play's input.
    assert "user_broken.py:14:" in wrong_input and 'type parameter "InputT"' in wrong_input
    # The output is the play's model or None: reading it unchecked is an error.
    assert "user_broken.py:19:" in wrong_output and "[union-attr]" in wrong_output
    assert "EnrichLeadsOutput | None" in wrong_output
