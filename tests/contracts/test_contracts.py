"""Every preset tool, sent as playline sends it, against its provider's documents.

For each documented answer of each tool (``tests/contracts/<provider>.toml``): the
contract server answers with the provider's example and checks the request playline
built; playline must classify the answer as documented, its getters must read the
documented values and its billing rule must charge the documented credits. A preset
tool without a contract fails here, so every preset added is covered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from playline.calls.catalog import Catalog
from playline.calls.http import ProviderClient
from playline.reconcile.read import read_balance
from tests.contracts.calls import call
from tests.contracts.contract import (
    cases,
    contract_of,
    contracts,
    preset_catalog,
    preset_tools,
    tool_contracts,
)
from tests.contracts.server import KEY_PREFIX, ContractServer, contract_server


@pytest.fixture(scope="module")
def server() -> Iterator[ContractServer]:
    with contract_server() as running:
        yield running


def environ_for(server: ContractServer, catalog: Catalog) -> dict[str, str]:
    """Each provider's base URL pointed at the contract server, and its key."""
    environ: dict[str, str] = {}
    for name, provider in catalog.providers.items():
        if provider.base_url_env:
            environ[provider.base_url_env] = server.base_url(name)
        for env in provider.key_envs():
            environ[env] = KEY_PREFIX + name
    return environ


@pytest.fixture
async def client(server: ContractServer) -> AsyncIterator[ProviderClient]:
    catalog = preset_catalog()
    async with httpx.AsyncClient() as http:
        yield ProviderClient(catalog, http, environ=environ_for(server, catalog))


def test_every_preset_tool_has_a_contract_and_every_contract_a_preset_tool() -> None:
    presets = set(preset_tools())
    documented = set(tool_contracts())
    assert not presets - documented, (
        f"preset tools without a contract in tests/contracts/: {sorted(presets - documented)}"
    )
    assert not documented - presets, (
        f"contracts of tools no preset declares: {sorted(documented - presets)}"
    )


@pytest.mark.parametrize("tool_id", sorted(tool_contracts()))
def test_the_preset_is_written_to_the_documented_endpoint(tool_id: str) -> None:
    provider_name, contract = tool_contracts()[tool_id]
    _, tool, provider = preset_tools()[tool_id]
    assert tool.provider == provider_name
    assert provider.base_url == contract_of(tool_id).base_url
    assert provider.auth is not None
    assert provider.auth.query == contract.auth.query
    assert (provider.auth.header or "").lower() == (contract.auth.header or "").lower()
    assert provider.auth.scheme == contract.auth.scheme
    assert (tool.method, tool.path) == (contract.method, contract.path)
    assert (tool.batch is None, tool.job is None) == (
        contract.batch is None,
        contract.job is None,
    ), "a bulk or job tool's contract documents its bulk endpoint or job"
    if tool.batch is not None:
        assert contract.batch is not None
        assert tool.batch.path == contract.batch.path
        assert tool.batch.items_field == contract.batch.items_field
        assert tool.batch.max_items <= contract.batch.max_items
    if tool.job is not None:
        assert contract.job is not None
        assert tool.job.status_path == contract.job.status_path
        assert tool.job.status_method == contract.job.status_method
        assert tool.job.items_field == contract.job.items_field
        if contract.job.status_id_field is not None:
            assert tool.job.status_body is not None
            assert tool.job.status_body.get(contract.job.status_id_field) == "{job_id}"
        else:
            assert tool.job.status_body is None, "the docs' status request has no body"
        assert tool.job.max_items <= contract.job.max_items
    assert tool.source and tool.source.startswith("https://")


@pytest.mark.parametrize(("tool_id", "answer_name"), cases(), ids=lambda v: str(v))
async def test_a_documented_answer_through_playlines_call(
    tool_id: str, answer_name: str, server: ContractServer, client: ProviderClient
) -> None:
    provider_name, contract = tool_contracts()[tool_id]
    answer = contract.answers[answer_name]
    tool = preset_catalog().tool(tool_id)
    inputs = answer.inputs or [contract.sample_input]
    server.violations.clear()
    server.answer(tool_id, answer_name)

    observed = await call(client, tool, inputs, max_polls=len(answer.poll) + 2)

    assert server.requests(provider_name), "no request reached the contract server"
    assert server.violations == [], "the request departs from the documented one"
    assert observed.outcome == answer.outcome, observed.error
    if answer.outcome == "job_failed" and answer.max_wait_s is None:
        # Failed by what the provider said, not given up after waiting.
        assert not (observed.error or "").startswith("still running"), observed.error
    if answer.outcome in ("hit", "no_match"):
        for result, (values, missing) in zip(
            observed.results, answer.expected(len(inputs)), strict=True
        ):
            for name, value in values.items():
                assert tool.get(result, name) == value, name
            for name in missing:
                assert tool.get(result, name) is None, name
    if answer.credits is not None:
        assert observed.credits == pytest.approx(answer.credits)


def test_every_preset_balance_is_documented() -> None:
    declared = {n for n, p in preset_catalog().providers.items() if p.balance is not None}
    documented = {c.provider for c in contracts().values() if c.balance is not None}
    assert declared == documented, "a preset's balance endpoint needs its contract's [balance]"


@pytest.mark.parametrize(
    "provider", sorted(c.provider for c in contracts().values() if c.balance is not None)
)
async def test_a_preset_balance_reads_the_documented_figure(
    server: ContractServer, provider: str
) -> None:
    catalog = preset_catalog()
    spec = catalog.providers[provider]
    [documented] = [c.balance for c in contracts().values() if c.provider == provider]
    assert documented is not None and spec.balance is not None
    assert (spec.balance.method, spec.balance.path) == (documented.method, documented.path)
    before = len(server.violations)
    async with httpx.AsyncClient() as http:
        figure = await read_balance(http, provider, spec, environ_for(server, catalog))
    assert figure == documented.value
    assert server.violations[before:] == []
    assert provider in server.balance_reads
