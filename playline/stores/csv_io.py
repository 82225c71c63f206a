"""CSV in and out, strict on the way in.

A malformed file is rejected with the file name, the line and what is wrong, before
anything is stored or dispatched: a missing file, an empty file, a missing header,
duplicate or blank header names, missing required columns, rows with too many or
too few fields.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from playline.errors import InvalidPlayInput


def read_csv(
    path: str | Path, required_columns: Sequence[str] = ()
) -> tuple[list[str], list[list[str]], str]:
    """Parse and validate a CSV file; return (columns, rows, sha256 of the bytes)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InvalidPlayInput(f"CSV file {path} does not exist") from None
    except IsADirectoryError:
        raise InvalidPlayInput(f"CSV path {path} is a directory, not a file") from None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InvalidPlayInput(f"CSV file {path} is not UTF-8 (byte {err.start})") from None
    if not text.strip():
        raise InvalidPlayInput(f"CSV file {path} is empty; it needs a header row and data rows")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
        columns = [name.strip() for name in header]
        if any(not name for name in columns):
            raise InvalidPlayInput(f"{path}: line 1: the header has a blank column name")
        dupes = sorted({c for c in columns if columns.count(c) > 1})
        if dupes:
            raise InvalidPlayInput(f"{path}: line 1: duplicate column name(s) {dupes}")
        missing = [c for c in required_columns if c not in columns]
        if missing:
            raise InvalidPlayInput(
                f"{path}: missing required column(s) {missing}; the header has {columns}"
            )
        rows: list[list[str]] = []
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue  # blank line
            if len(values) != len(columns):
                raise InvalidPlayInput(
                    f"{path}: line {reader.line_num}: {len(values)} field(s) but the header "
                    f"has {len(columns)}; quote fields that contain commas"
                )
            rows.append(values)
    except csv.Error as err:
        raise InvalidPlayInput(f"{path}: line {reader.line_num}: malformed CSV ({err})") from None
    if not rows:
        raise InvalidPlayInput(f"CSV file {path} has a header but no data rows")
    return columns, rows, digest


def cell_text(value: Any) -> str:
    """A value as one CSV cell: ``""`` for None, JSON for lists and objects,
    ``true``/``false`` for booleans, ``str()`` otherwise. Used both to store inline
    rows as source text (as if read from a CSV) and to export cells."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def write_csv(path: str | Path, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> int:
    """Write rows atomically (temp file then rename); return the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with tmp.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([cell_text(row.get(c)) for c in columns])
            count += 1
    tmp.replace(path)
    return count


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with tmp.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
            count += 1
    tmp.replace(path)
    return count
