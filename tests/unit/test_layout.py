"""The package layout keeps its promises: every folder holds what its name says, and
imports run only downward (no circles; the demo and the fake provider stay on top).

Read from the source with ``ast`` (nothing is imported), so a module that breaks a
rule fails here with its name, before a reviewer has to notice.
"""

from __future__ import annotations

import ast
from functools import cache
from itertools import pairwise
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
#: the fixture index.
DRIVERS_OUTSIDE_DB = {
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


def test_datasets_import_only_downward() -> None:
    """Dataset I/O sits on the stores: no Temporal, and of playline only the layers
    below it (never activities, workflows, the CLI, the demo or the fake provider)."""
    below = ("config", "contract", "errors", "package_data", "stores", "datasets")
    allowed = tuple(f"playline.{name}" for name in below)
    for path in modules("datasets"):
        names = imported(path)
        offenders = {
            n
            for n in names
            if n.split(".")[0] == "temporalio"
            or (n.startswith("playline.") and not n.startswith(allowed))
        }
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


# -- imports only downward: no circles, nothing below the command line uses the demo or
# -- the fake provider --------------------------------------------------------------------

#: Modules of ``playline`` by dotted name (``playline.calls`` is ``calls/__init__.py``).
MODULES = {
    ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
    for p in sorted(PACKAGE.rglob("*.py"))
}

#: The demo play and the local fake provider: only these may import them.
TOP_ONLY = ("playline.demo", "playline.provider_server")
ABOVE_THEM = ("playline/cli/", "playline/demo/", "playline/provider_server/", "playline/testing.py")

#: Known imports that break the rule, each to be removed, not added to (none now).
KNOWN_TOP_IMPORTS: set[tuple[str, str]] = set()


def playline_imports(module: str) -> dict[str, int]:
    """The ``playline`` modules ``module`` imports, each with the line of its first import.

    Every import counts, wherever it stands (in a function, under ``if TYPE_CHECKING:``):
    a circle that only typing closes still ties the modules together. ``from a import b``
    is ``a.b`` when that is a module, else ``a``; ``import a.b`` is ``a.b``.
    """
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.setdefault(name, node.lineno)
    return found


def unit(module: str) -> str:
    """The room a module belongs to: its first-level folder, or the top-level module."""
    path = MODULES[module].relative_to(PACKAGE)
    return f"playline/{path.parts[0]}/" if len(path.parts) > 1 else f"playline/{path}"


def rel_module(module: str) -> str:
    return rel(MODULES[module])


def inside(module: str, *packages: str) -> bool:
    """Whether ``module`` is one of ``packages`` or a module inside one."""
    return any(module == p or module.startswith(f"{p}.") for p in packages)


def known(module: str, imported_module: str) -> bool:
    return any(
        rel_module(module) == path and inside(imported_module, target)
        for path, target in KNOWN_TOP_IMPORTS
    )


def a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as ``[a, b, ..., a]``, or ``None`` when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (circle := visit(nxt)) is not None:
                return circle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)) is not None:
            return circle
    return None


@cache
def import_graph() -> dict[str, dict[str, int]]:
    """Every module's ``playline`` imports (read once: the tests below share it)."""
    return {module: playline_imports(module) for module in MODULES}


def test_no_import_circle_between_files() -> None:
    graph = import_graph()
    circle = a_circle({module: set(imports) for module, imports in graph.items()})
    assert circle is None, "import circle: " + "; ".join(
        f"{rel_module(a)}:{graph[a][b]} imports {b}" for a, b in pairwise(circle)
    )


def test_no_import_circle_between_folders_and_top_level_modules() -> None:
    """Each first-level folder (``calls/``) and each top-level module (``freshness.py``)
    is one room; the rooms' imports must run one way."""
    ties: dict[tuple[str, str], tuple[str, str, int]] = {}
    for module, imports in import_graph().items():
        for target, line in imports.items():
            if unit(module) != unit(target) and not known(module, target):
                ties.setdefault((unit(module), unit(target)), (module, target, line))
    rooms: dict[str, set[str]] = {}
    for a, b in ties:
        rooms.setdefault(a, set()).add(b)
    circle = a_circle(rooms)
    assert circle is None, "import circle between rooms: " + "; ".join(
        f"{a} -> {b} ({rel_module(ties[a, b][0])}:{ties[a, b][2]} imports {ties[a, b][1]})"
        for a, b in pairwise(circle)
    )


def test_only_the_command_line_and_the_test_helpers_import_the_demo_or_the_fake_provider() -> None:
    offenders = [
        f"{rel_module(module)}:{line} imports {target}"
        for module, imports in import_graph().items()
        if unit(module) not in ABOVE_THEM
        for target, line in imports.items()
        if inside(target, *TOP_ONLY) and not known(module, target)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_known_exceptions_still_stand() -> None:
    """An exception that no longer holds is taken off the list, so it cannot come back."""
    for path, target in sorted(KNOWN_TOP_IMPORTS):
        module = next((m for m in MODULES if rel_module(m) == path), None)
        still = module is not None and any(inside(t, target) for t in playline_imports(module))
        assert still, f"{path} no longer imports {target}: remove it from KNOWN_TOP_IMPORTS"
