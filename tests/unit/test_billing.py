"""Billing rules: what one answer (or one bulk member) cost, and where the figure came from."""

from __future__ import annotations

from typing import Any

import pytest

from playline.calls.catalog import Catalog
from playline.errors import CatalogError


def _tool(billing: dict[str, Any] | None = None, **extra: Any) -> Any:
    spec: dict[str, Any] = {
        "provider": "p",
        "path": "/x",
        "getters": {"email": "data.email", "mobile": "data.mobile"},
        **extra,
    }
    if billing is not None:
        spec["billing"] = billing
    catalog = Catalog.model_validate(
        {"providers": {"p": {"base_url": "http://127.0.0.1:1"}}, "tools": {"t": spec}}
    )
    return catalog.tools["t"]


FOUND = {"data": {"email": "a@b.co", "mobile": None}}
MISSED = {"data": {"email": None, "mobile": ""}}


def test_without_billing_every_answer_costs_the_tools_credits() -> None:
    tool = _tool(credits=2.5)
    assert tool.charge(FOUND).credits == 2.5
    assert tool.charge(MISSED).credits == 2.5
    assert tool.charge(MISSED).source == "rule"


@pytest.mark.parametrize("rule", ["per_hit", "refund_on_miss"])
def test_per_hit_and_refund_on_miss_charge_only_a_found_value(rule: str) -> None:
    tool = _tool({"rule": rule, "credits": 2, "hit": "email"})
    assert tool.charge(FOUND).credits == 2
    assert tool.charge(MISSED).credits == 0
    assert tool.max_credits == 2


def test_per_field_adds_the_price_of_each_value_found() -> None:
    tool = _tool({"rule": "per_field", "fields": {"email": 1, "mobile": 10}})
    assert tool.charge(FOUND).credits == 1
    assert tool.charge({"data": {"email": "a@b.co", "mobile": "+1"}}).credits == 11
    assert tool.charge(MISSED).credits == 0
    assert tool.max_credits == 11


def test_free_if_makes_an_answer_free() -> None:
    tool = _tool({"rule": "per_request", "credits": 1, "free_if": "free_enrichment"})
    assert tool.charge({"free_enrichment": True}).credits == 0
    assert tool.charge({"free_enrichment": False}).credits == 1


def test_a_reported_charge_wins_over_the_rule() -> None:
    tool = _tool({"rule": "per_hit", "credits": 1, "hit": "email", "charged_header": "X-C"})
    charge = tool.charge(MISSED, reported=3.0)
    assert (charge.credits, charge.source) == (3.0, "provider")
    body = _tool({"rule": "per_request", "credits": 1, "charged_field": "meta.cost"})
    assert body.charge({"meta": {"cost": "0.5"}}).credits == 0.5
    assert body.charge({"meta": {"cost": "n/a"}}).source == "rule"


def test_bulk_members_are_priced_each_and_a_reported_total_is_spread_exactly() -> None:
    tool = _tool({"rule": "per_hit", "credits": 1, "hit": "email", "charged_field": "total"})
    members = [FOUND, MISSED, FOUND]
    shares, source = tool.bulk_charges({}, members)
    assert (shares, source) == ([1.0, 0.0, 1.0], "rule")
    shares, source = tool.bulk_charges({"total": 3}, members)
    assert source == "provider" and sum(shares) == 3 and shares[1] == 0
    shares, _ = tool.bulk_charges({"total": 0.3}, [MISSED, MISSED, MISSED])
    assert abs(sum(shares) - 0.3) < 1e-12 and all(share > 0 for share in shares)


@pytest.mark.parametrize(
    ("billing", "needle"),
    [
        ({"rule": "per_hit"}, "needs 'hit'"),
        ({"rule": "per_field"}, "needs 'fields'"),
        ({"rule": "per_request", "fields": "{ a = 1 }"}, "only applies"),
        ({"rule": "per_minute"}, "rule"),
    ],
)
def test_a_bad_billing_rule_is_refused_when_the_catalog_loads(
    tmp_path: Any, billing: dict[str, Any], needle: str
) -> None:
    body = "\n".join(f"{k} = {v}" if k == "fields" else f'{k} = "{v}"' for k, v in billing.items())
    (tmp_path / "c.toml").write_text(
        '[providers.p]\nbase_url = "http://x"\n[tools.t]\nprovider = "p"\npath = "/x"\n'
        f"[tools.t.billing]\n{body}\n"
    )
    with pytest.raises(CatalogError, match=needle):
        Catalog.from_toml(tmp_path / "c.toml")


def test_an_unknown_preset_is_refused_naming_the_presets(tmp_path: Any) -> None:
    (tmp_path / "c.toml").write_text('include = ["nosuch"]\n[providers]\n[tools]\n')
    with pytest.raises(CatalogError, match="unknown preset 'nosuch'") as caught:
        Catalog.from_toml(tmp_path / "c.toml")
    assert str(tmp_path / "c.toml") in str(caught.value)
    assert (
        "presets: apollo, dropcontact, findymail, fullenrich, hubspot, hunter, prospeo, salesforce"
        in str(caught.value)
    )
