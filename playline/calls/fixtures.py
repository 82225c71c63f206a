"""Fixture integration mode: tool calls answered from recorded fixtures, never over HTTP.

A fixture file is JSON Lines, one call per line:
``{"tool": "email_finder", "input": {...}, "result": {...}}``. Inputs are matched by
canonical JSON after the tool's input model has normalised them, so key order and
defaulted fields do not matter. A call without a fixture is an error naming the
tool and the input's digest, not a silent ``None``.

:class:`FixtureDispatcher` is fixture mode's :class:`~playline.calls.dispatch.Dispatcher`:
no provider request is dispatched, pacing is bypassed unless the play asks to
enforce it (production parity), answers cost no credits, and receipts live in
their own auth scope (``"fixture"``), so fixture answers never leak into live runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from playline.calls.attempt import Attempt
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import ClaimedCall
from playline.errors import FixtureMissing, InvalidPlayInput
from playline.pacing.pacer import Pacer
from playline.stores.receipts import canonical_json

#: The auth scope of fixture receipts: never equal to a live account's digest.
FIXTURE_SCOPE = "fixture"


class FixtureBook:
    """All fixtures of a run, indexed by (tool id, canonical input)."""

    def __init__(self, entries: dict[tuple[str, str], Any]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def load(cls, paths: Iterable[str | Path]) -> FixtureBook:
        entries: dict[tuple[str, str], Any] = {}
        for path in paths:
            path = Path(path)
            files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
            if not files or not all(f.exists() for f in files):
                raise InvalidPlayInput(f"fixture path {path} does not exist or holds no *.jsonl")
            for file in files:
                for number, line in enumerate(file.read_text().splitlines(), start=1):
                    if not line.strip():
                        continue
                    try:
                        entry = json.loads(line)
                        key = (str(entry["tool"]), canonical_json(entry["input"]))
                        entries[key] = entry["result"]
                    except (ValueError, KeyError, TypeError):
                        raise InvalidPlayInput(
                            f"{file}:{number}: a fixture line needs JSON with "
                            '"tool", "input" and "result"'
                        ) from None
        return cls(entries)

    def resolve(self, tool_id: str, tool_input: Any) -> Any:
        try:
            return self._entries[(tool_id, canonical_json(tool_input))]
        except KeyError:
            digest = hashlib.sha256(canonical_json(tool_input).encode()).hexdigest()[:12]
            raise FixtureMissing(
                f"fixture mode: no fixture for tool {tool_id!r} with input digest {digest}; "
                "record one or run live"
            ) from None


class FixtureDispatcher:
    """Settles claimed calls from a fixture book; no HTTP.

    Args:
        attempt: the chunk attempt's shared state.
        book: the run's fixtures.
        pacer: consulted only when ``enforce_pacing`` is set.
        enforce_pacing: take a governor permit per call as a live run would.
    """

    def __init__(
        self,
        attempt: Attempt,
        book: FixtureBook,
        *,
        pacer: Pacer | None = None,
        enforce_pacing: bool = False,
    ) -> None:
        if enforce_pacing and pacer is None:
            raise ValueError("enforcing pacing in fixture mode needs a pacer")
        self._attempt = attempt
        self._book = book
        self._pacer = pacer if enforce_pacing else None

    def auth_scope(self, tool: ToolSpec) -> str:
        return FIXTURE_SCOPE

    async def settle(self, call: ClaimedCall) -> Any:
        return await self._attempt.record(call.key, lambda: self._answer(call), credits=0.0)

    async def _answer(self, call: ClaimedCall) -> Any:
        attempt, tool = self._attempt, call.tool
        if self._pacer is not None:
            async with self._pacer.permit([tool.provider]) as permit:
                attempt.check_before_dispatch()
                permit.record_success(0.0)
        else:
            attempt.check_before_dispatch()
        data = self._book.resolve(tool.id, call.payload)
        attempt.stats.made += 1
        attempt.metrics.call(tool.provider, tool.id, "fixture")
        return data
