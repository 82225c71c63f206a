"""The sheet store's read path for the sheet view: a page of a run filtered by a cell's
outcome or a column's text and ordered by a column's value, in SQL, and the charts'
sums, on SQLite and PostgreSQL. Each answer is held equal to the rule it replaces: the
outcomes of :func:`cell_outcome` over every row, and :class:`SpendTally` over every
row's provenance (what the view computed by reading the whole run).
"""

from __future__ import annotations

from typing import Any

import pytest

from playline.calls.provenance import tally
from playline.spend import NO_STEP
from playline.stores.backends import Stores
from playline.stores.sheet import RowResult, RowsQuery, RunRow, SheetStore
from playline.stores.sheet_index import cell_outcome

ROWS = 40
STEPS = [
    {"tool": "mailfox_email", "provider": "mailfox", "outcome": "no_match", "credits": 0.5},
    {"tool": "prospectr_email", "provider": "prospectr", "outcome": "hit", "credits": 2.5},
]


@pytest.fixture
def sheet(stores: Stores) -> SheetStore:
    return stores.sheet


def provenance(i: int) -> dict[str, Any] | None:
    """Row ``i``'s provenance: a paid hit after two steps, a no match, a failure, a budget
    skip, a skipped input; the last five rows not run yet."""
    kind = i % 5
    if i >= ROWS - 5:
        return None
    if kind == 0:
        email = {
            "tool": "prospectr_email",
            "miss": None,
            "by_provider": {"mailfox": 0.5, "prospectr": 2.5},
            "credits": 3.0,
            "fetched_at": 1000.0 + i,
            "steps": STEPS,
        }
    elif kind == 1:
        email = {
            "tool": "mailfox_email",
            "miss": "no step answered",
            "by_provider": {"mailfox": 0.5},
            "credits": 0.5,
            "fetched_at": 1000.0 + i,
            "steps": [*STEPS[:1], {"tool": "prospectr_email", "outcome": "skipped_budget"}],
        }
    elif kind == 2:
        email = {"tool": None, "miss": "error: ProviderError"}
    elif kind == 3:
        email = {"tool": None, "miss": "skipped_budget"}
    else:
        email = {"tool": None, "miss": "skipped_input"}
    phone = {"tool": "dialr_phone", "miss": None if i % 2 else "no match", "credits": 1}
    return {"email": email, "phone": phone}


def value(i: int) -> Any:
    """The ``score`` column: numbers, text, and empty cells, out of order."""
    if i % 7 == 0:
        return ""
    if i % 3 == 0:
        return f"Tier {chr(ord('a') + i % 4)}"
    return (i * 37) % 23 + 0.5


async def fill(sheet: SheetStore) -> None:
    ids = [f"p{i:02d}" for i in range(ROWS)]
    await sheet.put_source(
        "src@1",
        ["id", "name"],
        [[k, f"Name {'Ann' if i % 4 else 'Bob'}{i}"] for i, k in enumerate(ids)],
    )
    await sheet.prepare_run(
        "r1",
        source_id="src@1",
        dataset="people",
        key_fields=["id"],
        mode="upsert",
        computed_columns=["email", "phone", "score"],
    )
    results = []
    for i, key in enumerate(ids):
        found = provenance(i)
        if found is None:
            continue
        status = "error" if i % 5 in (2, 3) else "ok"
        cells = {"email": "x@y" if i % 5 == 0 else None, "phone": "1" if i % 2 else None}
        results.append(RowResult(i, key, {**cells, "score": value(i)}, status, None, found))
    # In two writes, the second rewriting one row of the first (a retried chunk).
    await sheet.write_results("r1", results[:20])
    await sheet.write_results("r1", results[19:])


async def every_row(sheet: SheetStore) -> list[RunRow]:
    return await sheet.read_run_rows("r1", 0, ROWS)


def outcome_of(row: RunRow, column: str) -> str:
    return cell_outcome(row.status, (row.provenance or {}).get(column), row.data.get(column))


@pytest.mark.parametrize(
    "outcome", ["hit", "no_match", "failed", "skipped_budget", "skipped", "not_run"]
)
@pytest.mark.parametrize("column", [None, "email", "phone"])
async def test_a_filter_by_outcome_finds_exactly_the_rows_the_rule_names(
    sheet: SheetStore, outcome: str, column: str | None
) -> None:
    await fill(sheet)
    rows = await every_row(sheet)
    columns = [column] if column else ["email", "phone"]
    expected = [r.seq for r in rows if any(outcome_of(r, c) == outcome for c in columns)]
    page = await sheet.query_run_rows(
        "r1", RowsQuery(offset=0, limit=ROWS, outcome=outcome, outcome_column=column)
    )
    assert page is not None
    assert [r.seq for r in page.rows] == expected and page.matching == len(expected)
    if column is None:  # every outcome is in the run
        assert expected


def rank(row: RunRow, column: str) -> int:
    found = row.data.get(column)
    if found in (None, ""):
        return 2
    return 0 if isinstance(found, float | int) else 1


def ordered(rows: list[RunRow], column: str, descending: bool) -> list[int]:
    """Numbers by value, then text (case folded), empty cells last either way; ties in
    run order (``sorted`` is stable, backwards too)."""
    out: list[int] = []
    for kind in (0, 1, 2):
        group = [r for r in rows if rank(r, column) == kind]
        if kind == 2:
            out += [r.seq for r in group]
            continue
        key = (lambda r: r.data[column]) if kind == 0 else (lambda r: str(r.data[column]).lower())
        out += [r.seq for r in sorted(group, key=key, reverse=descending)]
    return out


@pytest.mark.parametrize("descending", [False, True])
async def test_a_sort_orders_numbers_then_text_with_empty_cells_last_and_pages(
    sheet: SheetStore, descending: bool
) -> None:
    await fill(sheet)
    rows = await every_row(sheet)
    seen: list[int] = []
    for offset in range(0, ROWS, 15):
        page = await sheet.query_run_rows(
            "r1", RowsQuery(offset=offset, limit=15, sort="score", descending=descending)
        )
        assert page is not None and page.matching == ROWS
        seen += [r.seq for r in page.rows]
    assert seen == ordered(rows, "score", descending)
    assert len({rank(r, "score") for r in rows}) == 3


async def test_a_text_filter_is_case_blind_takes_wildcards_literally_and_combines(
    sheet: SheetStore,
) -> None:
    await fill(sheet)
    rows = await every_row(sheet)
    bobs = [r.seq for r in rows if "bob" in r.data["name"].lower()]
    page = await sheet.query_run_rows("r1", RowsQuery(limit=ROWS, text_column="name", text="BOB"))
    assert page is not None and [r.seq for r in page.rows] == bobs and page.matching == len(bobs)
    none = await sheet.query_run_rows("r1", RowsQuery(limit=ROWS, text_column="name", text="b_b%"))
    assert none is not None and (none.rows, none.matching) == ([], 0)
    both = await sheet.query_run_rows(
        "r1",
        RowsQuery(limit=2, offset=1, text_column="name", text="bob", outcome="hit", sort="score"),
    )
    hits = [
        r
        for r in rows
        if r.seq in bobs and "hit" in (outcome_of(r, "email"), outcome_of(r, "phone"))
    ]
    expected = ordered(hits, "score", False)
    assert both is not None and both.matching == len(expected)
    assert [r.seq for r in both.rows] == expected[1:3]
    # A page past the end: no rows, still the count.
    past = await sheet.query_run_rows("r1", RowsQuery(offset=500, text_column="name", text="bob"))
    assert past is not None and (past.rows, past.matching) == ([], len(bobs))


async def test_the_charts_sums_equal_the_tally_of_every_rows_provenance(sheet: SheetStore) -> None:
    await fill(sheet)
    rows = await every_row(sheet)
    spent = tally(r.provenance for r in rows if r.provenance)
    figures = await sheet.run_figures("r1", 10)
    assert figures is not None
    assert (figures.start, figures.end) == (1000.0, 1000.0 + 31)
    by_provider: dict[str, float] = {}
    for point in figures.spend:
        assert 0 <= point.bucket < 10
        by_provider[point.provider] = by_provider.get(point.provider, 0.0) + point.credits
    assert by_provider == pytest.approx(spent.by_provider)
    # The last paid cell lands in the last bucket, the first in the first.
    assert {p.bucket for p in figures.spend} >= {0, 9}
    steps = figures.steps["email"]
    assert [s.tool for s in steps] == ["mailfox_email", "prospectr_email"]
    for step in steps:
        calls, hits, credits = spent.tried["email"][step.tool]
        assert (step.calls, step.hits, step.credits) == (calls, hits, pytest.approx(credits))
        assert step.answered == spent.steps["email"].get(step.tool, 0)
    assert figures.unanswered == {"email": spent.steps["email"][NO_STEP]}
    assert "phone" not in figures.steps  # not a waterfall


async def test_an_unknown_run_has_no_page_and_no_figures(sheet: SheetStore) -> None:
    assert await sheet.query_run_rows("nope", RowsQuery(outcome="hit")) is None
    assert await sheet.run_figures("nope", 10) is None
