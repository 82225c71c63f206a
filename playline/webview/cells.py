"""A cell's provenance as the sheet's side panel shows it: plain lines and a step table.

Pure (no store, no request): the words are the export's (``source_text``,
``credits_text``, ``iso_utc``), so the panel and a CSV with provenance agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from playline.money import money_text
from playline.stores.provenance_cells import credits_text, date_utc, iso_utc, source_text

__all__ = ["CellPanel", "cell_panel"]


@dataclass
class CellPanel:
    column: str
    outcome: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    #: a waterfall's steps: tool, provider, outcome, reason, credits, receipt
    steps: list[dict[str, str]] = field(default_factory=list)


def cell_panel(
    column: str,
    outcome: str,
    provenance: Mapping[str, Any] | None,
    prices: Mapping[str, Mapping[str, Any]],
) -> CellPanel:
    """What the panel says about one cell (``outcome``: its label)."""
    panel = CellPanel(column, outcome)
    if not provenance:
        panel.facts.append(("provenance", "none recorded (the row has not finished)"))
        return panel
    facts = panel.facts
    tool = provenance.get("tool")
    if tool:
        facts.append(("tool", str(tool)))
    if provenance.get("provider"):
        facts.append(("provider", str(provenance["provider"])))
    receipt = provenance.get("receipt")
    if receipt:
        paid = date_utc(provenance.get("receipt_at") or provenance.get("fetched_at"))
        facts.append(("answer", f"{receipt} (receipt {paid})" if receipt == "reused" else receipt))
    facts.append(("source", source_text(provenance) or "-"))
    facts.append(("credits", credits_text(provenance.get("credits")) or "0"))
    by_provider = provenance.get("by_provider") or {}
    money = money_text(by_provider, prices) if by_provider else None
    if money:
        facts.append(("money", money))
    if provenance.get("credits_source"):
        facts.append(("credits from", str(provenance["credits_source"])))
    if provenance.get("fetched_at") is not None:
        facts.append(("fetched at", iso_utc(provenance.get("fetched_at"))))
    if provenance.get("miss"):
        facts.append(("why empty", str(provenance["miss"])))
    if provenance.get("blank"):
        facts.append(("blank input", str(provenance["blank"])))
    if provenance.get("waterfall"):
        facts.append(("waterfall", str(provenance["waterfall"])))
    for step in provenance.get("steps") or []:
        panel.steps.append(
            {
                "tool": str(step.get("tool") or ""),
                "provider": str(step.get("provider") or ""),
                "outcome": str(step.get("outcome") or ""),
                "reason": str(step.get("reason") or ""),
                "credits": credits_text(step.get("credits")) or "0",
                "receipt": str(step.get("receipt") or ""),
            }
        )
    return panel
