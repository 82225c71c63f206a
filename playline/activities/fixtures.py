"""Fixture integration mode: tool calls answered from recorded fixtures, never over HTTP.

A fixture file is JSON Lines, one call per line:
``{"tool": "email_finder", "input": {...}, "result": {...}}``. Inputs are matched by
canonical JSON after the tool's input model has normalised them, so key order and
defaulted fields do not matter. A call without a fixture is an error naming the
tool and the input's digest, not a silent ``None``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from playline.activities.receipts import canonical_json
from playline.errors import FixtureMissing, InvalidPlayInput


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
