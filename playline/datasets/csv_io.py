"""CSV in and out, strict on the way in, streaming both ways.

A malformed file is rejected with the file name, the line and what is wrong, before
anything is stored or dispatched: a missing file, an empty file, a missing header,
duplicate or blank header names, missing required columns, rows with too many or
too few fields, a NUL byte (no store takes one: PostgreSQL's ``COPY`` and ``jsonb``
refuse it). Messages never quote the file's content: a header is described by its
column count and at most three names, each cut short
(:func:`~playline.errors.header_summary`), so a file that is not a CSV at all cannot
spill into a play's failure.

Reading takes two passes so memory stays constant whatever the file's size:
:func:`scan_csv` reads the bytes once (the file exists, is UTF-8 and is not blank;
its SHA-256, which names the dataset), then :func:`open_csv` parses the header and
yields the rows one by one, checking each; a loader consumes them inside one store
transaction, so a row that fails a check rolls the whole load back. The second pass
hashes the bytes again and refuses a file that changed in between.

Writing goes through a :class:`RowFile`: rows are appended page by page to a
temporary file that replaces the target only when the export is complete. CSV
cells that a spreadsheet would run as a formula are written inert
(:func:`inert_formula`) unless the export is ``raw``.
"""

from __future__ import annotations

import codecs
import csv
import difflib
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from playline.errors import InvalidPlayInput, header_summary, shown_names

__all__ = [
    "CsvRows",
    "RowFile",
    "cell_text",
    "check_required_columns",
    "column_hint",
    "header_text",
    "inert_formula",
    "missing_columns",
    "open_csv",
    "read_csv",
    "scan_csv",
    "write_csv",
    "write_jsonl",
]

_BLOCK = 1 << 18
_LONE_CR = re.compile(r"(?<=\r)(?!\n)")
#: A cell starting with one of these is a formula to Excel, Sheets and LibreOffice.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


#: What a column name a message may quote looks like.
_COLUMN_NAME = re.compile(r"[\w .-]{1,32}")


def check_required_columns(name: str, columns: Sequence[str], required: Sequence[str]) -> None:
    """``InvalidPlayInput`` naming each required column the header lacks, with the
    header's column most like it (``company_domain``: did you mean ``domain``?)."""
    missing = missing_columns(columns, required)
    if not missing:
        return
    hints = []
    for column in missing:
        close = column_hint(column, columns)
        if close is not None:
            hints.append(f"{column!r}: did you mean {close!r}?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    raise InvalidPlayInput(
        f"{name}: missing required column(s) {missing}{hint}; {header_summary(columns)}"
    )


def missing_columns(columns: Sequence[str], required: Sequence[str]) -> list[str]:
    """The required columns the header lacks, in the order they were required."""
    return [c for c in required if c not in columns]


def column_hint(column: str, columns: Sequence[str]) -> str | None:
    """The header's column most like ``column`` (case ignored), if one is close.

    Only names that look like column names are offered: a header that is really a
    secrets file's first line must not be quoted back (see ``header_summary``)."""
    named = [c for c in columns if _COLUMN_NAME.fullmatch(c)]
    close = difflib.get_close_matches(column.lower(), [c.lower() for c in named], n=1)
    if not close:
        return None
    return next(c for c in named if c.lower() == close[0])


def header_text(columns: Sequence[str]) -> str:
    """The whole header, for a message shown only to the user who gave the file (the
    CLI's checks before an upload): ``the header has 3 columns: 'id', 'name', 'domain'``.

    A name that does not look like a column name (too long, odd characters: a
    secrets file's first line) is described, not quoted."""
    count = len(columns)
    shown = [
        repr(c) if _COLUMN_NAME.fullmatch(c) else f"<a {len(c)}-character name, not shown>"
        for c in columns
    ]
    return f"the header has {count} column{'' if count == 1 else 's'}: {', '.join(shown)}"


def _nul_refused(name: str, line: int) -> InvalidPlayInput:
    return InvalidPlayInput(
        f"{name}: line {line}: the file holds a NUL byte, which no store can keep; remove "
        "it (is this a CSV file?)"
    )


def _open_bytes(path: Path, name: str) -> IO[bytes]:
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise InvalidPlayInput(f"CSV file {name} does not exist") from None
    except IsADirectoryError:
        raise InvalidPlayInput(f"CSV path {name} is a directory, not a file") from None


def scan_csv(path: str | Path, *, name: str | None = None) -> str:
    """First pass over the bytes: the sha256 of the file, or why it cannot be a CSV.

    Checks, in this order, that the file exists and is a file, holds no NUL byte
    (the error gives its line), is UTF-8 (the error gives the offending byte's offset
    after any BOM) and is not blank. ``name`` is how messages call the file (default:
    the path).
    """
    path = Path(path)
    name = name or str(path)
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")()
    decoded = 0  # bytes handed to the decoder so far (after the BOM)
    newlines = 0  # line feeds before this block
    blank = True
    with _open_bytes(path, name) as handle:
        first = True
        while True:
            block = handle.read(_BLOCK)
            digest.update(block)
            if first:
                block = block.removeprefix(codecs.BOM_UTF8)
                first = False
            nul = block.find(b"\x00")
            if nul >= 0:
                raise _nul_refused(name, newlines + block.count(b"\n", 0, nul) + 1)
            newlines += block.count(b"\n")
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as err:
                offset = decoded - pending + err.start
                raise InvalidPlayInput(f"CSV file {name} is not UTF-8 (byte {offset})") from None
            decoded += len(block)
            if blank and text.strip():
                blank = False
            if not block:
                break
    if blank:
        raise InvalidPlayInput(f"CSV file {name} is empty; it needs a header row and data rows")
    return digest.hexdigest()


class CsvRows:
    """The rows of a CSV file, yielded one at a time and checked as they come.

    Build with :func:`open_csv` (which has already read and checked the header)
    and close it (``with``). Iterating yields each data row as a list of strings;
    blank lines are skipped; ``count`` is the number of rows yielded so far. The
    iteration raises :class:`InvalidPlayInput` on a malformed row, on a file with
    no data rows, and when the bytes no longer hash to ``digest`` (if given).
    """

    def __init__(
        self, handle: IO[bytes], name: str, required_columns: Sequence[str], digest: str | None
    ) -> None:
        self._handle = handle
        self._name = name
        self._expected_digest = digest
        self._hash = hashlib.sha256()
        self._reader = csv.reader(self._lines(), strict=True)
        self.count = 0
        try:
            self.columns = self._read_header(required_columns)
        except BaseException:
            handle.close()
            raise

    def _lines(self) -> Iterator[str]:
        """Text lines as ``io.StringIO(text, newline="")`` would give them."""
        first = True
        for number, raw in enumerate(self._handle, start=1):
            self._hash.update(raw)
            if first:
                raw = raw.removeprefix(codecs.BOM_UTF8)
                first = False
            if b"\x00" in raw:  # scan_csv refuses these; the file changed since
                raise _nul_refused(self._name, number)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise self._changed() from None
            if "\r" in line[:-1]:
                yield from (piece for piece in _LONE_CR.split(line) if piece)
            else:
                yield line

    def _changed(self) -> InvalidPlayInput:
        return InvalidPlayInput(
            f"CSV file {self._name} changed while it was being loaded; load it again"
        )

    def _malformed(self, err: csv.Error) -> InvalidPlayInput:
        return InvalidPlayInput(
            f"{self._name}: line {self._reader.line_num}: malformed CSV ({err})"
        )

    def _read_header(self, required_columns: Sequence[str]) -> list[str]:
        name, reader = self._name, self._reader
        try:
            header = next(reader)
        except StopIteration:
            raise InvalidPlayInput(
                f"CSV file {name} is empty; it needs a header row and data rows"
            ) from None
        except csv.Error as err:
            raise self._malformed(err) from None
        columns = [column.strip() for column in header]
        if any(not column for column in columns):
            raise InvalidPlayInput(f"{name}: line 1: the header has a blank column name")
        dupes = sorted({c for c in columns if columns.count(c) > 1})
        if dupes:
            raise InvalidPlayInput(f"{name}: line 1: duplicate column name(s) {shown_names(dupes)}")
        check_required_columns(name, columns, required_columns)
        return columns

    def __iter__(self) -> Iterator[list[str]]:
        name, reader, width = self._name, self._reader, len(self.columns)
        try:
            for values in reader:
                if not values or all(not v.strip() for v in values):
                    continue  # blank line
                if len(values) != width:
                    raise InvalidPlayInput(
                        f"{name}: line {reader.line_num}: {len(values)} field(s) but the header "
                        f"has {width}; quote fields that contain commas"
                    )
                self.count += 1
                yield values
        except csv.Error as err:
            raise self._malformed(err) from None
        if not self.count:
            raise InvalidPlayInput(f"CSV file {name} has a header but no data rows")
        if self._expected_digest and self._hash.hexdigest() != self._expected_digest:
            raise self._changed()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> CsvRows:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_csv(
    path: str | Path,
    required_columns: Sequence[str] = (),
    *,
    name: str | None = None,
    digest: str | None = None,
) -> CsvRows:
    """Open a CSV file, read and check its header; iterate the result for the rows.

    ``digest`` is the sha256 :func:`scan_csv` returned: the rows' iteration fails if
    the bytes changed since. ``name`` is how messages call the file.
    """
    path = Path(path)
    name = name or str(path)
    return CsvRows(_open_bytes(path, name), name, required_columns, digest)


def read_csv(
    path: str | Path, required_columns: Sequence[str] = ()
) -> tuple[list[str], list[list[str]], str]:
    """Parse and validate a whole (small) CSV file; return (columns, rows, sha256).

    Holds every row: loaders stream with :func:`scan_csv` and :func:`open_csv`.
    """
    digest = scan_csv(path)
    with open_csv(path, required_columns, digest=digest) as rows:
        return rows.columns, list(rows), digest


def cell_text(value: Any) -> str:
    """A value as one CSV cell: ``""`` for None, JSON for lists and objects,
    ``true``/``false`` for booleans, ``str()`` otherwise. Used both to store inline
    rows as source text (as if read from a CSV), where it must stay as it is, and to
    export cells (:class:`RowFile` makes formulas inert on top of it)."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def inert_formula(text: str) -> str:
    """``text`` as a spreadsheet shows it without running it (OWASP's CSV injection rule).

    A cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is a
    formula to Excel, Sheets and LibreOffice (``=HYPERLINK(...)`` sends the reader's
    data elsewhere); it gets a leading ``'``, which they display as text. Plain numbers
    (``-5``, ``+1.5``, ``1e3``) are left alone: they are not formulas and a prefix
    would turn them into text.
    """
    if text.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


class RowFile:
    """An export file written page by page, replacing its target only when complete.

    Rows go to ``<path>.tmp``; :meth:`commit` renames it over ``path``, and leaving
    the ``with`` block without committing (an error) deletes it, so a reader never
    sees a half-written export.

    Args:
        path: the target file (its directory is created).
        fmt: ``"csv"`` (a header, then one line per row with :func:`cell_text`
            cells) or ``"jsonl"`` (one JSON object per line, keys sorted).
        columns: the CSV header and cell order; ignored for JSONL.
        raw: CSV only: write header and cells as they are. By default a cell a
            spreadsheet would run as a formula is made inert (:func:`inert_formula`):
            uploads, provider answers and error texts all reach these cells.
    """

    def __init__(
        self,
        path: str | Path,
        fmt: Literal["csv", "jsonl"],
        columns: Sequence[str] = (),
        *,
        raw: bool = False,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._handle = self._tmp.open("w", newline="", encoding="utf-8")
        self._columns = list(columns)
        self._raw = raw
        self._csv = csv.writer(self._handle) if fmt == "csv" else None
        if self._csv is not None:
            self._csv.writerow([self._cell(c) for c in self._columns])
        self.count = 0

    def _cell(self, value: Any) -> str:
        text = cell_text(value)
        return text if self._raw else inert_formula(text)

    def write_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            if self._csv is not None:
                self._csv.writerow([self._cell(row.get(c)) for c in self._columns])
            else:
                self._handle.write(json.dumps(row, sort_keys=True) + "\n")
            self.count += 1

    def commit(self) -> int:
        """Close the file and move it into place; the number of rows written."""
        self._handle.close()
        self._tmp.replace(self.path)
        return self.count

    def __enter__(self) -> RowFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._handle.closed:
            self._handle.close()
            self._tmp.unlink(missing_ok=True)


def write_csv(
    path: str | Path,
    columns: Sequence[str],
    rows: Iterable[dict[str, Any]],
    *,
    raw: bool = False,
) -> int:
    """Write rows atomically (temp file then rename), formulas inert unless ``raw``;
    return the row count."""
    with RowFile(path, "csv", columns, raw=raw) as out:
        out.write_rows(rows)
        return out.commit()


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write one JSON object per line (keys sorted), atomically; return the row count."""
    with RowFile(path, "jsonl") as out:
        out.write_rows(rows)
        return out.commit()
