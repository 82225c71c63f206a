"""What a catalog says about a sink: where enriched rows are written back, and how.

A sink is declared under ``[sinks.NAME]`` (or shipped in a preset, ``include =
["hubspot"]``) and validated with the rest of the catalog. Two kinds:

* ``hubspot``: CRM objects upserted by a unique property (``idProperty``) through
  ``POST /crm/v3/objects/{object_type}/batch/upsert``, at most ``max_batch`` inputs per
  request; ``provider`` names the catalog provider giving its base URL, token and pacing;
* ``salesforce``: sObjects upserted by an External ID field through
  ``PATCH /services/data/vXX.X/composite/sobjects/{sobject}/{field}`` (sObject
  Collections, at most 200 records, ``allOrNone`` off, results in order);
* ``postgres``: rows upserted into an existing table by its key columns (the table and
  a unique index on the keys must exist: a sink creates nothing); the database URL is
  read from ``url_env``.

What is written: ``map`` (run column -> destination field) and ``id_column`` (the run
column whose value identifies the record), each overridable on the command line;
per destination field an overwrite policy (``policies``): ``always`` (the default:
write whenever the value differs from what this sink last wrote), ``if_blank`` (only
when the destination's field is empty) or ``if_verified`` (only when the cell passes
the field's ``verified`` rule: the tool that filled it, or another column's value).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from playline.spec_model import SpecModel

__all__ = [
    "FieldPolicy",
    "HubSpotSinkSpec",
    "PostgresSinkSpec",
    "SalesforceSinkSpec",
    "SinkSpec",
    "VerifiedRule",
]

#: When a field may be written: see the module docstring.
FieldPolicy = Literal["always", "if_blank", "if_verified"]

#: A SQL identifier a PostgreSQL sink may name (quoted when used, checked here first).
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

#: HubSpot's documented most inputs per batch upsert request.
HUBSPOT_MAX_BATCH = 100


class VerifiedRule(SpecModel):
    """When a cell counts as verified (``if_verified``): every condition set holds."""

    tools: tuple[str, ...] = ()
    """the cell was filled by one of these tools (its provenance's `tool`)"""
    column: str | None = None
    """another column of the row that must hold one of `values`"""
    values: tuple[str, ...] = ()
    """the values of `column` that mean verified (e.g. `valid`)"""

    @model_validator(mode="after")
    def _one_condition(self) -> VerifiedRule:
        if not self.tools and self.column is None:
            raise ValueError("a verified rule needs `tools` or `column` (with `values`)")
        if self.column is not None and not self.values:
            raise ValueError("a verified rule's `column` needs `values`")
        return self


class _SinkBase(SpecModel):
    map: dict[str, str] = {}
    """run column -> destination field written by default (`--map` adds to it)"""
    id_column: str | None = None
    """the run column identifying the record (`--id` overrides); rows without a value in it are
    never written"""
    policies: dict[str, FieldPolicy] = {}
    """per destination field: "always" (default: written when it differs from what this sink last
    wrote), "if_blank" (only when empty at the destination) or "if_verified" (only when the cell
    passes the field's `verified` rule)"""
    verified: dict[str, VerifiedRule] = {}
    """per destination field with the `if_verified` policy: what makes a cell verified"""
    provenance_fields: bool = False
    """with each field written, also write `<field>_source` (the tool and provider that filled the
    cell) and `<field>_fetched_at` (when, ISO 8601 UTC): only for destinations that have those
    fields"""
    source: str | None = None
    """the documentation the entry was written from (presets cite theirs)"""

    @model_validator(mode="after")
    def _verified_rules(self) -> _SinkBase:
        missing = [
            f for f, p in self.policies.items() if p == "if_verified" and f not in self.verified
        ]
        if missing:
            raise ValueError(f"fields {missing} are if_verified but have no `verified` rule")
        return self

    def policy(self, field: str) -> FieldPolicy:
        return self.policies.get(field, "always")


class HubSpotSinkSpec(_SinkBase):
    """HubSpot CRM objects, upserted in batches by a unique property."""

    kind: Literal["hubspot"]
    """the kind of sink: HubSpot CRM objects"""
    provider: str
    """the catalog provider giving the base URL, the token and the pacing"""
    object_type: Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")]
    """the CRM object type in the path (`contacts`, `companies`, ...)"""
    id_property: str
    """the unique property records are upserted by (`email`, `domain`)"""
    max_batch: Annotated[int, Field(ge=1, le=HUBSPOT_MAX_BATCH)] = HUBSPOT_MAX_BATCH
    """inputs per batch upsert request (HubSpot takes at most 100)"""


#: Salesforce's documented most records per sObject Collections request.
SALESFORCE_MAX_BATCH = 200


class SalesforceSinkSpec(_SinkBase):
    """Salesforce sObjects, upserted in collections by an external ID field."""

    kind: Literal["salesforce"]
    """the kind of sink: Salesforce sObjects"""
    provider: str
    """the catalog provider giving the instance URL, the token and the pacing"""
    sobject: Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")]
    """the sObject type (`Contact`, `Account`, ...)"""
    external_id_field: Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")]
    """the External ID field records are upserted by (e.g. `Email__c`); record ids are not accepted
    by this call"""
    api_version: Annotated[str, Field(pattern=r"^v[0-9]+\.[0-9]$")] = "v62.0"
    """the REST API version"""
    max_batch: Annotated[int, Field(ge=1, le=SALESFORCE_MAX_BATCH)] = SALESFORCE_MAX_BATCH
    """records per request (Salesforce takes at most 200)"""

    @model_validator(mode="after")
    def _no_if_blank(self) -> SalesforceSinkSpec:
        if "if_blank" in self.policies.values():
            raise ValueError("salesforce sinks do not support the if_blank policy yet")
        return self


class PostgresSinkSpec(_SinkBase):
    """A table of an existing PostgreSQL database, upserted by its key columns."""

    kind: Literal["postgres"]
    """the kind of sink: a PostgreSQL table"""
    url_env: str
    """the environment variable holding the database URL"""
    table: str
    """the table, optionally schema-qualified (`crm.contacts`)"""
    key_columns: Annotated[tuple[str, ...], Field(min_length=1)]
    """the table's columns records are matched on (a unique index must cover them); the first takes
    the record id"""
    max_batch: Annotated[int, Field(ge=1, le=10_000)] = 500
    """rows per transaction"""

    @field_validator("table")
    @classmethod
    def _table_name(cls, value: str) -> str:
        if not all(_IDENTIFIER.match(part) for part in value.split(".")) or value.count(".") > 1:
            raise ValueError(f"table {value!r} is not a plain [schema.]name")
        return value

    @field_validator("key_columns")
    @classmethod
    def _key_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [name for name in value if not _IDENTIFIER.match(name)]
        if bad:
            raise ValueError(f"key columns {bad} are not plain column names")
        return value


#: One sink, told apart by ``kind``.
SinkSpec = Annotated[
    HubSpotSinkSpec | SalesforceSinkSpec | PostgresSinkSpec, Field(discriminator="kind")
]


def check_identifier(name: str) -> str:
    """``name`` if it can be a PostgreSQL column name (quoted), else ``ValueError``."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a plain column name")
    return name
