"""A play calling every preset tool once per row, for the contract server end to end.

Each preset tool gets a column whose resolver sends the tool's documented sample
input (from its contract, ``tests/contracts/<provider>.toml``) and returns the value
its found answer documents first. The play takes the tool ids in its input (workflow
code computes nothing from files); the resolvers are registered in the worker's
process only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from temporalio import workflow

from playline import PlayContext, RowContext, play, resolver


def resolver_name(tool_id: str) -> str:
    return f"tests.plays_contracts.{tool_id}"


class _Named:
    """A registered resolver by name (``with_column`` needs nothing else)."""

    def __init__(self, name: str) -> None:
        self.__playline_resolver__ = name

    def __call__(self, *args: Any) -> Any:  # pragma: no cover - never called in a workflow
        raise RuntimeError("a resolver named for the workflow only")


def expected_value(tool_id: str) -> tuple[str, Any]:
    """The getter a tool's column reads, and the value its documented found answer gives."""
    from tests.contracts.contract import tool_contracts

    _, contract = tool_contracts()[tool_id]
    found = next(a for a in contract.answers.values() if a.outcome == "hit")
    values = found.expect if isinstance(found.expect, dict) else found.expect[0]
    name, value = next(iter(values.items()))
    return name, value


def _register() -> None:
    from tests.contracts.contract import preset_tools, tool_contracts

    for tool_id in preset_tools():
        _, contract = tool_contracts()[tool_id]
        getter, _ = expected_value(tool_id)

        def make(tool_id: str, sample: dict[str, Any], getter: str) -> Any:
            async def call_tool(row: Mapping[str, Any], rc: RowContext) -> Any:
                result = await rc.tool(tool_id, sample)
                return result.get(getter)

            return call_tool

        resolver(name=resolver_name(tool_id), tools=[tool_id])(
            make(tool_id, dict(contract.sample_input), getter)
        )


if not workflow.unsafe.in_sandbox():
    _register()


class ContractToolsInput(BaseModel):
    csv_path: str
    tools: list[str]
    dataset: str = "t_contract_tools"


@play(name="t_contract_tools")
async def t_contract_tools(ctx: PlayContext, input: ContractToolsInput) -> None:
    """Every tool named, one column each, over the rows of a CSV."""
    source = await ctx.csv("src", input.csv_path)
    dataset = ctx.dataset(input.dataset, source)
    for tool_id in input.tools:
        dataset = dataset.with_column(tool_id, _Named(resolver_name(tool_id)))
    await dataset.run(key="lead_id")
