"""What ``@play`` reads from a play function's annotations: its input and output models."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from playline.contract import PlayRunResult
from playline.errors import InvalidPlayInput
from playline.workflows.context import PlayContext
from playline.workflows.play import _input_model_of, _output_type_of


class In(BaseModel):
    x: int


class Out(BaseModel):
    y: int


async def returns_model(ctx: PlayContext, input: In) -> Out:
    return Out(y=input.x)


async def returns_optional(ctx: PlayContext, input: In) -> Out | None:
    return None


async def returns_none(ctx: PlayContext, input: In) -> None:
    return None


async def returns_any(ctx: PlayContext, input: In) -> Any:
    return None


async def unannotated(ctx, input):  # type: ignore[no-untyped-def]
    return None


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (returns_model, Out),
        (returns_optional, Out),
        (returns_none, None),
        (returns_any, Any),
        (unannotated, Any),
    ],
)
def test_the_output_type_comes_from_the_return_annotation(fn: Any, expected: Any) -> None:
    assert _output_type_of(fn) is expected


def test_the_result_type_decodes_the_output_into_the_play_model() -> None:
    typed = PlayRunResult[Out].model_validate({"play": "p", "output": {"y": 3}})
    plain = PlayRunResult.model_validate({"play": "p", "output": {"y": 3}})
    assert typed.output == Out(y=3)
    assert plain.output == {"y": 3}


def test_the_input_model_must_be_a_pydantic_model() -> None:
    assert _input_model_of(returns_model) is In

    async def untyped_input(ctx: PlayContext, input: dict[str, Any]) -> None:
        return None

    with pytest.raises(InvalidPlayInput, match="annotate its input parameter"):
        _input_model_of(untyped_input)
