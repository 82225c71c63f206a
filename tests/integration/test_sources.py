"""Sources in and runs out without a shared disk: uploads, ``store:`` references, CSV
URLs over real HTTP, streamed exports, and memory that does not grow with the rows.
Real SQLite files and a real PostgreSQL schema."""

from __future__ import annotations

import csv
import hashlib
import http.server
import json
import threading
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import pytest

from playline.config import Settings
from playline.datasets import (
    SourceUnavailable,
    download_csv,
    export_run,
    find_source,
    store_source,
    store_source_id,
    upload_csv,
)
from playline.errors import InvalidPlayInput
from playline.stores.backends import Stores, open_stores
from playline.stores.sheet import RowResult, RunRow, SheetStore

HEADER = ["lead_id", "first_name", "company_domain"]


def write_leads(path: Path, n: int, *, extra: str = "") -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        writer.writerows([f"L{i:06d}", f"Name, {i}", f"co{i % 7}.example"] for i in range(n))
        handle.write(extra)
    return path


@pytest.fixture
async def stores(store_url: str) -> AsyncIterator[Stores]:
    opened = await open_stores(Settings(store_url=store_url), create=True)
    try:
        yield opened
    finally:
        await opened.close()


def test_store_references_round_trip() -> None:
    assert store_source("leads@0123abcd") == "store:leads@0123abcd"
    assert store_source_id("store:leads@0123abcd") == "leads@0123abcd"
    assert store_source_id("/data/leads.csv") is None
    assert store_source_id("https://x/leads.csv") is None
    with pytest.raises(InvalidPlayInput, match="names no dataset"):
        store_source_id("store:")


async def test_an_upload_is_stored_once_by_content(stores: Stores, tmp_path: Path) -> None:
    path = write_leads(tmp_path / "leads.csv", 300)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    ref = await upload_csv(stores.sheet, path, required_columns=["lead_id"])
    assert (ref.id, ref.count, ref.columns) == (f"leads.csv@{digest[:16]}", 300, HEADER)
    again = await upload_csv(stores.sheet, tmp_path / "leads.csv")
    assert again == ref
    assert (await upload_csv(stores.sheet, path, key="mine")).id == f"mine@{digest[:16]}"
    rows = await stores.sheet.read_source_rows(ref.id, 299, 5)
    assert rows == [
        {"lead_id": "L000299", "first_name": "Name, 299", "company_domain": "co5.example"}
    ]
    # The stored copy is still checked against what this load requires.
    with pytest.raises(InvalidPlayInput, match=r"missing required column\(s\) \['email'\]"):
        await upload_csv(stores.sheet, path, required_columns=["email"])


async def test_a_malformed_line_at_the_end_stores_nothing(stores: Stores, tmp_path: Path) -> None:
    path = write_leads(tmp_path / "bad.csv", 5000, extra="L9,too,many,fields\n")
    with pytest.raises(InvalidPlayInput, match="line 5002: 4 field"):
        await upload_csv(stores.sheet, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert await stores.sheet.source(f"bad.csv@{digest[:16]}") is None


async def test_a_store_reference_is_checked_like_a_header(stores: Stores, tmp_path: Path) -> None:
    ref = await upload_csv(stores.sheet, write_leads(tmp_path / "leads.csv", 3))
    assert await find_source(stores.sheet, ref.id, ["lead_id"]) == ref
    with pytest.raises(InvalidPlayInput, match=r"store:leads\.csv@.*missing required column\(s\)"):
        await find_source(stores.sheet, ref.id, ["email"])


async def test_a_stored_header_is_described_not_quoted(stores: Stores, tmp_path: Path) -> None:
    path = tmp_path / "wide.csv"
    path.write_text("id,name,three,TOKEN=SECRET\n1,a,b,c\n")
    ref = await upload_csv(stores.sheet, path)
    for load in (
        find_source(stores.sheet, ref.id, ["email"]),
        upload_csv(stores.sheet, path, required_columns=["email"]),  # the stored copy
    ):
        with pytest.raises(InvalidPlayInput) as info:
            await load
        assert str(info.value).endswith(
            "missing required column(s) ['email']; the header has 4 columns: 'id', 'name', "
            "'three', ..."
        )
    with pytest.raises(InvalidPlayInput, match="store:nope@1: no such dataset"):
        await find_source(stores.sheet, "nope@1")


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        if self.path.startswith("/broken"):
            self.send_error(503, "Service Unavailable")
            return
        super().do_GET()


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server on loopback serving ``tmp_path/www``."""
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Files, directory=root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


#: URL loads on, the tests' loopback server allowed (as an internal file server would be).
URLS = Settings(url_loads=True, url_allow_hosts=("127.0.0.1",))


async def test_a_csv_url_is_streamed_to_a_temporary_file(file_server: str, tmp_path: Path) -> None:
    source = write_leads(tmp_path / "www" / "leads.csv", 50)
    downloads = tmp_path / "downloads"
    url = f"{file_server}/leads.csv?sig=SECRET"
    async with download_csv(URLS, url, directory=downloads) as local:
        assert local.read_bytes() == source.read_bytes()
    assert list(downloads.iterdir()) == []  # removed afterwards


async def test_a_bad_csv_url_names_the_url_and_status_but_not_its_query(
    file_server: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidPlayInput) as missing:
        async with download_csv(URLS, f"{file_server}/nope.csv?sig=SECRET", directory=tmp_path):
            pass
    assert f"CSV URL {file_server}/nope.csv?… answered HTTP 404" in str(missing.value)
    assert "SECRET" not in str(missing.value)
    with pytest.raises(SourceUnavailable, match="answered HTTP 503"):
        async with download_csv(URLS, f"{file_server}/broken.csv", directory=tmp_path):
            pass
    with pytest.raises(SourceUnavailable, match=r"127.0.0.1:1/x.csv could not be fetched") as down:
        async with download_csv(URLS, "http://u:pw@127.0.0.1:1/x.csv", directory=tmp_path):
            pass
    assert "pw" not in str(down.value)


async def prepared_run(sheet: SheetStore, path: Path, *, failed: int = 0) -> str:
    ref = await upload_csv(sheet, path)
    info = await sheet.prepare_run(
        "run-1",
        source_id=ref.id,
        dataset="leads",
        key_fields=["lead_id"],
        mode="upsert",
        computed_columns=["email"],
    )
    results = [
        RowResult(i, f"L{i:06d}", {"email": f"{i}@x"}, "error" if i < failed else "ok", "no")
        for i in range(info.admitted)
    ]
    for start in range(0, len(results), 1000):
        await sheet.write_results("run-1", results[start : start + 1000])
    return info.run_ref


async def test_an_export_streams_every_row_in_order(stores: Stores, tmp_path: Path) -> None:
    run_ref = await prepared_run(stores.sheet, write_leads(tmp_path / "l.csv", 2500), failed=2)
    count = await export_run(stores.sheet, run_ref, str(tmp_path / "out" / "rows.csv"))
    with (tmp_path / "out" / "rows.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert count == len(rows) == 2500
    assert [r["lead_id"] for r in rows] == [f"L{i:06d}" for i in range(2500)]
    assert list(rows[0]) == [*HEADER, "email", "_error"]
    assert (rows[1]["_error"], rows[2]["_error"], rows[2]["email"]) == ("no", "", "2@x")
    assert await export_run(stores.sheet, run_ref, str(tmp_path / "rows.jsonl"), "jsonl") == 2500
    first = json.loads((tmp_path / "rows.jsonl").read_text().splitlines()[0])
    assert first == {**rows[0], "_error": "no"}


async def test_an_export_that_fails_midway_leaves_no_file(stores: Stores, tmp_path: Path) -> None:
    run_ref = await prepared_run(stores.sheet, write_leads(tmp_path / "l.csv", 2500))

    class FailsOnThirdPage:
        def __getattr__(self, name: str) -> object:
            return getattr(stores.sheet, name)

        async def read_run_rows(self, run_ref: str, start: int, end: int) -> list[RunRow]:
            if start >= 2000:
                raise ConnectionError("store went away")
            return await stores.sheet.read_run_rows(run_ref, start, end)

    out = tmp_path / "out"
    with pytest.raises(ConnectionError):
        await export_run(FailsOnThirdPage(), run_ref, str(out / "rows.csv"))  # type: ignore[arg-type]
    assert list(out.iterdir()) == []  # neither the file nor its temporary


async def _peak_python_bytes(sheet: SheetStore, tmp_path: Path, rows: int) -> int:
    path = write_leads(tmp_path / f"leads{rows}.csv", rows)
    tracemalloc.start()
    try:
        ref = await upload_csv(sheet, path)
        info = await sheet.prepare_run(
            f"mem-{rows}",
            source_id=ref.id,
            dataset=f"mem-{rows}",
            key_fields=["lead_id"],
            mode="upsert",
            computed_columns=[],
        )
        assert info.admitted == rows
        await export_run(sheet, info.run_ref, str(tmp_path / f"out{rows}.csv"))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def test_upload_prepare_and_export_do_not_hold_the_rows(
    stores: Stores, tmp_path: Path
) -> None:
    """Python's peak allocation for 40,000 rows stays near that for 4,000: the rows are
    streamed in pages (holding them would take well over 10 MB here)."""
    small = await _peak_python_bytes(stores.sheet, tmp_path, 4_000)
    large = await _peak_python_bytes(stores.sheet, tmp_path, 40_000)
    assert large < small * 1.5 + 1_000_000, (small, large)
