"""Whether a row's computed cells can be stored, checked when the row finishes.

The sheet stores keep cells as JSON (PostgreSQL as ``jsonb``), which cannot hold NaN
or Infinity, a NUL character, a lone surrogate, or a value JSON does not have (a
datetime, a set, a Decimal). One such value used to fail the write of a whole group
of rows, and with it the chunk, twenty times over. Checked per row, it fails only its
own row, with a message naming the column.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["unstorable_columns"]

#: ``\u0000`` as JSON escapes it, not preceded by an escaping backslash.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _problem(value: Any) -> str | None:
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as err:
        return str(err)
    except RecursionError:
        return "the value is nested too deeply"
    if "\\u0000" in text and _NUL.search(text):
        return "it holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "it holds a lone surrogate (not valid Unicode)"
    return None


def unstorable_columns(cells: Mapping[str, Any]) -> dict[str, str]:
    """The columns whose values cannot be stored, each with why (empty: all fine).

    The whole row is checked at once; only a row that fails is looked at column by
    column, so a good row costs one ``json.dumps``.
    """
    if _problem(cells) is None:
        return {}
    found = {}
    for name, value in cells.items():
        problem = _problem(value)
        if problem is not None:
            found[name] = problem
    return found
