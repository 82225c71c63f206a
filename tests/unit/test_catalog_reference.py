"""The catalog reference (``docs/catalog.md``) is what the catalog's models say, now."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from playline.calls.answer_errors import ErrorFieldSpec
from playline.calls.catalog import Catalog, PlanSpec, ToolSpec
from playline.calls.catalog_reference import REGENERATE, catalog_models, render, sections
from playline.calls.waterfall_spec import AcceptSpec
from playline.cli import main
from playline.freshness import Freshness
from playline.pacing.policy import PacingPolicy

DOC = Path(__file__).resolve().parents[2] / "docs" / "catalog.md"


def test_the_committed_reference_is_what_the_models_say() -> None:
    assert DOC.read_text() == render(), (
        f"docs/catalog.md is out of date with the catalog's models; regenerate it: {REGENERATE}"
    )


@pytest.mark.parametrize("model", catalog_models(), ids=lambda m: m.__name__)
def test_every_field_of_every_catalog_model_is_described(model: type[BaseModel]) -> None:
    undescribed = [
        name for name, info in model.model_fields.items() if not (info.description or "").strip()
    ]
    assert not undescribed, f"{model.__name__} fields without a description: {undescribed}"


def test_the_walk_reaches_every_table_of_the_file() -> None:
    places = {s.model: s.places for s in sections()}
    assert next(iter(places)) is Catalog
    assert places[ToolSpec] == ["tools.<name>"]
    assert places[Freshness] == ["tools.<name>.fresh_for"]
    assert set(places[PacingPolicy]) == {
        "providers.<name>.pacing",
        "providers.<name>.key_pacing",
        "providers.<name>.plans.<name>.pacing",
        "providers.<name>.plans.<name>.key_pacing",
        "tools.<name>.job.poll_pacing",
    }
    assert set(places[AcceptSpec]) == {
        "waterfalls.<name>.accept",
        "waterfalls.<name>.steps[].accept",
    }
    assert places[PlanSpec] == ["providers.<name>.plans.<name>"]
    assert places[ErrorFieldSpec] == ["tools.<name>.error_field"]
    # with the sinks (HubSpot, Salesforce, PostgreSQL, verified rule) and error_field
    assert len(places) == 21


def test_the_reference_names_every_key_in_a_table_row() -> None:
    text = render()
    for model in catalog_models():
        for name, info in model.model_fields.items():
            assert f"| `{info.alias or name}` |" in text, (model.__name__, name)
    assert "| `validate` |" in text  # a waterfall's key is the alias, not the field name
    assert "| `include` (top level) |" in text  # read by hand, not by a model


def test_the_cli_writes_the_reference(tmp_path: Path) -> None:
    out = tmp_path / "catalog.md"
    assert main(["catalog", "reference", "--out", str(out)]) == 0
    assert out.read_text() == render()
