"""The step functions the ``t_evolving`` versions run (registered once, shared)."""

from __future__ import annotations

from pydantic import BaseModel

from playline import resolver


class EvolvingInput(BaseModel):
    name: str


class EvolvingOutput(BaseModel):
    greeting: str
    audited: bool = False


@resolver
def t_greet(name: str) -> str:
    return f"hello {name}"


@resolver
def t_audit(greeting: str) -> bool:
    return bool(greeting)
