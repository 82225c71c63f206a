"""playline's search attributes: the typed keys a play upserts as it runs.

With them a namespace's workflow list answers questions about plays, in the
Temporal UI, the ``temporal`` CLI and ``playline runs list``::

    temporal workflow list --query 'PlaylinePlay = "enrich_leads" AND PlaylineStatus = "paused"'
    temporal workflow list --query 'PlaylineRowsFailed > 0'

A namespace must register them before a play may upsert them (Temporal fails the
workflow task of a play that upserts an unknown attribute, over and over), so a play
asks once, at its start, which of them are registered and upserts only those.
``playline dev``, ``playline demo`` and the test fixtures start their dev server
with them; ``playline setup`` registers them on a cluster.
"""

from __future__ import annotations

from typing import Any

from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey

__all__ = [
    "ALL_KEYS",
    "CREDITS",
    "KIND",
    "PLAY",
    "ROWS_DONE",
    "ROWS_FAILED",
    "ROWS_TOTAL",
    "STATUS",
    "dev_server_flags",
    "type_name",
]

#: the play (its workflow type); set on plays only, so ``PlaylinePlay IS NOT NULL`` lists plays
PLAY = SearchAttributeKey.for_keyword("PlaylinePlay")
#: ``running``, ``paused``, ``waiting``, ``cancelling``, ``completed``, ``failed``, ``cancelled``
STATUS = SearchAttributeKey.for_keyword("PlaylineStatus")
ROWS_TOTAL = SearchAttributeKey.for_int("PlaylineRowsTotal")
ROWS_DONE = SearchAttributeKey.for_int("PlaylineRowsDone")
ROWS_FAILED = SearchAttributeKey.for_int("PlaylineRowsFailed")
CREDITS = SearchAttributeKey.for_float("PlaylineCredits")
#: ``run`` or ``estimate``: an estimate (``playline estimate``) is a play run that sends
#: nothing, kept out of ``playline runs list`` unless asked for
KIND = SearchAttributeKey.for_keyword("PlaylineKind")

ALL_KEYS: tuple[SearchAttributeKey[Any], ...] = (
    PLAY,
    STATUS,
    ROWS_TOTAL,
    ROWS_DONE,
    ROWS_FAILED,
    CREDITS,
    KIND,
)
#: The keys ``playline runs list`` needs to search plays (``KIND`` came later: a
#: namespace set up before it still lists plays, estimates included).
LIST_KEYS = ALL_KEYS[:-1]

#: The names the Temporal CLI and server use for each value type.
_TYPE_NAMES = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
}


def type_name(key: SearchAttributeKey[Any]) -> str:
    """``Keyword``, ``Int`` or ``Double``: the type as ``temporal`` spells it."""
    return _TYPE_NAMES[key.indexed_value_type]


def dev_server_flags() -> list[str]:
    """``--search-attribute NAME=TYPE`` for each key, for ``temporal server start-dev``."""
    flags: list[str] = []
    for key in ALL_KEYS:
        flags += ["--search-attribute", f"{key.name}={type_name(key)}"]
    return flags
