"""Dataclass records kept as table rows: one column per field, named and ordered as the
fields are.

A store whose record is a dataclass (a receipt, a job) selects and writes the record's
columns in field order, so the column list, the row a record is written as and the
record a row reads back as all follow from the dataclass, said once there. The fields
that hold JSON are stored as :func:`~playline.stores.receipts.stored_json` text, and a
``None`` as ``NULL``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import fields
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from playline.stores.receipts import stored_json

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["record_columns", "record_from_row", "record_values"]

Record = TypeVar("Record", bound="DataclassInstance")


@cache
def record_columns(cls: type[DataclassInstance]) -> tuple[str, ...]:
    """The columns that store a ``cls`` record: its fields' names, in order (read once
    per class: every row read or written asks)."""
    return tuple(f.name for f in fields(cls))


def record_values(record: DataclassInstance, json_fields: Collection[str]) -> tuple[Any, ...]:
    """The row that stores ``record``, in :func:`record_columns` order."""
    return tuple(
        _json_text(getattr(record, name)) if name in json_fields else getattr(record, name)
        for name in record_columns(type(record))
    )


def record_from_row(cls: type[Record], row: Sequence[Any], json_fields: Collection[str]) -> Record:
    """The ``cls`` record a row of its :func:`record_columns` stores."""
    values = zip(record_columns(cls), row, strict=True)
    return cls(**{name: _json_value(v) if name in json_fields else v for name, v in values})


def _json_text(value: Any) -> str | None:
    return None if value is None else stored_json(value)


def _json_value(text: str | None) -> Any:
    return None if text is None else json.loads(text)
