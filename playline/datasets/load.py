"""Where a play's source dataset comes from: a file, a URL, or the store itself.

A play's input names its CSV by a string, which ``load_csv`` resolves on a worker:

* ``store:<dataset_id>``: a dataset already in the sheet store, uploaded by a
  client with :func:`upload_csv` (so workers need no disk shared with the client).
  Build and read these with :func:`store_source` and :func:`store_source_id`;
* ``http://...`` / ``https://...``: downloaded by the worker, streamed to a
  temporary file (:func:`download_csv`), then loaded as a file. Only when the
  workers allow it (``PLAYLINE_URL_LOADS``), only from public addresses (or hosts of
  ``PLAYLINE_URL_ALLOW_HOSTS``), checked on every redirect hop, and at most
  ``PLAYLINE_URL_MAX_BYTES`` (see :mod:`~playline.datasets.access`);
* anything else: a path on the worker, under one of its ``PLAYLINE_DATA_DIRS``
  (checked by the caller with :func:`~playline.datasets.access.check_worker_path`).

Every load is streamed (constant memory whatever the file's size), validated
exactly as :mod:`~playline.datasets.csv_io` says, and idempotent by content: the
dataset id is ``<key>@<first 16 hex of the file's sha256>``, so the same bytes
are stored once however often they are loaded or uploaded.
"""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from playline.config import Settings
from playline.contract import DatasetRef
from playline.datasets.access import (
    check_url_loads,
    host_allowed,
    is_public_address,
    parse_address,
)
from playline.datasets.csv_io import check_required_columns, open_csv, scan_csv
from playline.errors import InvalidPlayInput, PlaylineError
from playline.stores.sheet import SheetStore

__all__ = [
    "MAX_REDIRECTS",
    "STORE_SOURCE_PREFIX",
    "PublicAddressResolver",
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

#: Redirects a CSV URL may take; one more is refused.
MAX_REDIRECTS = 5
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: Connect fast or fail; a server that stops sending for a minute is given up on.
DOWNLOAD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=15, sock_read=60)
_BLOCK = 1 << 16
_ALLOW_HINT = (
    "CSV URLs reach public addresses only; add the host to PLAYLINE_URL_ALLOW_HOSTS on the "
    "workers if it is a server you trust"
)


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
    :mod:`~playline.datasets.csv_io`) and stored in one transaction, so a malformed
    line stores nothing. The same bytes are stored once: loading them again
    returns the stored dataset (after checking ``required_columns``).

    Args:
        sheet: the store the workers use (a client opens it with
            ``open_stores(settings, create=False)``).
        path: the file to read.
        key: the dataset id's prefix; default: the file's name (``accounts.csv``).
        required_columns: columns the header must have.
        name: how messages call the file (default: the path).
    """
    path = Path(path)
    name = name or str(path)
    # The file's own name: wherever the dataset is named (summaries, the UI, errors),
    # the user reads ``accounts.csv@4780a…``, the file they gave.
    prefix = key or _KEY_UNSAFE.sub("_", path.name) or "csv"
    digest = await asyncio.to_thread(scan_csv, path, name=name)
    dataset_id = f"{prefix}@{digest[:16]}"
    stored = await sheet.source(dataset_id)
    if stored is not None:
        columns, count = stored
        check_required_columns(name, columns, required_columns)
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
    check_required_columns(store_source(dataset_id), columns, required_columns)
    return DatasetRef(id=dataset_id, count=count, columns=columns)


class _RefusedAddress(OSError):
    """A name resolved to an address CSV URLs may not reach (raised inside aiohttp's
    connector, which wraps it in a ``ClientConnectorError``)."""


class PublicAddressResolver(AbstractResolver):
    """aiohttp's resolver, refusing a name any of whose addresses is not public
    (:func:`~playline.datasets.access.is_public_address`) unless ``host:port`` is in
    ``allow_hosts``.

    The connector connects only to the addresses its resolver returns, so the
    addresses checked are the ones connected to: a name cannot resolve to a public
    address for a check and to a private one for the connection (DNS rebinding).
    aiohttp does not resolve IP literals; :func:`download_csv` checks those itself.
    """

    def __init__(self, allow_hosts: Sequence[str], inner: AbstractResolver | None = None) -> None:
        self._allow_hosts = tuple(allow_hosts)
        self._inner = inner or aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if host_allowed(self._allow_hosts, host, port):
            return found
        for result in found:
            address = parse_address(result["host"])
            if address is None or not is_public_address(address):
                raise _RefusedAddress(f"{host} resolves to a non-public address")
        return found

    async def close(self) -> None:
        await self._inner.close()


@asynccontextmanager
async def download_csv(
    settings: Settings,
    url: str,
    *,
    directory: str | Path,
    resolver: AbstractResolver | None = None,
) -> AsyncIterator[Path]:
    """Stream ``url`` into a temporary file under ``directory``; deleted afterwards.

    Refused with :class:`InvalidPlayInput`, in one line, before anything is read
    when it can be: URL loads off (``settings.url_loads``); a scheme other than
    http(s) or more than :data:`MAX_REDIRECTS` redirects; a host, on any hop, that
    is or resolves to a non-public address and is not in ``settings.url_allow_hosts``;
    more than ``settings.url_max_bytes`` (by ``Content-Length`` up front, else once
    the stream passes it; the partial file is deleted); a 4xx answer.
    :class:`SourceUnavailable` (retryable) is a 5xx or a network failure. Every
    message names the URL without its query string or credentials. Proxies from
    the environment are not used: the address checked must be the one connected to.

    Args:
        settings: the worker's URL policy (``url_loads``, ``url_allow_hosts``,
            ``url_max_bytes``).
        url: the CSV's URL.
        directory: where the temporary file goes.
        resolver: the name resolver under the address check (default: aiohttp's).
    """
    shown = shown_url(url)
    check_url_loads(settings, shown)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"download-{uuid.uuid4().hex}.csv"
    connector = aiohttp.TCPConnector(
        resolver=PublicAddressResolver(settings.url_allow_hosts, resolver), use_dns_cache=False
    )
    try:
        async with aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=DOWNLOAD_TIMEOUT,
            trust_env=False,
        ) as session:
            try:
                response = await _follow(session, settings, url, shown)
                async with response:
                    await _save(response, target, settings.url_max_bytes, shown)
            except (aiohttp.ClientError, TimeoutError) as err:
                raise SourceUnavailable(
                    f"CSV URL {shown} could not be fetched ({type(err).__name__})"
                ) from None
        yield target
    finally:
        target.unlink(missing_ok=True)


async def _follow(
    session: aiohttp.ClientSession, settings: Settings, url: str, shown: str
) -> aiohttp.ClientResponse:
    """The final answer for ``url``, following at most :data:`MAX_REDIRECTS` redirects
    and checking every hop's scheme and address before connecting to it."""
    current = URL(url)
    for hop in range(MAX_REDIRECTS + 1):
        where = f"CSV URL {shown}"
        if hop:
            where += f" (redirected to {shown_url(str(current))})"
        _check_hop(settings, current, where)
        try:
            response = await session.get(current, allow_redirects=False)
        except aiohttp.InvalidUrlClientError:
            raise InvalidPlayInput(f"{where}: not a valid URL") from None
        except aiohttp.ClientConnectorError as err:
            if isinstance(err.os_error, _RefusedAddress):
                raise InvalidPlayInput(f"{where}: {err.os_error}; {_ALLOW_HINT}") from None
            raise
        if response.status not in _REDIRECT_STATUSES:
            if response.status >= 300:
                response.release()
                kind = SourceUnavailable if response.status >= 500 else InvalidPlayInput
                raise kind(
                    f"{where} answered HTTP {response.status} {response.reason or ''}".rstrip()
                )
            return response
        location = response.headers.get("Location")
        response.release()
        if not location:
            raise InvalidPlayInput(f"{where} answered HTTP {response.status} without a Location")
        current = current.join(URL(location))
    raise InvalidPlayInput(
        f"CSV URL {shown} redirected more than {MAX_REDIRECTS} times; give the file's final URL"
    )


def _check_hop(settings: Settings, url: URL, where: str) -> None:
    """Refuse a hop's scheme, or its host when it is an IP literal (aiohttp resolves
    names through :class:`PublicAddressResolver`, never literals)."""
    if url.scheme not in ("http", "https"):
        raise InvalidPlayInput(f"{where}: only http and https URLs are followed")
    host = url.raw_host or ""
    address = parse_address(host)
    if address is None or is_public_address(address):
        return
    if not host_allowed(settings.url_allow_hosts, host, url.port or 0):
        raise InvalidPlayInput(f"{where}: {host} is not a public address; {_ALLOW_HINT}")


async def _save(response: aiohttp.ClientResponse, target: Path, max_bytes: int, shown: str) -> None:
    """Stream the body to ``target``; refuse it once it is larger than ``max_bytes``."""
    too_big = InvalidPlayInput(
        f"CSV URL {shown} is larger than {max_bytes} bytes, the most this worker downloads "
        "(PLAYLINE_URL_MAX_BYTES); nothing was loaded"
    )
    if response.content_length is not None and response.content_length > max_bytes:
        raise too_big
    written = 0
    with target.open("wb") as out:
        async for block in response.content.iter_chunked(_BLOCK):
            written += len(block)
            if written > max_bytes:
                raise too_big
            out.write(block)
