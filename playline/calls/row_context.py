"""The ``rc`` a resolver receives: what the user's per-row code may do besides reading
its row.

A resolver is an ``async def resolver(row, rc) -> value`` registered with
``@playline.resolver`` (:mod:`playline.resolvers`, the registry). Its ``rc`` calls a
tool (``rc.tool``: the top of the call path in :mod:`playline.calls`), tries tools in
order (``rc.waterfall``: :mod:`~playline.calls.waterfall`), reads the cell an earlier
run left (``rc.previous``) and logs. The chunk activity gives each row its own
(``RowCall`` in ``activities/chunk.py``), and so does an estimate's, whose calls are
counted below the runner instead of sent. Plays import it as ``playline.RowContext``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from playline.calls.waterfall import WaterfallResult
from playline.freshness import PreviousCell

__all__ = ["Resolver", "RowContext"]


class RowContext(Protocol):
    """What a resolver may do besides reading its row."""

    row_key: str
    #: the column's cell as an earlier run left it (value, when it was fetched, its
    #: outcome), or ``None``: a resolver may keep a value a new answer lacks
    previous: PreviousCell | None

    async def tool(
        self,
        tool_id: str,
        input: Mapping[str, Any],
        *,
        force: bool = False,
        stale_after_seconds: float | None = None,
    ) -> Any: ...

    async def waterfall(
        self,
        name: str | None = None,
        input: Mapping[str, Any] | None = None,
        *,
        steps: Sequence[Any] | None = None,
        value: str | None = None,
        **options: Any,
    ) -> WaterfallResult:
        """Try tools in order until one gives an accepted value: the catalog's named
        waterfall, or ``steps`` (tool ids or ``playline.Step``) reading ``value``."""
        ...

    def log(self, message: str) -> None: ...


#: A column resolver as ``@playline.resolver`` registers it.
Resolver = Callable[[Mapping[str, Any], RowContext], Awaitable[Any]]
