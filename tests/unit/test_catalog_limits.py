"""The catalog's limit fields: every README example loads, keys and timeouts resolve."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from playline.calls.catalog import Catalog, key_pacing_key
from playline.pacing.policy import PacingPolicy

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_limits_example() -> dict[str, dict[str, object]]:
    text = README.read_text()
    section = text[text.index("## Limits") : text.index("## Configuration")]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    return tomllib.loads(block.group(1))["providers"]


def test_every_readme_limits_example_is_a_valid_catalog() -> None:
    providers = readme_limits_example()
    for spec in providers.values():
        spec.setdefault("base_url", "http://127.0.0.1:8787")
    catalog = Catalog.model_validate({"providers": providers, "tools": {}})
    assert catalog.providers["zoominfo"].pacing.windows() == {3600.0: 10800, 86400.0: 129600}
    assert catalog.providers["apollo"].pacing.sustained_rps() == pytest.approx(600 / 86400)
    policies = catalog.pacing_policies()
    keys = catalog.pacing_keys("acme")
    assert keys == [
        key_pacing_key("acme", env) for env in ("ACME_KEY_A", "ACME_KEY_B", "ACME_KEY_C")
    ]
    assert all(policies[k] == PacingPolicy(rps=20, per_day=1000) for k in keys)
    assert policies["acme"].rps == 50
    assert catalog.pacing_keys("enrich") == []  # one key, no key_pacing: paced as a whole
    assert catalog.secret_variables() == ["ACME_KEY_A", "ACME_KEY_B", "ACME_KEY_C"]


def test_bad_limits_are_rejected_with_the_field_named() -> None:
    for bad in ({"per_day": 0}, {"rps": 0}, {"per_minute": -5}, {"burst": 0}):
        with pytest.raises(ValidationError) as err:
            PacingPolicy.model_validate(bad)
        assert next(iter(bad)) in str(err.value)
    with pytest.raises(ValidationError, match="distinct"):
        Catalog.model_validate(
            {
                "providers": {"a": {"base_url": "http://x", "auth": {"env": ["K", "K"]}}},
                "tools": {},
            }
        )


def test_a_tool_timeout_overrides_its_providers() -> None:
    catalog = Catalog.model_validate(
        {
            "providers": {"a": {"base_url": "http://x", "timeout_s": 9}},
            "tools": {
                "t": {"provider": "a", "path": "/t", "timeout_s": 1.5},
                "u": {"provider": "a", "path": "/u"},
            },
        }
    )
    assert catalog.tools["t"].timeout_s == 1.5
    assert catalog.tools["u"].timeout_s is None
