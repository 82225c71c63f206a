"""Strict CSV in, faithful CSV/JSONL out: the file is checked before anything is stored."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from playline.datasets.csv_io import (
    cell_text,
    open_csv,
    read_csv,
    scan_csv,
    write_csv,
    write_jsonl,
)
from playline.errors import InvalidPlayInput, header_summary


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_reads_columns_rows_and_a_digest_of_the_bytes(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", '\ufeffid, name\n1,Ann\n\n2,"Bo, Jr"\n')
    columns, rows, digest = read_csv(path, ["id"])
    assert columns == ["id", "name"]  # BOM dropped, names stripped
    assert rows == [["1", "Ann"], ["2", "Bo, Jr"]]  # blank line skipped, quotes kept whole
    assert digest == read_csv(write(tmp_path / "b.csv", path.read_bytes()))[2]
    assert digest != read_csv(write(tmp_path / "c.csv", "id,name\n1,Ann\n"))[2]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("id,name\n", "has a header but no data rows"),
        ("id,\n1,2\n", "line 1: the header has a blank column name"),
        ("id,id\n1,2\n", "duplicate column name(s) 'id'"),
        ("id,name\n1,Ann\n2\n", "line 3: 1 field(s) but the header has 2"),
        ("id,name\n1,Ann,extra\n", "line 2: 3 field(s)"),
        ('id,name\n1,"unterminated\n', "malformed CSV"),
        (b"id,name\n1,\xff\n", "is not UTF-8"),
    ],
)
def test_malformed_files_are_rejected_with_the_line(
    tmp_path: Path, content: str | bytes, message: str
) -> None:
    path = write(tmp_path / "bad.csv", content)
    with pytest.raises(InvalidPlayInput) as info:
        read_csv(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_required_columns_are_named(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "id,name\n1,Ann\n")
    with pytest.raises(InvalidPlayInput, match=r"missing required column\(s\) \['email'\]"):
        read_csv(path, ["id", "email"])


def test_a_header_is_described_by_its_size_and_three_short_names_never_quoted(
    tmp_path: Path,
) -> None:
    """A file that is not the CSV a play expects (a secrets file, another table) must not
    spill its first line into the failure: the count and three names of 32 characters."""
    names = ["a", "b", "c" * 40, "ACME_API_KEY=sk_live_SECRET", *(f"x{i}" for i in range(10))]
    path = write(tmp_path / "a.csv", ",".join(names) + "\n" + ",".join("1" * 14) + "\n")
    with pytest.raises(InvalidPlayInput) as info:
        read_csv(path, ["email"])
    message = str(info.value)
    assert message == (
        f"{path}: missing required column(s) ['email']; the header has 14 columns: "
        f"'a', 'b', '{'c' * 32}…', ..."
    )
    assert "SECRET" not in message
    assert header_summary(["only"]) == "the header has 1 column: 'only'"


def test_duplicate_column_names_are_shown_three_at_most(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "a,a,b,b,c,c,SECRET,SECRET\n" + "1," * 7 + "1\n")
    with pytest.raises(InvalidPlayInput) as info:
        read_csv(path)
    assert str(info.value).endswith("line 1: duplicate column name(s) 'SECRET', 'a', 'b', ...")


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"id,name\n1,Ann\n2,B\x00o\n", 3),
        (b"id\x00name\n1,Ann\n", 1),
        (b"PATH=/usr/bin\x00ACME_API_KEY=sk_live_SECRET\x00HOME=/root\x00", 1),
        # past the first 256 KiB block: the line still counts every line before it
        (b"id,name\n" + b"1,Ann\n" * 50_000 + b"2,\x00\n", 50_002),
    ],
    ids=["in-a-row", "in-the-header", "an-environ-file", "after-the-first-block"],
)
def test_a_nul_byte_is_refused_with_its_line_and_no_content(
    tmp_path: Path, content: bytes, line: int
) -> None:
    path = write(tmp_path / "nul.csv", content)
    with pytest.raises(InvalidPlayInput) as info:
        read_csv(path)
    assert str(info.value) == (
        f"{path}: line {line}: the file holds a NUL byte, which no store can keep; remove it "
        "(is this a CSV file?)"
    )


def test_a_nul_written_after_the_scan_is_refused_by_the_parse(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "id,name\n1,Ann\n2,Bo\n")
    digest = scan_csv(path)
    path.write_bytes(b"id,name\n1,Ann\n2,B\x00\n")
    with (
        pytest.raises(InvalidPlayInput, match="line 3: the file holds a NUL byte"),
        open_csv(path, digest=digest) as rows,
    ):
        list(rows)


def test_a_missing_file_or_a_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidPlayInput, match="does not exist"):
        read_csv(tmp_path / "nope.csv")
    with pytest.raises(InvalidPlayInput, match="is a directory"):
        read_csv(tmp_path)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        ("x", "x"),
        (3, "3"),
        (2.5, "2.5"),
        (True, "true"),
        (False, "false"),
        ({"b": 1, "a": [1, 2]}, '{"a": [1, 2], "b": 1}'),
        # inline rows are stored through cell_text as source text: never altered
        ('=HYPERLINK("http://x")', '=HYPERLINK("http://x")'),
        ("-5", "-5"),
    ],
)
def test_cell_text(value: object, text: str) -> None:
    assert cell_text(value) == text


def test_write_csv_round_trips_and_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "out" / "rows.csv"
    rows = [{"id": "1", "ok": True, "tags": ["a"]}, {"id": "2", "ok": None}]
    assert write_csv(path, ["id", "ok", "tags"], rows) == 2
    assert not list(path.parent.glob("*.tmp"))
    with path.open(newline="") as handle:
        assert list(csv.DictReader(handle)) == [
            {"id": "1", "ok": "true", "tags": '["a"]'},
            {"id": "2", "ok": "", "tags": ""},
        ]


def test_write_jsonl_writes_one_sorted_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    assert write_jsonl(path, [{"b": 1, "a": 2}, {"c": None}]) == 2
    lines = path.read_text().splitlines()
    assert lines == ['{"a": 2, "b": 1}', '{"c": null}']
    assert [json.loads(line) for line in lines] == [{"a": 2, "b": 1}, {"c": None}]


def test_a_missing_column_names_the_headers_closest_column(tmp_path: Path) -> None:
    path = write(
        tmp_path / "people.csv", "id,first_name,last_name,Domain,TOKEN=sk_live_x\n1,a,b,c,d\n"
    )
    with pytest.raises(InvalidPlayInput) as info:
        read_csv(path, ["first_name", "domain", "company_domain", "token"])
    message = str(info.value)
    assert message.startswith(
        f"{path}: missing required column(s) ['domain', 'company_domain', 'token'] "
        "('domain': did you mean 'Domain'?; 'company_domain': did you mean 'Domain'?); "
    ), message
    assert "sk_live" not in message
