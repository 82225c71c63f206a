"""The README's table of presets, written from the preset files themselves.

``python -m playline.presets.table`` prints it; ``tests/unit/test_presets_table.py``
checks that the README holds what it prints now, so a preset changed (or added) is a
README changed. Every figure comes from the presets' models: provider, tools, billing
rule, limits per plan, price and source.
"""

from __future__ import annotations

from playline.calls.billing import BillingSpec
from playline.calls.catalog import Catalog, ProviderSpec, ToolSpec, load_preset, preset_names
from playline.pacing.policy import PacingPolicy

__all__ = ["BEGIN", "END", "presets_table"]

#: The markers around the generated table in README.md.
BEGIN = "<!-- presets table: python -m playline.presets.table -->"
END = "<!-- end of presets table -->"


def limits(pacing: PacingPolicy) -> str:
    """A policy's limits in words: ``15/s, 500/min, 8 at once``."""
    parts = [f"{pacing.rps:g}/s"]
    for field, unit in (("per_minute", "min"), ("per_hour", "h"), ("per_day", "day")):
        value = getattr(pacing, field)
        if value is not None:
            parts.append(f"{value:,}/{unit}")
    parts.append(f"{pacing.max_concurrency} at once")
    return ", ".join(parts)


def plan_limits(provider: ProviderSpec) -> str:
    """The limits of each plan (the one in force first), or of the provider."""
    if not provider.plans:
        return limits(provider.pacing)
    order = sorted(provider.plans, key=lambda name: name != provider.plan)
    shown = []
    for name in order:
        pacing = provider.plans[name].pacing or provider.pacing
        mark = " (default)" if name == provider.plan else ""
        shown.append(f"{name}{mark}: {limits(pacing)}")
    return "; ".join(shown)


def price(provider: ProviderSpec) -> str:
    """The credit price per plan where the preset states one."""
    prices = {
        name: plan.credit_price
        for name, plan in provider.plans.items()
        if plan.credit_price is not None
    }
    if prices:
        currency = provider.currency
        return "; ".join(f"{name}: {value:g} {currency}" for name, value in prices.items())
    if provider.credit_price is not None:
        return f"{provider.credit_price:g} {provider.currency}"
    return "not public"


def billing(tool: ToolSpec) -> str:
    """A tool's billing rule in a few words."""
    spec: BillingSpec = tool.billing
    price_of = spec.price(tool.credits)
    if spec.rule == "per_request":
        words = f"{price_of:g} per request"
    elif spec.rule == "per_hit":
        words = f"{price_of:g} per `{spec.hit}` found"
    elif spec.rule == "refund_on_miss":
        words = f"{price_of:g} taken at submit, refunded when no `{spec.hit}`"
    else:
        words = ", ".join(f"{p:g} per `{name}`" for name, p in spec.fields.items())
    if spec.free_if:
        words += f", free if `{spec.free_if}`"
    if spec.charged_field or spec.charged_header:
        words += f"; reported: `{spec.charged_field or spec.charged_header}`"
    return words


def tool_cell(tool: ToolSpec) -> str:
    """The tool, its endpoint and how calls are grouped."""
    if tool.batch is not None:
        how = f"bulk `{tool.batch.path}`, {tool.batch.max_items} a request"
    elif tool.job is not None:
        how = f"async job `{tool.method} {tool.path}`, {tool.job.max_items} a submit"
        if tool.job.max_jobs_in_flight is not None:
            how += f", {tool.job.max_jobs_in_flight} in flight"
    else:
        how = f"`{tool.method} {tool.path}`"
    return f"`{tool.id}` ({how})"


def presets_table() -> str:
    """The Markdown table of every shipped preset, one row per tool."""
    catalog = Catalog.model_validate({"include": preset_names()})
    rows = [
        "| preset | tool | billing | limits per plan | price per credit | source |",
        "|---|---|---|---|---|---|",
    ]
    for name in preset_names():
        for tool_id in load_preset(name).get("tools", {}):
            tool = catalog.tools[tool_id]
            provider = catalog.providers[tool.provider]
            source = tool.source or provider.source or ""
            rows.append(
                f"| `{name}` | {tool_cell(tool)} | {billing(tool)} | {plan_limits(provider)} "
                f"| {price(provider)} | [docs]({source}) |"
            )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover - a printout
    print(f"{BEGIN}\n{presets_table()}{END}")
