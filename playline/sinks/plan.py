"""What a sync would write: per record and field, a verdict (pure logic, no I/O).

A run's row becomes a record when it finished (``ok``) and has a value in the id
column; then each mapped column gets a verdict:

``write``          the value differs from what this sink last wrote (or it never did)
``if_blank``       written only where the destination's field is empty (checked when
                   the batch is sent: the destination is asked first)
``unchanged``      this sink already wrote this value (or kept it out, ``if_blank``)
``blank``          the cell has no value: never written as a blank
``not verified``   ``if_verified`` and the cell fails the field's rule

A row that failed, is still held, or has no id is never written at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from playline.sinks.spec import FieldPolicy, VerifiedRule
from playline.stores.sheet import RunRow

__all__ = [
    "FieldVerdict",
    "RecordPlan",
    "SkippedRow",
    "SyncMapping",
    "cell_text",
    "plan_row",
]

WRITE = "write"
IF_BLANK = "if_blank"
UNCHANGED = "unchanged"
BLANK = "blank"
NOT_VERIFIED = "not verified"
#: verdicts whose field goes in the batch
SENT = frozenset({WRITE, IF_BLANK})


def cell_text(value: Any) -> str | None:
    """A cell as the text a destination compares and stores; ``None`` for no value.

    CRM properties are strings; a float that is a whole number loses its ``.0``; a
    list or mapping (a cell holding a structure) is not a field value: ``None``.
    """
    if value is None or isinstance(value, (list, dict)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value.is_integer():
            return str(int(value))
    text = str(value).strip()
    return text or None


@dataclass(frozen=True, slots=True)
class SyncMapping:
    """Which run column identifies a record, and which columns go to which fields."""

    id_column: str
    #: run column -> destination field, in the order given
    fields: dict[str, str]
    policies: Mapping[str, FieldPolicy] = field(default_factory=dict)
    verified: Mapping[str, VerifiedRule] = field(default_factory=dict)
    #: with each field sent, its ``<field>_source`` and ``<field>_fetched_at``
    provenance_fields: bool = False

    def policy(self, destination_field: str) -> FieldPolicy:
        return self.policies.get(destination_field, "always")

    def destination_fields(self) -> list[str]:
        """Every field a sync may write (provenance fields included)."""
        names = list(self.fields.values())
        if self.provenance_fields:
            names += [f"{n}{suffix}" for n in list(names) for suffix in ("_source", "_fetched_at")]
        return names


@dataclass(frozen=True, slots=True)
class FieldVerdict:
    field: str
    column: str
    value: Any
    verdict: str
    #: what this sink last wrote to the field (``None``: nothing)
    previous: str | None = None
    policy: FieldPolicy = "always"


@dataclass(frozen=True, slots=True)
class RecordPlan:
    """One record's verdicts; ``sends`` says whether the batch carries it."""

    record: str
    row_key: str
    verdicts: tuple[FieldVerdict, ...]

    @property
    def sends(self) -> bool:
        return any(v.verdict in SENT for v in self.verdicts)

    @property
    def writes(self) -> dict[str, Any]:
        """The fields to send, with their values (``if_blank`` ones included)."""
        return {v.field: v.value for v in self.verdicts if v.verdict in SENT}

    @property
    def if_blank(self) -> tuple[str, ...]:
        return tuple(v.field for v in self.verdicts if v.verdict == IF_BLANK)

    @property
    def values(self) -> dict[str, Any]:
        """Every mapped field with a value (a destination's extra key columns read it)."""
        return {v.field: v.value for v in self.verdicts if v.verdict != BLANK}

    @property
    def held_by_policy(self) -> bool:
        return any(v.verdict == NOT_VERIFIED for v in self.verdicts)

    def payload(self) -> dict[str, Any]:
        """What the batch's receipt key covers for this record (texts, sorted): what
        is sent, and what the ledger held before, so a value written, changed and
        changed back is a new call, not the first one's answer."""
        sent = [v for v in self.verdicts if v.verdict in SENT]
        return {
            "record": self.record,
            "writes": {v.field: cell_text(v.value) for v in sorted(sent, key=_by_field)},
            "previous": {v.field: v.previous for v in sorted(sent, key=_by_field)},
            "if_blank": sorted(self.if_blank),
        }


def _by_field(verdict: FieldVerdict) -> str:
    return verdict.field


@dataclass(frozen=True, slots=True)
class SkippedRow:
    """A row of the run that is no record: why (failed, held, no id, a repeated id)."""

    row_key: str
    reason: str


def plan_row(
    row: RunRow,
    mapping: SyncMapping,
    previous: Mapping[str, tuple[Any, str]],
) -> RecordPlan | SkippedRow:
    """The record ``row`` makes, with a verdict per mapped field; ``previous`` is what
    the sync ledger holds for it (``{field: (value, state)}``)."""
    if row.status == "error":
        return SkippedRow(row.row_key, f"row failed: {row.error or 'error'}")
    if row.status != "ok":
        return SkippedRow(row.row_key, f"row not done ({row.status})")
    record = cell_text(row.data.get(mapping.id_column))
    if record is None:
        return SkippedRow(row.row_key, f"no value in id column {mapping.id_column!r}")
    verdicts = []
    for column, destination_field in mapping.fields.items():
        value = row.data.get(column)
        text = cell_text(value)
        before = previous.get(destination_field)
        last = cell_text(before[0]) if before is not None else None
        policy = mapping.policy(destination_field)
        if text is None:
            verdict = BLANK
        elif last is not None and last == text:
            verdict = UNCHANGED
        elif policy == "if_verified" and not _verified(
            row, column, mapping.verified.get(destination_field)
        ):
            verdict = NOT_VERIFIED
        elif policy == "if_blank":
            verdict = IF_BLANK
        else:
            verdict = WRITE
        verdicts.append(
            FieldVerdict(destination_field, column, value, verdict, previous=last, policy=policy)
        )
        if mapping.provenance_fields and verdict in SENT:
            verdicts += _provenance_verdicts(row, column, destination_field, verdict, previous)
    return RecordPlan(record, row.row_key, tuple(verdicts))


def _provenance_verdicts(
    row: RunRow,
    column: str,
    destination_field: str,
    verdict: str,
    previous: Mapping[str, tuple[Any, str]],
) -> list[FieldVerdict]:
    """``<field>_source`` and ``<field>_fetched_at`` of a field being sent (with the
    field's verdict: an ``if_blank`` field's provenance goes only where it goes)."""
    cell = (row.provenance or {}).get(column) or {}
    tool, provider = cell.get("tool"), cell.get("provider")
    source = f"{tool} ({provider})" if tool and provider else tool
    fetched = cell.get("fetched_at")
    when = (
        datetime.fromtimestamp(fetched, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        if isinstance(fetched, int | float)
        else None
    )
    found = []
    for suffix, value in (("_source", source), ("_fetched_at", when)):
        if value is None:
            continue
        name = f"{destination_field}{suffix}"
        before = previous.get(name)
        found.append(
            FieldVerdict(
                name,
                column,
                value,
                verdict,
                previous=cell_text(before[0]) if before is not None else None,
            )
        )
    return found


def _verified(row: RunRow, column: str, rule: VerifiedRule | None) -> bool:
    """Whether the cell passes ``rule``: the tool that filled it, another column's value."""
    if rule is None:
        return False
    if rule.tools:
        cell = (row.provenance or {}).get(column) or {}
        if cell.get("tool") not in rule.tools:
            return False
    return rule.column is None or cell_text(row.data.get(rule.column)) in rule.values
