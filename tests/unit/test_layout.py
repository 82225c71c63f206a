"""The package layout keeps its promises: every folder holds what its name says.

Read from the source with ``ast`` (nothing is imported), so a module that breaks a
rule fails here with its name, before a reviewer has to notice.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import playline

PACKAGE = Path(playline.__file__).resolve().parent


def modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute (``from x import y`` gives ``x`` and ``x.y``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_every_module_in_activities_defines_an_activity() -> None:
    found = [p for p in modules("activities") if p.name != "__init__.py"]
    assert found
    for path in found:
        assert "@activity.defn(" in path.read_text(), f"{rel(path)} defines no activity"


@pytest.mark.parametrize("folder", ["calls", "pacing", "stores"])
def test_calls_pacing_and_stores_never_import_temporal(folder: str) -> None:
    for path in modules(folder):
        offenders = {n for n in imported(path) if n.split(".")[0] == "temporalio"}
        assert not offenders, f"{rel(path)} imports {sorted(offenders)}"


def test_pacing_knows_nothing_of_the_catalog_or_the_call_path() -> None:
    for path in modules("pacing"):
        offenders = {
            n for n in imported(path) if n.startswith(("playline.calls", "playline.stores"))
        }
        assert not offenders, f"{rel(path)} imports {sorted(offenders)}"


#: Modules that still drive a database themselves, until they move onto playline.db:
#: the receipt and sheet stores with their engines, fleet pacing, the fixture index.
DRIVERS_OUTSIDE_DB = {
    "playline/stores/receipts_sqlite.py",
    "playline/stores/receipts_postgres.py",
    "playline/stores/sheet_sqlite.py",
    "playline/stores/sheet_postgres.py",
    "playline/stores/sqlite_db.py",
    "playline/stores/postgres_db.py",
    "playline/stores/migrations.py",
    "playline/pacing/fleet_store.py",
    "playline/calls/fixtures.py",
}


def test_only_playline_db_imports_a_database_driver() -> None:
    """Stores are written over ``playline.db`` (``Conn``), never over sqlite3/psycopg."""
    drivers = {"sqlite3", "psycopg", "psycopg_pool"}
    for path in modules("."):
        if path.parent.name == "db" or rel(path) in DRIVERS_OUTSIDE_DB:
            continue
        offenders = {n for n in imported(path) if n.split(".")[0] in drivers}
        assert not offenders, f"{rel(path)} imports {sorted(offenders)}"


def test_playline_db_is_the_bottom_of_the_house() -> None:
    """``playline.db`` imports nothing of playline but itself and the base errors."""
    for path in modules("db"):
        offenders = {
            n
            for n in imported(path)
            if n.startswith("playline.") and not n.startswith(("playline.db", "playline.errors"))
        }
        assert not offenders, f"{rel(path)} imports {sorted(offenders)}"


def test_workflows_import_no_calls_pacing_or_stores() -> None:
    forbidden = ("playline.calls", "playline.pacing", "playline.stores", "playline.services")
    for path in modules("workflows"):
        offenders = {n for n in imported(path) if n.startswith(forbidden)}
        assert not offenders, f"{rel(path)} imports {sorted(offenders)}"


def test_workflows_call_activities_by_reference_not_by_name() -> None:
    """No activity type name is written in workflow code: the references carry them."""
    for path in modules("workflows"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "").startswith(
                ("execute_activity", "start_activity", "execute_local_activity")
            ):
                first = node.args[0] if node.args else None
                assert not isinstance(first, ast.Constant), (
                    f"{rel(path)}:{node.lineno} calls an activity by a string name"
                )


def test_only_config_reads_the_environment() -> None:
    """``Settings.from_env`` is the one reader; the fake provider (a test double) builds
    its child process's environment and is the only other user of ``os.environ``."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "config.py" and path.parent == PACKAGE:
            continue
        if path.parent.name == "provider_server":
            continue
        text = path.read_text()
        for needle in ("os.environ", "os.getenv", "getenv("):
            assert needle not in text, f"{rel(path)} reads the environment ({needle})"


def test_errors_import_nothing_from_playline_or_temporal() -> None:
    """Every layer raises these, so they depend on nothing above them."""
    names = imported(PACKAGE / "errors.py")
    assert not {n for n in names if n.split(".")[0] in ("playline", "temporalio")}
