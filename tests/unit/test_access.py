"""What a play may make a worker read: local files under its data directories only
(resolved, so neither ``..`` nor a symlink leads out), URLs only when allowed and only
to public addresses unless the host is allow-listed."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from playline import demo
from playline.config import Settings
from playline.datasets.access import (
    DEMO_DIR,
    check_fixture_paths,
    check_url_loads,
    check_worker_path,
    host_allowed,
    is_public_address,
)
from playline.errors import InvalidPlayInput
from playline.package_data import DEMO_DIR as PACKAGED_DEMO_DIR

HINT = (
    "upload it with `playline run --csv` (a store: reference), or add its directory to "
    "PLAYLINE_DATA_DIRS on the workers"
)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "leads.csv").write_text("id\n1\n")
    return root


def test_a_file_under_a_data_directory_is_allowed_resolved(data: Path) -> None:
    settings = Settings(data_dirs=(data,))
    assert check_worker_path(settings, data / "sub" / "leads.csv") == data / "sub" / "leads.csv"
    assert check_worker_path(settings, f"{data}/sub/../sub/leads.csv") == data / "sub/leads.csv"
    # not there yet: allowed (loading it says it does not exist), never outside
    assert check_worker_path(settings, data / "new.csv") == data / "new.csv"


def test_the_package_demo_data_is_always_allowed() -> None:
    assert check_worker_path(Settings(), demo.LEADS_CSV) == demo.LEADS_CSV.resolve()
    check_fixture_paths(Settings(), [str(demo.FIXTURES)])
    check_worker_path(Settings(), demo.CATALOG)


def test_the_demo_directory_the_policy_names_is_the_demo_package() -> None:
    """The policy names the demo's directory without importing the demo."""
    assert DEMO_DIR == demo.LEADS_CSV.parent.resolve() == PACKAGED_DEMO_DIR.resolve()


@pytest.mark.parametrize(
    "path",
    ["/proc/self/environ", "/etc/passwd", "{data}/../secret.csv", "{data}/sub/../../secret.csv"],
)
def test_a_path_outside_every_data_directory_is_refused_in_one_line(data: Path, path: str) -> None:
    shown = path.format(data=data)
    with pytest.raises(InvalidPlayInput) as info:
        check_worker_path(Settings(data_dirs=(data,)), shown)
    assert str(info.value) == (
        f"CSV path {shown!r} is not in any of this worker's PLAYLINE_DATA_DIRS; {HINT}"
    )


def test_without_data_directories_only_the_demo_and_the_store_are_readable(data: Path) -> None:
    with pytest.raises(InvalidPlayInput) as info:
        check_worker_path(Settings(), data / "sub" / "leads.csv")
    assert "is not in a data directory of this worker (PLAYLINE_DATA_DIRS is unset)" in str(
        info.value
    )


def test_a_symlink_out_of_a_data_directory_is_refused(data: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("KEY=1\n")
    (data / "looks-fine.csv").symlink_to(secret)
    (data / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    settings = Settings(data_dirs=(data,))
    for path in (data / "looks-fine.csv", data / "linked-dir" / "secret.txt"):
        with pytest.raises(InvalidPlayInput, match="is not in any of this worker's"):
            check_worker_path(settings, path)


def test_a_symlinked_data_directory_is_followed(data: Path, tmp_path: Path) -> None:
    (tmp_path / "alias").symlink_to(data, target_is_directory=True)
    settings = Settings(data_dirs=(tmp_path / "alias",))
    assert check_worker_path(settings, data / "sub" / "leads.csv") == data / "sub" / "leads.csv"


def test_fixture_paths_and_a_fixture_directorys_members_are_checked(
    data: Path, tmp_path: Path
) -> None:
    settings = Settings(data_dirs=(data,))
    (data / "fx").mkdir()
    (data / "fx" / "a.jsonl").write_text("")
    check_fixture_paths(settings, [str(data / "fx"), str(data / "fx" / "a.jsonl")])
    with pytest.raises(InvalidPlayInput) as info:
        check_fixture_paths(settings, [str(tmp_path / "other.jsonl")])
    assert str(info.value) == (
        f"fixture path {str(tmp_path / 'other.jsonl')!r} is not in any of this worker's "
        "PLAYLINE_DATA_DIRS; add its directory to PLAYLINE_DATA_DIRS on the workers"
    )
    (tmp_path / "environ.jsonl").write_text("")
    (data / "fx" / "b.jsonl").symlink_to(tmp_path / "environ.jsonl")
    with pytest.raises(InvalidPlayInput, match=r"fixture path '.*b\.jsonl' is not in"):
        check_fixture_paths(settings, [str(data / "fx")])


def test_url_loads_are_off_unless_the_workers_turn_them_on() -> None:
    with pytest.raises(InvalidPlayInput) as info:
        check_url_loads(Settings(), "https://files.example/x.csv")
    assert str(info.value) == (
        "CSV URL https://files.example/x.csv: this worker does not download CSV URLs; set "
        "PLAYLINE_URL_LOADS=on on the workers to allow public URLs, or download the file and "
        "run with `playline run --csv` (a store: reference)"
    )
    check_url_loads(Settings(url_loads=True), "https://files.example/x.csv")


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2001:4860:4860::8888", True),
        ("::ffff:8.8.8.8", True),
        ("127.0.0.1", False),
        ("127.8.9.10", False),
        ("::1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("fd00:ec2::254", False),  # ULA (the AWS IPv6 metadata address)
        ("169.254.169.254", False),  # link-local: the cloud metadata address
        ("fe80::1", False),
        ("224.0.0.1", False),  # multicast is "global" to ipaddress, never a file server
        ("239.1.2.3", False),
        ("ff02::1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("100.64.0.1", False),  # shared address space (CGNAT)
        ("192.0.2.1", False),  # documentation
        ("255.255.255.255", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("::ffff:169.254.169.254", False),
        ("2002:7f00:1::1", False),  # 6to4 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
    ],
)
def test_only_global_unicast_addresses_are_public(address: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is public


def test_allow_hosts_name_a_host_or_a_host_and_port() -> None:
    allow = ["files.internal", "127.0.0.1:8080", "[::1]:9000", "Mixed.Case.", "10.0.0.5"]
    assert host_allowed(allow, "files.internal", 443)
    assert host_allowed(allow, "FILES.internal.", 80)
    assert host_allowed(allow, "127.0.0.1", 8080)
    assert not host_allowed(allow, "127.0.0.1", 8081)
    assert host_allowed(allow, "::1", 9000)
    assert host_allowed(allow, "[::1]", 9000)
    assert not host_allowed(allow, "::1", 80)
    assert host_allowed(allow, "mixed.case", 80)
    assert host_allowed(allow, "10.0.0.5", 1234)
    assert not host_allowed(allow, "files.internal.evil.example", 443)
    assert not host_allowed([], "localhost", 80)
