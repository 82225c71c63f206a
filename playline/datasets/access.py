"""What a play may make a worker read: which local files, which URLs.

A play's input comes from whoever can start a workflow, and the worker reading it
holds secrets (API keys, the store's password) and sits inside a network. So a
worker reads only what it was told it may:

* **worker-local files** (a CSV path, a fixture path) only under the directories of
  ``PLAYLINE_DATA_DIRS`` (``Settings.data_dirs``) or the package's own demo
  directory. The check is on the *resolved* path (symlinks followed, ``..``
  collapsed), so ``/data/../proc/self/environ`` or a symlink out of a data
  directory is refused, and it happens before the file is opened: a refused file's
  existence, size or content never reaches a message. ``store:<id>`` references
  need no file and always work;
* **URLs** only when ``PLAYLINE_URL_LOADS`` is on, over http(s), and only to public
  addresses (:func:`is_public_address`), unless the host is named in
  ``PLAYLINE_URL_ALLOW_HOSTS`` (:func:`host_allowed`). The download itself
  (:func:`~playline.datasets.load.download_csv`) applies these to every redirect
  hop and to the addresses it actually connects to.

Everything here is a pure function of ``Settings`` and its arguments.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from playline import package_data
from playline.config import Settings
from playline.errors import InvalidPlayInput

__all__ = [
    "DEMO_DIR",
    "allowed_dirs",
    "check_fixture_paths",
    "check_url_loads",
    "check_worker_path",
    "host_allowed",
    "is_public_address",
]

#: The package's demo data (the demo CSV and fixtures): always readable.
DEMO_DIR = Path(os.path.realpath(package_data.DEMO_DIR))

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: NAT64's well-known prefix: the low 32 bits are the IPv4 address reached.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def allowed_dirs(settings: Settings) -> list[Path]:
    """The resolved directories a play's worker-local paths must lie under."""
    return [Path(os.path.realpath(d)) for d in settings.data_dirs] + [DEMO_DIR]


def check_worker_path(settings: Settings, path: str | Path, *, kind: str = "CSV") -> Path:
    """``path`` resolved (symlinks followed), if it lies under an allowed directory.

    Raises :class:`InvalidPlayInput` otherwise, in one line naming the path as given
    and what to do; nothing of the file is read (not even whether it exists).
    ``kind`` is how the message calls the path: ``"CSV"``, ``"fixture"`` or
    ``"export"`` (a file a play writes on the worker).
    """
    resolved = Path(os.path.realpath(path))
    if any(resolved.is_relative_to(root) for root in allowed_dirs(settings)):
        return resolved
    hint = (
        "upload it with `playline run --csv` (a store: reference), or add its directory "
        "to PLAYLINE_DATA_DIRS on the workers"
        if kind == "CSV"
        else "add its directory to PLAYLINE_DATA_DIRS on the workers"
    )
    where = (
        "in any of this worker's PLAYLINE_DATA_DIRS"
        if settings.data_dirs
        else "in a data directory of this worker (PLAYLINE_DATA_DIRS is unset)"
    )
    raise InvalidPlayInput(f"{kind} path {str(path)!r} is not {where}; {hint}")


def check_fixture_paths(settings: Settings, paths: Iterable[str]) -> None:
    """Check every fixture path, and each ``*.jsonl`` of a fixture directory (a member
    may be a symlink out of it), as :func:`check_worker_path` does."""
    for name in paths:
        resolved = check_worker_path(settings, name, kind="fixture")
        if resolved.is_dir():
            for member in sorted(Path(name).glob("*.jsonl")):
                check_worker_path(settings, member, kind="fixture")


def check_url_loads(settings: Settings, shown: str) -> None:
    """Refuse a CSV URL (shown as ``shown``) unless this worker loads URLs at all."""
    if not settings.url_loads:
        raise InvalidPlayInput(
            f"CSV URL {shown}: this worker does not download CSV URLs; set "
            "PLAYLINE_URL_LOADS=on on the workers to allow public URLs, or download the "
            "file and run with `playline run --csv` (a store: reference)"
        )


def is_public_address(address: _IPAddress) -> bool:
    """Whether a CSV URL may connect to ``address``: a global unicast address.

    Refused: loopback, private (RFC 1918, ULA), link-local (169.254/16 with the cloud
    metadata address, fe80::/10), multicast, unspecified, shared (CGNAT), documentation
    and every other range IANA does not mark global, also when an IPv6 address carries
    such an IPv4 address (mapped, 6to4, NAT64).
    """
    if address.is_multicast or not address.is_global:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public_address(embedded)
    return True


def parse_address(host: str) -> _IPAddress | None:
    """``host`` as an IP address (brackets and an IPv6 zone dropped), or ``None``."""
    text = host.strip("[]").partition("%")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def host_allowed(allow_hosts: Sequence[str], host: str, port: int) -> bool:
    """Whether ``host:port`` is named in ``PLAYLINE_URL_ALLOW_HOSTS`` (``host`` or
    ``host:port`` entries; ``[v6]:port`` for an IPv6 address with a port)."""
    wanted = _normal_host(host)
    for entry in allow_hosts:
        name, entry_port = _split_entry(entry)
        if name == wanted and entry_port in (None, port):
            return True
    return False


def _normal_host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    address = parse_address(host)
    return str(address) if address is not None else host.strip("[]")


def _split_entry(entry: str) -> tuple[str, int | None]:
    entry = entry.strip()
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
        return _normal_host(name), int(port) if port.isdigit() else None
    if entry.count(":") == 1:
        name, _, port = entry.partition(":")
        if port.isdigit():
            return _normal_host(name), int(port)
    return _normal_host(entry), None
