"""Every preset tool from a play (real Temporal, real SQLite) against the contract server.

The catalog includes every preset, its providers pointed at the contract server, which
answers each tool's documented found answer and checks every request playline sends
(submits, bulk requests and polls included). Job tools keep their preset's fields and
states; only their poll and linger times are shortened so the test does not wait 45 s.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from playline.calls.catalog import load_preset, preset_names
from playline.calls.provenance import run_spend
from playline.config import Settings
from playline.services import Services
from tests.contracts.contract import preset_catalog, preset_tools, tool_contracts
from tests.contracts.server import KEY_PREFIX, ContractServer, contract_server
from tests.plays import export_rows, run
from tests.plays_contracts import expected_value

#: Job timings a test can wait for (the presets' are the providers' 30 s and more).
QUICK_JOB = {"poll_interval_s": 0.3, "first_poll_s": 0.3, "linger_ms": 200}


def _toml(value: Any) -> str:
    """A TOML inline value (strings as JSON strings, which TOML reads the same)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def catalog_text() -> str:
    """Every preset included; each job tool's table again with quick poll times."""
    lines = [f"include = {_toml(preset_names())}"]
    for name in preset_names():
        for tool_id, table in load_preset(name).get("tools", {}).items():
            if "job" not in table:
                continue
            table = {**table, "job": {**table["job"], **QUICK_JOB}}
            lines.append(f"\n[tools.{tool_id}]")
            lines += [f"{key} = {_toml(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def server() -> Iterator[ContractServer]:
    with contract_server() as running:
        yield running


@pytest.fixture
def contracted(server: ContractServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every preset provider at the contract server, every tool answering found."""
    for name, provider in preset_catalog().providers.items():
        assert provider.base_url_env and provider.auth is not None
        monkeypatch.setenv(provider.base_url_env, server.base_url(name))
        for env in provider.key_envs():
            monkeypatch.setenv(env, KEY_PREFIX + name)
    for tool_id, (_, contract) in tool_contracts().items():
        found = next(n for n, a in contract.answers.items() if a.outcome == "hit")
        server.answer(tool_id, found, alone=False)
    path = tmp_path / "contracts.toml"
    path.write_text(catalog_text())
    return path


async def test_every_preset_tool_runs_in_a_play_against_its_documents(
    client, server, contracted, worker, task_queue, home, tmp_path
) -> None:
    tools = sorted(preset_tools())
    csv_path = tmp_path / "leads.csv"
    csv_path.write_text("lead_id\nL1\nL2\n")
    async with worker(catalog_path=str(contracted)):
        result = await run(
            client,
            "t_contract_tools",
            {"csv_path": str(csv_path), "tools": tools},
            task_queue=task_queue,
            timeout_s=120,
        )
    assert server.violations == [], "a request departs from its provider's documents"
    assert result.stats.rows_ok == 2 and result.stats.rows_failed == 0
    run_ref = result.datasets[0].run_ref
    exported = await export_rows(home, run_ref, tmp_path / "out.csv")
    rows = list(csv.DictReader(io.StringIO(exported.decode())))
    for tool_id in tools:
        _, value = expected_value(tool_id)
        shown = value if isinstance(value, str) else json.dumps(value)  # as a CSV cell
        assert {row[tool_id] for row in rows} == {shown}, tool_id
    # Both rows send the same input: one call per tool, answered once, billed once.
    services = await Services.open(Settings.from_env(home=home))
    try:
        spend = await run_spend(services.sheet, run_ref)
    finally:
        await services.close()
    by_provider: dict[str, float] = {}
    for tool_id in tools:
        provider, contract = tool_contracts()[tool_id]
        found = next(a for a in contract.answers.values() if a.outcome == "hit")
        by_provider[provider] = by_provider.get(provider, 0.0) + (found.credits or 0.0)
    for provider, credits in by_provider.items():
        assert spend.by_provider.get(provider, 0.0) == pytest.approx(credits), provider
