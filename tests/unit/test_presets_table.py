"""The README's presets table is what the preset files say now."""

from __future__ import annotations

from pathlib import Path

from playline.calls.catalog import Catalog, load_preset, preset_names
from playline.presets.table import BEGIN, END, plan_limits, presets_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_is_generated_from_the_presets() -> None:
    text = README.read_text()
    assert BEGIN in text and END in text
    committed = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    assert committed == presets_table().strip(), (
        "README.md's presets table is out of date: paste `python -m playline.presets.table`"
    )


def test_every_preset_tool_has_a_row() -> None:
    table = presets_table()
    for name in preset_names():
        for tool_id in load_preset(name).get("tools", {}):
            assert f"| `{name}` | `{tool_id}` (" in table


def test_a_provider_with_plans_shows_each_plans_limits_default_first() -> None:
    apollo = Catalog.model_validate({"include": ["apollo"]}).providers["apollo"]
    shown = plan_limits(apollo)
    assert shown.startswith("free (default): 1/s, 50/min, 200/h, 600/day")
    assert "basic: 17/s, 1,000/min, 8 at once" in shown
