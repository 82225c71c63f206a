"""Fixture integration mode: tool calls answered from recorded fixtures, never over HTTP.

A fixture file is JSON Lines, one call per line:
``{"tool": "email_finder", "input": {...}, "result": {...}}``. Inputs are matched by
canonical JSON after the tool's input model has normalised them, so key order and
defaulted fields do not matter. A call without a fixture is an error naming the
tool and the input's digest, not a silent ``None``. A :class:`FixtureBook` keeps the
fixtures in an index file on disk (under the worker's home), so a million fixtures
cost a worker no memory.

:class:`FixtureDispatcher` is fixture mode's :class:`~playline.calls.dispatch.Dispatcher`:
no provider request is dispatched, pacing is bypassed unless the play asks to
enforce it (production parity), answers cost no credits, and receipts live in
their own auth scope (``"fixture"``), so fixture answers never leak into live runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from playline.calls.attempt import Attempt
from playline.calls.catalog import ToolSpec
from playline.calls.dispatch import ClaimedCall, Settled
from playline.calls.outcome import Answered, CallOutcome, Failed
from playline.calls.settle import SingleReceipt, settle
from playline.errors import FixtureMissing, InvalidPlayInput
from playline.pacing.pacer import Pacer
from playline.stores.receipts import canonical_json

#: The auth scope of fixture receipts: never equal to a live account's digest.
FIXTURE_SCOPE = "fixture"

_INDEX_VERSION = "1"
_BATCH = 5000


def fixture_files(paths: Iterable[str | Path]) -> list[Path]:
    """The ``*.jsonl`` files ``paths`` name (a directory stands for its files), in order."""
    files: list[Path] = []
    for path in map(Path, paths):
        found = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        if not found or not all(f.is_file() for f in found):
            raise InvalidPlayInput(f"fixture path {path} does not exist or holds no *.jsonl")
        files.extend(found)
    return files


def _entry_key(tool_id: str, canonical_input: str) -> bytes:
    return hashlib.sha256(f"{tool_id}\x00{canonical_input}".encode()).digest()[:16]


class FixtureBook:
    """All fixtures of a run, indexed on disk by (tool id, canonical input).

    The index is one SQLite file per set of fixture files, named by the SHA-256 of
    their contents: built once per worker host (:meth:`open` builds it if it is
    missing, in a temporary file renamed into place, so concurrent builders never
    see half an index), then read with point lookups. A worker's memory does not
    grow with the number of fixtures. Later lines win over earlier ones, as they
    always did.
    """

    def __init__(self, index: Path) -> None:
        self.path = index
        # Opened read-only and immutable: an index file is never changed in place.
        self._conn = sqlite3.connect(
            f"{index.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False
        )
        self._count: int | None = None

    @classmethod
    def open(cls, paths: Iterable[str | Path], *, index_dir: str | Path) -> FixtureBook:
        """The book of ``paths``' fixtures, indexed under ``index_dir`` (built if needed).

        Blocking (it reads every fixture file once to digest it, and parses them
        when the index is new): call it on a thread from async code.
        """
        files = fixture_files(paths)
        digest = hashlib.sha256(_INDEX_VERSION.encode())
        for file in files:
            digest.update(b"\x00file\x00")
            with file.open("rb") as handle:
                while block := handle.read(1 << 20):
                    digest.update(block)
        index_dir = Path(index_dir)
        index = index_dir / f"{digest.hexdigest()[:32]}.sqlite"
        if not index.is_file():
            index_dir.mkdir(parents=True, exist_ok=True)
            _build_index(files, index)
        return cls(index)

    def __len__(self) -> int:
        if self._count is None:
            self._count = int(self._conn.execute("SELECT count(*) FROM fixtures").fetchone()[0])
        return self._count

    def resolve(self, tool_id: str, tool_input: Any) -> Any:
        canonical = canonical_json(tool_input)
        found = self._conn.execute(
            "SELECT result FROM fixtures WHERE key = ?", (_entry_key(tool_id, canonical),)
        ).fetchone()
        if found is None:
            digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
            raise FixtureMissing(
                f"fixture mode: no fixture for tool {tool_id!r} with input digest {digest}; "
                "record one or run live"
            )
        return json.loads(found[0])

    def close(self) -> None:
        self._conn.close()


def _entries(files: list[Path]) -> Iterator[tuple[bytes, str]]:
    for file in files:
        with file.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    key = _entry_key(str(entry["tool"]), canonical_json(entry["input"]))
                    result = json.dumps(entry["result"])
                except (ValueError, KeyError, TypeError):
                    raise InvalidPlayInput(
                        f"{file}:{number}: a fixture line needs JSON with "
                        '"tool", "input" and "result"'
                    ) from None
                yield key, result


def _build_index(files: list[Path], index: Path) -> None:
    """Write the index to a temporary file, then rename it into place."""
    tmp = index.with_name(f".{index.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=OFF")
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute(
                "CREATE TABLE fixtures (key BLOB PRIMARY KEY, result TEXT NOT NULL) WITHOUT ROWID"
            )
            conn.execute("BEGIN")
            batch: list[tuple[bytes, str]] = []
            for entry in _entries(files):
                batch.append(entry)
                if len(batch) >= _BATCH:
                    conn.executemany("INSERT OR REPLACE INTO fixtures VALUES (?, ?)", batch)
                    batch.clear()
            conn.executemany("INSERT OR REPLACE INTO fixtures VALUES (?, ?)", batch)
            conn.execute("COMMIT")
        finally:
            conn.close()
        os.replace(tmp, index)
    finally:
        tmp.unlink(missing_ok=True)


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

    async def settle(self, call: ClaimedCall) -> Settled:
        outcome = await self._answer(call)
        target = SingleReceipt(self._attempt, call.key, call.payer)
        # A recorded answer costs nothing to replay (its credits are 0); it is still
        # this attempt's answer.
        return await settle(self._attempt, target, outcome, call.tool)

    async def _answer(self, call: ClaimedCall) -> CallOutcome:
        attempt, tool = self._attempt, call.tool
        if self._pacer is not None:
            async with self._pacer.permit([tool.provider]) as permit:
                attempt.check_before_dispatch()
                permit.record_success(0.0)
        else:
            attempt.check_before_dispatch()
        try:
            data = self._book.resolve(tool.id, call.payload)
        except FixtureMissing as err:
            return Failed(err)
        attempt.stats.made += 1
        attempt.metrics.call(tool.provider, tool.id, "fixture")
        return Answered(data)

    async def aclose(self) -> None:
        return None

    def abort(self) -> None:
        return None
