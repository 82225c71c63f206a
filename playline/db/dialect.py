"""What differs between SQLite and PostgreSQL, in one small table.

Store code is written once, in the SQL both databases speak (``?`` placeholders,
``INSERT ... ON CONFLICT``, ``CASE``, ``substr``), and reaches for a :class:`Dialect`
only where they really differ: locking a row it reads (``FOR UPDATE``: PostgreSQL
locks rows, while SQLite's ``BEGIN IMMEDIATE`` already holds the whole file), type
names in new DDL, the clock, how placeholders are spelled, and the two JSON
functions the sheet needs (merging objects, listing an object's members, reading a
member as a number) and rounding down. Nothing outside
:mod:`playline.db` asks which database it runs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Literal

__all__ = ["POSTGRES", "SQLITE", "Dialect", "marks"]


@dataclass(frozen=True)
class Dialect:
    """One database's spelling of what differs."""

    name: Literal["sqlite", "postgresql"]
    #: appended to a ``SELECT`` that reads rows the transaction will change
    for_update: str
    #: type names for new DDL (``{text}``, ``{real}``, ``{int}``, ``{bigint}`` in a
    #: migration's statements)
    types: Mapping[str, str] = field(default_factory=dict)
    #: a query for the database's clock (epoch seconds), ``None``: this machine's
    now_sql: str | None = None
    #: placeholders one statement may hold (SQLite's limit, with room to spare)
    max_params: int = 500
    #: JSON object ``{0}`` with the members of ``{1}`` set over it (``str.format``)
    json_merge: str = "json_patch({0}, {1})"
    #: the table function giving a JSON object's members as rows ``(key, value)``,
    #: values as text
    json_each: str = "json_each"
    #: a JSON object ``{0}``'s member ``{1}`` (an SQL text expression) as a number when
    #: it is a JSON number, else ``NULL`` (``str.format``)
    json_number: str = "CASE WHEN typeof({0} ->> {1}) IN ('integer', 'real') THEN {0} ->> {1} END"
    #: the largest integer not above ``{0}``, for a number ``>= 0`` (SQLite's ``CAST``
    #: truncates, PostgreSQL's rounds)
    floor: str = "CAST({0} AS INTEGER)"

    def sql(self, text: str) -> str:
        """``text`` (written with ``?`` placeholders) as this database's driver wants it."""
        return _pyformat(text) if self.name == "postgresql" else text


@lru_cache(maxsize=1024)
def _pyformat(text: str) -> str:
    """``?`` placeholders as psycopg's ``%s``, and a literal ``%`` doubled; once per
    statement text (store SQL is a handful of constant strings)."""
    return text.replace("%", "%%").replace("?", "%s")


def marks(count: int) -> str:
    """``count`` placeholders for ``IN (...)``: ``"?, ?, ?"``."""
    if count < 1:
        raise ValueError("an IN list needs at least one value")
    return ", ".join("?" * count)


SQLITE = Dialect(
    name="sqlite",
    for_update="",
    types=MappingProxyType({"text": "TEXT", "real": "REAL", "int": "INTEGER", "bigint": "INTEGER"}),
)

POSTGRES = Dialect(
    name="postgresql",
    for_update=" FOR UPDATE",
    types=MappingProxyType(
        {"text": "text", "real": "float8", "int": "integer", "bigint": "bigint"}
    ),
    now_sql="SELECT extract(epoch FROM statement_timestamp())::float8",
    json_merge="{0} || {1}",
    json_each="jsonb_each_text",
    json_number="CASE WHEN jsonb_typeof({0} -> {1}) = 'number' THEN ({0} ->> {1})::float8 END",
    floor="floor({0})",
)
