"""Where a play's source dataset comes from: a file, a URL, or the store itself.

A play's input names its CSV by a string, which ``load_csv`` resolves on a worker:

* ``store:<dataset_id>``: a dataset already in the sheet store, uploaded by a
  client with :func:`upload_csv` (so workers need no disk shared with the client).
  Build and read these with :func:`store_source` and :func:`store_source_id`;
* ``http://...`` / ``https://...``: downloaded by the worker, streamed to a
  temporary file (:func:`download_csv`), then loaded as a file;
* anything else: a path readable by the worker.

Every load is streamed (constant memory whatever the file's size), validated
exactly as :mod:`~playline.stores.csv_io` says, and idempotent by content: the
dataset id is ``<key>@<first 16 hex of the file's sha256>``, so the same bytes
are stored once however often they are loaded or uploaded.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from playline.contract import DatasetRef
from playline.errors import InvalidPlayInput, PlaylineError
from playline.stores.csv_io import open_csv, scan_csv
from playline.stores.sheet import SheetStore

__all__ = [
    "STORE_SOURCE_PREFIX",
    "SourceUnavailable",
    "download_csv",
    "find_source",
    "is_url",
    "shown_url",
    "store_source",
    "store_source_id",
    "upload_csv",
]

#: A play input's CSV reference to a dataset already in the store: ``store:<dataset_id>``.
STORE_SOURCE_PREFIX = "store:"

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class SourceUnavailable(PlaylineError):
    """A CSV URL could not be fetched for a reason that may pass (5xx, network)."""

    retryable = True


def store_source(dataset_id: str) -> str:
    """The reference a play input carries instead of a path: ``store:<dataset_id>``."""
    return f"{STORE_SOURCE_PREFIX}{dataset_id}"


def store_source_id(source: str) -> str | None:
    """The dataset id of a ``store:`` reference; ``None`` for a path or URL."""
    if not source.startswith(STORE_SOURCE_PREFIX):
        return None
    dataset_id = source[len(STORE_SOURCE_PREFIX) :].strip()
    if not dataset_id:
        raise InvalidPlayInput(f"{source!r} names no dataset; use store:<dataset id>")
    return dataset_id


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def shown_url(url: str) -> str:
    """How messages name a CSV URL: no credentials, no query string (signed URLs)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "…" if parts.query else "", ""))


async def upload_csv(
    sheet: SheetStore,
    path: str | Path,
    *,
    key: str | None = None,
    required_columns: Sequence[str] = (),
    name: str | None = None,
) -> DatasetRef:
    """Stream a local CSV file into the sheet store; its reference.

    The file is validated as it is read (the messages of
    :mod:`~playline.stores.csv_io`) and stored in one transaction, so a malformed
    line stores nothing. The same bytes are stored once: loading them again
    returns the stored dataset (after checking ``required_columns``).

    Args:
        sheet: the store the workers use (a client opens it with
            ``open_stores(settings, create=False)``).
        path: the file to read.
        key: the dataset id's prefix; default: the file name's stem.
        required_columns: columns the header must have.
        name: how messages call the file (default: the path).
    """
    path = Path(path)
    name = name or str(path)
    prefix = key or _KEY_UNSAFE.sub("_", path.stem) or "csv"
    digest = await asyncio.to_thread(scan_csv, path, name=name)
    dataset_id = f"{prefix}@{digest[:16]}"
    stored = await sheet.source(dataset_id)
    if stored is not None:
        columns, count = stored
        _check_required(name, columns, required_columns)
        return DatasetRef(id=dataset_id, count=count, columns=columns)
    rows = await asyncio.to_thread(open_csv, path, required_columns, name=name, digest=digest)
    with rows:
        count = await sheet.put_source(dataset_id, rows.columns, rows)
    return DatasetRef(id=dataset_id, count=count, columns=rows.columns)


async def find_source(
    sheet: SheetStore, dataset_id: str, required_columns: Sequence[str] = ()
) -> DatasetRef:
    """The reference of a dataset already in the store, checked like a CSV's header."""
    stored = await sheet.source(dataset_id)
    if stored is None:
        raise InvalidPlayInput(
            f"{store_source(dataset_id)}: no such dataset in the sheet store; upload it "
            "first, to the store the workers use (PLAYLINE_STORE_URL)"
        )
    columns, count = stored
    _check_required(store_source(dataset_id), columns, required_columns)
    return DatasetRef(id=dataset_id, count=count, columns=columns)


def _check_required(name: str, columns: Sequence[str], required: Sequence[str]) -> None:
    missing = [c for c in required if c not in columns]
    if missing:
        raise InvalidPlayInput(
            f"{name}: missing required column(s) {missing}; the header has {list(columns)}"
        )


@asynccontextmanager
async def download_csv(
    http: httpx.AsyncClient, url: str, *, directory: str | Path
) -> AsyncIterator[Path]:
    """Stream ``url`` into a temporary file under ``directory``; deleted afterwards.

    Raises :class:`InvalidPlayInput` for a 4xx answer (the URL is wrong) and
    :class:`SourceUnavailable` (retryable) for a 5xx or a network failure; both
    name the URL without its query string or credentials.
    """
    shown = shown_url(url)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"download-{uuid.uuid4().hex}.csv"
    try:
        try:
            async with http.stream("GET", url, follow_redirects=True) as response:
                if response.status_code >= 400:
                    kind = SourceUnavailable if response.status_code >= 500 else InvalidPlayInput
                    raise kind(
                        f"CSV URL {shown} answered HTTP {response.status_code} "
                        f"{response.reason_phrase}".rstrip()
                    )
                with target.open("wb") as out:
                    async for block in response.aiter_bytes(1 << 16):
                        out.write(block)
        except httpx.HTTPError as err:
            raise SourceUnavailable(
                f"CSV URL {shown} could not be fetched ({type(err).__name__})"
            ) from None
        yield target
    finally:
        target.unlink(missing_ok=True)
