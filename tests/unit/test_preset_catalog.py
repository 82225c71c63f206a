"""Every shipped preset together: the catalog a GTM team chains (finders, verifiers,
person and company enrichment, phones), each entry citing its docs, each provider's
limits stated per plan, and the named waterfalls resolving across presets."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from playline.calls.catalog import PRESETS_PACKAGE, Catalog, preset_names

#: The presets written from their providers' plan pages (issue 31): each lists its plans.
PLANNED_PRESETS = (
    "anymailfinder",
    "bouncer",
    "enrichlayer",
    "leadmagic",
    "lusha",
    "peopledatalabs",
)
#: What every one of those presets' header comment states (the issue's list).
HEADER_TOPICS = ("billing", "idempotency", "limits", "leave unsaid")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.model_validate({"include": preset_names()})


def preset_text(name: str) -> str:
    return resources.files(PRESETS_PACKAGE).joinpath(f"{name}.toml").read_text()


def header(name: str) -> str:
    """The comment block a preset file opens with."""
    lines = []
    for line in preset_text(name).splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").lower())
    return " ".join(lines)


def test_all_presets_load_together_into_a_catalog_of_12_providers_and_24_tools(
    catalog: Catalog,
) -> None:
    assert len(catalog.providers) >= 12, sorted(catalog.providers)
    assert len(catalog.tools) >= 24, sorted(catalog.tools)


def test_every_provider_and_tool_cites_the_page_it_was_written_from(catalog: Catalog) -> None:
    for name, provider in catalog.providers.items():
        assert provider.source and provider.source.startswith("https://"), name
        for plan_name, plan in provider.plans.items():
            assert plan.source and plan.source.startswith("https://"), (name, plan_name)
    for tool_id, tool in catalog.tools.items():
        assert tool.source and tool.source.startswith("https://"), tool_id


def test_every_provider_states_its_limits_and_the_new_ones_list_their_plans(
    catalog: Catalog,
) -> None:
    for name in PLANNED_PRESETS:
        provider = catalog.providers[name]
        assert provider.plans, f"{name} lists no plans"
        assert provider.plan in provider.plans, name
        for plan_name, plan in provider.plans.items():
            assert plan.pacing is not None, (name, plan_name)
        # The plan in force is what paces the provider (the preset sets no pacing itself).
        in_force = provider.plan_in_force
        assert in_force is not None and provider.pacing == in_force.pacing, name
    for name, provider in catalog.providers.items():
        declared = tomllib.loads(preset_text(_preset_of(name)))["providers"][name]
        assert "pacing" in declared or provider.plans, f"{name} states no limits"


def _preset_of(provider: str) -> str:
    for name in preset_names():
        if provider in tomllib.loads(preset_text(name)).get("providers", {}):
            return name
    raise AssertionError(f"no preset declares provider {provider!r}")


@pytest.mark.parametrize("name", PLANNED_PRESETS)
def test_a_preset_header_states_billing_idempotency_limits_and_what_the_docs_leave_unsaid(
    name: str,
) -> None:
    text = header(name)
    for topic in HEADER_TOPICS:
        assert topic in text, f"{name}.toml's header does not say {topic!r}"


def test_the_named_waterfalls_chain_finders_a_verifier_and_phone_sources(
    catalog: Catalog,
) -> None:
    work = catalog.waterfall("work_email")
    assert 3 <= len(work.steps) <= 5
    assert len({catalog.tool(s.tool).provider for s in work.steps}) == len(work.steps)
    verified = catalog.waterfall("verified_work_email")
    assert verified.validate_with is not None
    verifier = catalog.tool(verified.validate_with.tool)
    assert verifier.provider not in {catalog.tool(s.tool).provider for s in verified.steps}
    assert verified.validate_with.field in verifier.getters
    phone = catalog.waterfall("mobile_phone")
    assert phone.value == "phone" and len(phone.steps) >= 3
    for waterfall in (work, verified, phone):
        for step in waterfall.steps:
            tool = catalog.tool(step.tool)
            assert waterfall.value in tool.getters, (step.tool, waterfall.value)
            mapped = set(step.input) if step.input is not None else set(tool.input)
            required = {f for f, kind in tool.input.items() if not kind.endswith("?")}
            assert required <= mapped, (step.tool, sorted(required - mapped))
