"""A provider's plans: the one in force fills the limits and price the table leaves unset."""

from __future__ import annotations

from pathlib import Path

import pytest

from playline.calls.catalog import Catalog, ProviderSpec
from playline.errors import CatalogError

PLANS = """
tools = {}
[providers.acme]
base_url = "https://api.acme.example"
plan = "free"
[providers.acme.plans.free]
source = "https://docs.acme.example/limits"
pacing = { per_minute = 50, per_hour = 200, per_day = 600, max_concurrency = 4 }
credit_price = 0.0
[providers.acme.plans.pro]
pacing = { per_minute = 1000, max_concurrency = 8 }
credit_price = 0.05
currency = "EUR"
"""


def load(tmp_path: Path, text: str) -> Catalog:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return Catalog.from_toml(path)


def test_the_plan_in_force_gives_its_pacing_and_price(tmp_path: Path) -> None:
    acme = load(tmp_path, PLANS).providers["acme"]
    assert acme.plan == "free"
    assert (acme.pacing.per_minute, acme.pacing.per_hour, acme.pacing.per_day) == (50, 200, 600)
    assert acme.credit_price == 0.0
    assert acme.currency == "USD"
    assert acme.plan_in_force is not None
    assert acme.plan_in_force.source == "https://docs.acme.example/limits"


def test_another_plan_changes_limits_and_price(tmp_path: Path) -> None:
    acme = load(tmp_path, PLANS.replace('plan = "free"', 'plan = "pro"')).providers["acme"]
    assert acme.pacing.per_minute == 1000
    assert acme.pacing.per_hour is None and acme.pacing.per_day is None
    assert (acme.credit_price, acme.currency) == (0.05, "EUR")


def test_keys_the_table_sets_win_over_the_plan(tmp_path: Path) -> None:
    text = PLANS.replace(
        'plan = "free"', 'plan = "pro"\npacing = { per_minute = 7 }\ncredit_price = 0.5'
    )
    acme = load(tmp_path, text).providers["acme"]
    assert acme.pacing.per_minute == 7
    assert acme.credit_price == 0.5
    assert acme.currency == "EUR"  # not set by the table: still the plan's


def test_an_unknown_plan_is_one_line_naming_the_plans(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as err:
        load(tmp_path, PLANS.replace('plan = "free"', 'plan = "gold"'))
    message = str(err.value)
    assert "\n" not in message
    assert "unknown plan 'gold'" in message and "free, pro" in message


def test_plans_without_a_plan_in_force_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="no plan is chosen"):
        load(tmp_path, PLANS.replace('plan = "free"\n', ""))


def test_a_plan_without_plans_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown plan 'free'; the provider's plans: none"):
        ProviderSpec.model_validate({"base_url": "https://x.example", "plan": "free"})


def test_a_plan_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"plans\.free\.rps"):
        load(tmp_path, PLANS.replace("credit_price = 0.0", "rps = 3"))


def test_a_users_provider_table_merges_key_by_key_over_the_presets(tmp_path: Path) -> None:
    preset = load(tmp_path, 'include = ["hunter"]\n').providers["hunter"]
    own = load(tmp_path, 'include = ["hunter"]\n[providers.hunter]\ntimeout_s = 99\n')
    hunter = own.providers["hunter"]
    assert hunter.timeout_s == 99
    assert hunter.base_url == preset.base_url and hunter.auth == preset.auth
    assert hunter.pacing == preset.pacing
    assert "hunter_email_finder" in own.tools


def test_a_users_tool_still_replaces_the_presets_whole(tmp_path: Path) -> None:
    own = load(
        tmp_path,
        'include = ["hunter"]\n[tools.hunter_email_finder]\nprovider = "hunter"\npath = "/x"\n',
    )
    tool = own.tools["hunter_email_finder"]
    assert tool.path == "/x" and tool.getters == {}
