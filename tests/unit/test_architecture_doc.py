"""docs/ARCHITECTURE.md names only modules and classes that exist.

A file moved or a class renamed fails here with the names to update in the map.
"""

from __future__ import annotations

import re
from pathlib import Path

import playline

PACKAGE = Path(playline.__file__).resolve().parent
DOC = PACKAGE.parent / "docs" / "ARCHITECTURE.md"


def test_every_module_path_in_the_map_exists() -> None:
    files = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    named = set(re.findall(r"\b[a-z_]+(?:/[a-z_]+)*\.py\b", DOC.read_text()))
    missing = sorted(
        name
        for name in named
        if not any(f == name or f.endswith("/" + name) for f in files)
        and not (PACKAGE.parent / name).is_file()
    )
    assert not missing, f"docs/ARCHITECTURE.md names modules that do not exist: {missing}"


def test_every_class_name_in_the_map_exists() -> None:
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    named = set(re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]*)+\b", DOC.read_text()))
    missing = sorted(name for name in named if not re.search(rf"\b{name}\b", source))
    assert not missing, f"docs/ARCHITECTURE.md names classes that do not exist: {missing}"
