"""``SpecModel``: the base of the catalog's spec models, the pacing limits and the
governor's constants.

A catalog file is refused on any key its models do not declare, and a loaded spec is
never changed in place, so every spec model forbids extra keys and is frozen. Each
field's meaning is the docstring written right under it: pydantic makes it the
field's ``description``, which ``playline catalog reference`` writes into
``docs/catalog.md``, so a field is described once, beside its declaration.

This module imports only pydantic, so the lowest modules (pacing, freshness) can use it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["SpecModel"]


class SpecModel(BaseModel):
    """A frozen pydantic model refusing unknown keys, its fields described by docstrings."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
