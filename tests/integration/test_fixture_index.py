"""Fixture books indexed on disk: built once per set of files, looked up by SQL, rebuilt
when a file changes, strict about malformed lines. Real files and SQLite indexes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from playline import demo
from playline.calls.fixtures import FixtureBook
from playline.config import Settings
from playline.errors import FixtureMissing, InvalidPlayInput
from playline.services import Services


def write_fixtures(path: Path, entries: list[tuple[str, dict[str, str], object]]) -> Path:
    path.write_text(
        "".join(json.dumps({"tool": t, "input": i, "result": r}) + "\n" for t, i, r in entries)
    )
    return path


def test_a_book_is_indexed_once_and_answers_by_canonical_input(tmp_path: Path) -> None:
    fixtures = write_fixtures(
        tmp_path / "f.jsonl",
        [
            ("company_lookup", {"domain": "a.example"}, {"name": "A"}),
            ("email_finder", {"first_name": "Ada", "domain": "a.example"}, {"email": "x"}),
            ("company_lookup", {"domain": "a.example"}, {"name": "A, later"}),  # wins
        ],
    )
    index_dir = tmp_path / "index"
    book = FixtureBook.open([fixtures], index_dir=index_dir)
    [index] = list(index_dir.iterdir())
    built = index.stat().st_mtime_ns
    assert len(book) == 2
    assert book.resolve("company_lookup", {"domain": "a.example"}) == {"name": "A, later"}
    assert book.resolve("email_finder", {"domain": "a.example", "first_name": "Ada"}) == {
        "email": "x"
    }
    with pytest.raises(FixtureMissing, match="no fixture for tool 'company_lookup'"):
        book.resolve("company_lookup", {"domain": "b.example"})
    book.close()
    # The same contents (even under another name) reuse the index file as it is.
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(fixtures.read_bytes())
    again = FixtureBook.open([copy], index_dir=index_dir)
    assert list(index_dir.iterdir()) == [index] and index.stat().st_mtime_ns == built
    assert again.resolve("company_lookup", {"domain": "a.example"}) == {"name": "A, later"}
    again.close()


def test_an_edited_fixture_file_gets_a_new_index(tmp_path: Path) -> None:
    path = write_fixtures(tmp_path / "f.jsonl", [("t", {"k": "1"}, 1)])
    index_dir = tmp_path / "index"
    FixtureBook.open([path], index_dir=index_dir).close()
    write_fixtures(path, [("t", {"k": "1"}, 2)])
    book = FixtureBook.open([path], index_dir=index_dir)
    assert book.resolve("t", {"k": "1"}) == 2
    assert len(list(index_dir.glob("*.sqlite"))) == 2
    assert not list(index_dir.glob(".*.tmp"))
    book.close()


def test_bad_fixture_paths_and_lines_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidPlayInput, match="does not exist or holds no"):
        FixtureBook.open([tmp_path / "missing.jsonl"], index_dir=tmp_path / "i")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tool": "t", "input": {}, "result": 1}\n\n{"tool": "t"}\n')
    with pytest.raises(InvalidPlayInput, match=r"bad.jsonl:3: a fixture line needs JSON"):
        FixtureBook.open([bad], index_dir=tmp_path / "i")
    assert not list((tmp_path / "i").iterdir())  # no index, not even a temporary


async def test_a_worker_opens_each_book_once_and_again_after_an_edit(tmp_path: Path) -> None:
    services = await Services.open(Settings(home=tmp_path / "home", data_dirs=(tmp_path,)))
    try:
        directory = tmp_path / "fixtures"
        directory.mkdir()
        (directory / "demo.jsonl").write_bytes(demo.FIXTURES.read_bytes())
        first = await services.open_fixture_book([str(directory)])
        assert services.fixture_book([str(directory)]) is first
        assert len(first) == len(demo.FIXTURES.read_text().splitlines())
        write_fixtures(directory / "more.jsonl", [("t", {"k": "1"}, 1)])
        second = services.fixture_book([str(directory)])
        assert second is not first and second.resolve("t", {"k": "1"}) == 1
        assert len(list((tmp_path / "home" / "fixtures").glob("*.sqlite"))) == 2
    finally:
        await services.close()
