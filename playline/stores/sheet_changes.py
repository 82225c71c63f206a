"""What a run changed in a sheet row: the rule the sheet store applies on write.

Teams re-run enrichment over the same dataset and sync the result to a CRM; they
need to know which cells a re-run changed. A column counts only where the sheet row
already had it before this run computed it (a row or column seen for the first time
is not a change), and its old and new values are compared by presence
(:func:`~playline.freshness.is_present`):

* ``changed``: both present and different;
* ``appeared``: the old value was empty, the new one is present;
* ``disappeared``: the old value was present, the new one is empty.

A run's manifest row keeps two JSON maps: ``changes`` (``{column: {"old", "new"}}``,
only the cells that changed) and ``compared`` (``{column: verdict}``, every column this
run wrote: ``first`` when the row did not have it before, ``same``, or one of the three
kinds above), so a chunk written twice (a retried activity after the first write
committed) records what the first write saw: an existing entry keeps its ``old`` and
takes the new ``new``, and is dropped when they end up equal; a column this run wrote
first stays ``first`` even though the row now has it. Counting ``compared`` by verdict
in SQL gives the run's report without reading the rows into memory.

Pure functions (no I/O), so the rule is stated and tested in one place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from playline.freshness import is_present

__all__ = ["CHANGE_KINDS", "FIRST", "SAME", "change_kind", "changes_report", "merge_changes"]

ChangeKind = Literal["changed", "appeared", "disappeared"]
#: The kinds a report counts, in the order they are shown.
CHANGE_KINDS: tuple[ChangeKind, ...] = ("changed", "appeared", "disappeared")
#: ``compared`` verdicts that are not changes: the column was new to the row, or equal.
FIRST = "first"
SAME = "same"


def change_kind(old: Any, new: Any) -> ChangeKind | None:
    """How ``new`` differs from ``old``, or ``None`` when it is not a change."""
    had, has = is_present(old), is_present(new)
    if had and has:
        return "changed" if old != new else None
    if has:
        return "appeared"
    if had:
        return "disappeared"
    return None


def as_stored(value: Any) -> Any:
    """``value`` as the sheet gives it back (JSON round trip), so an old value read from
    the store and a new one computed now compare alike (tuples, float keys...)."""
    return json.loads(json.dumps(value))


def merge_changes(
    stored: Mapping[str, Any],
    cells: Mapping[str, Any],
    changes: Mapping[str, Any] | None,
    compared: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A manifest row's ``changes`` and ``compared`` after writing ``cells``.

    ``stored`` is the sheet row's data before this write (holding, on a repeated
    write, what the previous write of this run stored); ``changes`` and ``compared``
    are what the manifest row holds so far (``None``: nothing yet).
    """
    changed = dict(changes or {})
    seen = dict(compared or {})
    for column, value in cells.items():
        verdict = seen.get(column)
        if verdict == FIRST:
            continue  # this run wrote it first: its rewrite is no change either
        if verdict is None and column not in stored:
            seen[column] = FIRST
            continue
        entry = changed.get(column)
        old = entry["old"] if isinstance(entry, Mapping) else stored.get(column)
        new = as_stored(value)
        kind = change_kind(old, new)
        if kind is None:
            changed.pop(column, None)
            seen[column] = SAME
        else:
            changed[column] = {"old": old, "new": new}
            seen[column] = kind
    return changed, seen


def changes_report(counts: list[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    """``{column: {"changed", "appeared", "disappeared"}}`` from ``(column, verdict,
    rows)`` counts; a column only ever seen for the first time is left out, so an empty
    report means the dataset had none of these columns before."""
    report: dict[str, dict[str, int]] = {}
    for column, verdict, rows in sorted(counts):
        if verdict == FIRST:
            continue
        tally = report.setdefault(column, dict.fromkeys(CHANGE_KINDS, 0))
        if verdict in tally:
            tally[verdict] += int(rows)
    return report
