"""A preset's own ``include`` is followed one level: ``include = ["waterfalls"]`` stands alone."""

from __future__ import annotations

from typing import Any

import pytest

from playline.calls import catalog as catalog_module
from playline.calls.catalog import Catalog, load_preset
from playline.errors import CatalogError


def test_the_waterfalls_preset_alone_is_a_whole_catalog() -> None:
    catalog = Catalog.model_validate({"include": ["waterfalls"]})
    assert set(catalog.waterfalls) == set(load_preset("waterfalls")["waterfalls"])
    for waterfall in catalog.waterfalls.values():
        for tool_id in waterfall.tools():
            assert catalog.tool(tool_id).provider in catalog.providers


def test_the_catalog_still_wins_over_a_nested_preset() -> None:
    catalog = Catalog.model_validate(
        {"include": ["waterfalls"], "providers": {"hunter": {"timeout_s": 5}}}
    )
    assert catalog.providers["hunter"].timeout_s == 5
    assert catalog.providers["hunter"].base_url == "https://api.hunter.io"


def fake_presets(monkeypatch: pytest.MonkeyPatch, presets: dict[str, dict[str, Any]]) -> None:
    monkeypatch.setattr(catalog_module, "load_preset", lambda name: presets[name])


def test_nested_presets_come_first_and_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_presets(
        monkeypatch,
        {"a": {}, "b": {}, "chains": {"include": ["a", "b"]}, "other": {"include": ["b"]}},
    )
    assert catalog_module._included(["chains", "a", "other"]) == ["a", "b", "chains", "other"]


def test_an_include_is_followed_one_level_only(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_presets(monkeypatch, {"a": {}, "mid": {"include": ["a"]}, "top": {"include": ["mid"]}})
    with pytest.raises(CatalogError, match="one level only"):
        catalog_module._included(["top"])


def test_a_preset_include_that_is_not_a_list_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_presets(monkeypatch, {"top": {"include": "a"}})
    with pytest.raises(CatalogError, match="preset 'top' 'include'"):
        catalog_module._included(["top"])
