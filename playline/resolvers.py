"""The ``@resolver`` registry: the user's per-row code, found by name.

A resolver is an ``async def resolver(row, rc) -> value`` registered with
``@resolver`` (its ``rc`` is a :class:`~playline.calls.row_context.RowContext`). The
workflow refers to it by its registered name only; the chunk activity looks the name
up here and runs it, in the worker process, for each row.
``run_if`` predicates are plain ``def predicate(row) -> bool`` registered the same
way. Registration happens when the plays module is imported, so a worker that
imports a play knows every resolver the play uses.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

from temporalio import workflow

from playline.errors import UnknownResolver

F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY: dict[str, Callable[..., Any]] = {}
_DECLARED_TOOLS: dict[str, tuple[str, ...]] = {}

#: A ``run_if`` predicate as ``@resolver`` registers it.
Predicate = Callable[[Mapping[str, Any]], bool]


def registered_name(fn: Callable[..., Any]) -> str:
    """The name a resolver is registered under (set by ``@resolver``)."""
    name = getattr(fn, "__playline_resolver__", None)
    if not isinstance(name, str):
        raise UnknownResolver(
            f"{getattr(fn, '__qualname__', fn)!r} is not a registered resolver; "
            "decorate it with @playline.resolver"
        )
    return name


@overload
def resolver(fn: F, /) -> F: ...


@overload
def resolver(*, name: str | None = None, tools: Sequence[str] = ()) -> Callable[[F], F]: ...


def resolver(
    fn: F | None = None, /, *, name: str | None = None, tools: Sequence[str] = ()
) -> F | Callable[[F], F]:
    """Register a column resolver (async) or a ``run_if`` predicate (sync).

    Args:
        name: registry name; defaults to ``module.qualname``.
        tools: tool ids the resolver calls, checked against the catalog before a
            dataset run dispatches anything.
    """

    def register(func: F) -> F:
        reg_name = name or f"{func.__module__}.{func.__qualname__}"
        # The workflow sandbox re-imports play modules; only the worker's own
        # import registers, so activities always run the real function.
        if not workflow.unsafe.in_sandbox():
            _REGISTRY[reg_name] = func
            _DECLARED_TOOLS[reg_name] = tuple(tools)
        func.__playline_resolver__ = reg_name  # type: ignore[attr-defined]
        return func

    return register(fn) if fn is not None else register


def lookup(name: str) -> Callable[..., Any]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownResolver(
            f"resolver {name!r} is not registered in this worker; make sure the worker "
            "imports the module that defines it (playline worker --plays MODULE)"
        ) from None


def declared_tools(name: str) -> tuple[str, ...]:
    return _DECLARED_TOOLS.get(name, ())


def is_async(name: str) -> bool:
    return inspect.iscoroutinefunction(lookup(name))
