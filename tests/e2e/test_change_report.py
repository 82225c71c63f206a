"""What a re-run changed, end to end: a real worker, the real provider server, whose
answers drift between runs (``answer_epoch``), and the CLI.

The provider server is the judge: it lists every input whose answer differs from its
first answer, and the change report (counts and ``runs export --changes``) must name
exactly those rows and values, nothing more.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from playline.datasets import cell_text
from playline.stores.sheet_changes import CHANGE_KINDS, change_kind
from tests import plays_changes  # noqa: F401  (registers the play with the worker)
from tests.conftest import new_id
from tests.e2e.test_cli import playline
from tests.pg import pg_schema
from tests.plays import lead, read_csv_rows, run, write_csv
from tests.plays_changes import CHANGE_COLUMNS

ROWS = 40
#: The answer's field each column keeps.
FIELDS = {"work_email": "email", "acme_email": "email", "company_name": "name"}


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[dict[str, Any]]:
    """The worker's settings for each sheet backend (the CLI finds the same store)."""
    if request.param == "sqlite":
        yield {}
        return
    async with pg_schema() as url:
        monkeypatch.setenv("PLAYLINE_STORE_URL", url)  # the CLI's subprocesses read it
        yield {"store_url": url}


def _expected(changed: dict[str, list[dict[str, Any]]], rows: list[list[str]]) -> dict[str, Any]:
    """``{row_key: {column: (old, new)}}`` from the provider's list of changed answers."""
    by_person = {(r[1], r[2], r[3]): r[0] for r in rows}
    by_domain = {r[3]: r[0] for r in rows}
    expected: dict[str, dict[str, tuple[Any, Any]]] = {}
    for column, path in CHANGE_COLUMNS.items():
        for entry in changed.get(path, []):
            item = entry["input"]
            if column == "company_name":
                key = by_domain[item["domain"]]
            else:
                key = by_person[(item["first_name"], item["last_name"], item["domain"])]
            old, new = entry["old"].get(FIELDS[column]), entry["new"].get(FIELDS[column])
            if change_kind(old, new) is not None:
                expected.setdefault(key, {})[column] = (old, new)
    return expected


def _counts(expected: dict[str, dict[str, tuple[Any, Any]]]) -> dict[str, dict[str, int]]:
    counts = {column: dict.fromkeys(CHANGE_KINDS, 0) for column in CHANGE_COLUMNS}
    for columns in expected.values():
        for column, (old, new) in columns.items():
            kind = change_kind(old, new)
            assert kind is not None
            counts[column][kind] += 1
    return counts


async def test_a_rerun_reports_exactly_the_answers_the_provider_changed(
    client, provider, worker, task_queue, home, temporal_address, tmp_path: Path, store
) -> None:
    rows = [lead(i, domain=f"d{i}.example") for i in range(ROWS)]
    csv_path = write_csv(tmp_path / "leads.csv", rows)
    first_id, second_id = new_id("changes"), new_id("changes")
    common = ("--address", temporal_address, "--task-queue", task_queue)
    out_csv, out_jsonl = tmp_path / "changes.csv", tmp_path / "changes.jsonl"
    async with worker(**store):
        await run(
            client,
            "t_change_report",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            workflow_id=first_id,
        )
        assert provider.changed_answers() == {}
        first_get = await playline("runs", "get", first_id, "--json", *common, home=home)
        provider.configure(answer_epoch=1, changed_fraction=0.3)
        second = await run(
            client,
            "t_change_report",
            {"csv_path": str(csv_path)},
            task_queue=task_queue,
            workflow_id=second_id,
        )
        get_json = await playline("runs", "get", second_id, "--json", *common, home=home)
        get_text = await playline("runs", "get", second_id, *common, home=home)
        exported = await playline(
            "runs", "export", second_id, "--changes", "--out", str(out_csv), *common, home=home
        )
        exported_jsonl = await playline(
            "runs", "export", second_id, "--changes", "--out", str(out_jsonl), *common, home=home
        )
    for done in (first_get, get_json, get_text, exported, exported_jsonl):
        assert done.returncode == 0, done.stderr
    expected = _expected(provider.changed_answers(), rows)
    counts = _counts(expected)
    # The provider's drift touched every kind of change (the inputs are fixed: so is this).
    assert all(sum(c[kind] for c in counts.values()) > 0 for kind in CHANGE_KINDS), counts

    # The first run had nothing to compare with; the second reports the provider's list.
    assert json.loads(first_get.stdout)["changes"] == {}
    assert json.loads(get_json.stdout)["changes"] == counts
    line = "changed since the previous run: " + "; ".join(
        f"{column} " + ", ".join(f"{counts[column][kind]} {kind}" for kind in CHANGE_KINDS)
        for column in sorted(counts)
    )
    assert line in get_text.stdout

    # The export names exactly the changed rows, with the old and new values.
    assert exported.stdout.strip() == f"wrote {len(expected)} changed rows to {out_csv}"
    lines = [json.loads(x) for x in out_jsonl.read_text().splitlines()]
    assert {x["row_key"]: x for x in lines} == {
        key: {
            "row_key": key,
            **{
                f"{c}__{side}": v
                for c, (old, new) in cols.items()
                for side, v in (("old", old), ("new", new))
            },
        }
        for key, cols in expected.items()
    }
    assert [x["row_key"] for x in lines] == sorted(expected)  # manifest (lead id) order
    written = read_csv_rows(out_csv)
    changed_columns = [c for c in CHANGE_COLUMNS if any(c in cols for cols in expected.values())]
    assert list(written[0]) == ["row_key"] + [
        f"{c}__{side}" for c in changed_columns for side in ("old", "new")
    ]
    assert written == [
        {
            "row_key": key,
            **{
                f"{c}__{side}": cell_text(expected[key].get(c, (None, None))[i])
                for c in changed_columns
                for i, side in enumerate(("old", "new"))
            },
        }
        for key in sorted(expected)
    ]

    assert second.stats.changes == counts
