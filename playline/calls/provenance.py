"""A cell's provenance: which tool and provider filled it, what it cost, or why none did.

The chunk activity records, for each computed column of each row, the tool calls
and waterfalls the column's resolver made (:class:`ColumnCalls`) and turns them into
one small JSON object (:func:`cell_provenance`) kept with the row in the sheet store,
never in workflow history:

``tool``/``provider``   the call whose answer gave the value (a waterfall's answering
                        step, else the column's last call)
``receipt``             how that answer was obtained in this run: ``paid``, ``reused``
                        (a completed receipt of an earlier run or row), ``shared`` (an
                        identical call in flight) or ``waited`` (another owner's call)
``credits``             what the column's calls charged *for this row* in this run
                        (every step and validation; reused and shared answers are 0)
``credits_source``      ``provider`` (reported), ``rule`` (catalog), ``mixed`` or None
``by_provider``         those credits by provider (a column may call several)
``fetched_at``          when the value was fetched from the provider (for a reused
                        answer: when its receipt was completed)
``miss``                why there is no value (a waterfall lists each step's outcome);
                        ``skipped_input`` when a call the column needed left a required
                        input blank (nothing was sent, it cost nothing), or when every
                        step of its waterfall did
``blank``               for a ``skipped_input`` cell: the tool and the blank field(s)
                        (names only, never the row's values)
``steps``               a waterfall's steps, each with its outcome, reason, credits
                        and receipt

:class:`SpendTally` sums provenance into what a run cost by provider and by column,
and each waterfall's hit rate per step: the run's current details, ``playline runs
get`` and the summary all print it (:func:`spend_lines`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from playline.calls.billing import is_present
from playline.calls.runner import ToolResult
from playline.calls.waterfall import WaterfallResult
from playline.errors import BlankInput
from playline.spend import NO_STEP
from playline.stores.sheet import SheetStore

__all__ = ["SKIPPED_INPUT", "ColumnCalls", "blank_call", "cell_provenance", "tally_cell"]

#: A cell's ``miss`` when a required tool input was blank: nothing sent, nothing paid.
SKIPPED_INPUT = "skipped_input"


@dataclass
class ColumnCalls:
    """The tool calls and waterfalls one column's resolver made for one row."""

    calls: list[ToolResult] = field(default_factory=list)
    waterfalls: list[WaterfallResult] = field(default_factory=list)
    #: calls refused because a required input was blank (``BlankInput``), as
    #: ``"tool: field, field"``: never sent, free
    blank: list[str] = field(default_factory=list)
    #: every tool the resolver asked for (a waterfall: each it may call), answered or
    #: not: an estimate counts the column's declared tools outside it as fallbacks
    asked: set[str] = field(default_factory=set)


def blank_call(err: BlankInput) -> str:
    """How a refused call is recorded: its tool and blank fields, never the values."""
    return f"{err.tool_id}: {', '.join(err.fields)}"


def cell_provenance(
    made: ColumnCalls,
    value: Any,
    *,
    ran: bool = True,
    failed: str | None = None,
    skipped_input: bool = False,
) -> dict[str, Any]:
    """The provenance of one cell (see the module docstring); ``skipped_input``: the
    column's resolver let a ``BlankInput`` through (the cell is empty, and free)."""
    credits = sum(call.credits for call in made.calls)
    by_provider: dict[str, float] = {}
    for call in made.calls:
        if call.credits:
            by_provider[call.tool.provider] = (
                by_provider.get(call.tool.provider, 0.0) + call.credits
            )
    sources = {call.credits_source for call in made.calls if call.receipt == "paid"}
    sources.discard(None)
    waterfall = made.waterfalls[-1] if made.waterfalls else None
    answering = _answering(made, waterfall)
    # Kept with every row of every run: keys without a value are left out (readers
    # use .get), and the receipt's date is the answer's fetched_at.
    cell: dict[str, Any] = {"tool": None, "credits": credits, "miss": None}
    if answering is not None:
        cell["tool"] = answering.tool.id
        cell["provider"] = answering.tool.provider
        cell["receipt"] = answering.receipt
        cell["fetched_at"] = answering.fetched_at
    source = _source(sources)
    if source is not None:
        cell["credits_source"] = source
    if by_provider:
        cell["by_provider"] = by_provider
    if waterfall is not None:
        cell["waterfall"] = waterfall.name
        cell["steps"] = [step.provenance() for step in waterfall.steps]
    if failed is not None:
        cell["miss"] = f"error: {failed}"
    elif not ran:
        cell["miss"] = "skipped (run_if)"
    elif skipped_input:
        cell["miss"] = SKIPPED_INPUT
    elif not is_present(value):
        cell["miss"] = _miss(made, waterfall)
    if cell["miss"] == SKIPPED_INPUT and made.blank:
        cell["blank"] = "; ".join(dict.fromkeys(made.blank))
    return cell


def _answering(made: ColumnCalls, waterfall: WaterfallResult | None) -> ToolResult | None:
    if waterfall is not None:
        return waterfall.result
    return made.calls[-1] if made.calls else None


def _source(sources: set[str | None]) -> str | None:
    if not sources:
        return None
    return next(iter(sources)) if len(sources) == 1 else "mixed"


def _miss(made: ColumnCalls, waterfall: WaterfallResult | None) -> str:
    if waterfall is not None:
        if waterfall.steps and all(s.outcome == SKIPPED_INPUT for s in waterfall.steps):
            return SKIPPED_INPUT
        return waterfall.miss or "no value"
    if made.calls:
        return f"{made.calls[-1].tool.id}: no_match"
    if made.blank:  # the resolver caught BlankInput and called nothing else
        return SKIPPED_INPUT
    return "no value"


@dataclass
class SpendTally:
    """What a run's cells cost, by provider and by column, and each waterfall's steps.

    Tallies are added up as their ``as_dict()`` (``playline.contract.merge_spend``),
    as chunk results are in the workflow.

    ``steps[column][tool or "none"]`` counts the rows a waterfall column's value came
    from that step (``"none"``: no step gave one); ``tried[column][tool]`` what each
    step measured: ``[calls made, hits, credits]``, from which the summary gives each
    step's hit rate and credits per hit (the figures to order a waterfall by).
    """

    rows: int = 0
    credits: float = 0.0
    by_provider: dict[str, float] = field(default_factory=dict)
    by_column: dict[str, float] = field(default_factory=dict)
    steps: dict[str, dict[str, int]] = field(default_factory=dict)
    tried: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: ``paid``/``reused``/``shared``/``waited`` answers over every cell
    receipts: dict[str, int] = field(default_factory=dict)
    #: cells left empty because a required tool input was blank (``skipped_input``);
    #: the chunk reports it as ``ChunkStats.cells_skipped_input``, not in ``as_dict``
    skipped_input: int = 0

    def add_row(self, provenance: Mapping[str, Any] | None) -> None:
        """Count one row's provenance (``{column: cell provenance}``)."""
        self.rows += 1
        for column, cell in (provenance or {}).items():
            tally_cell(self, column, cell)

    def as_dict(self) -> dict[str, Any]:
        """Every field but ``skipped_input``, deep-copied (``asdict``)."""
        tally = asdict(self)
        del tally["skipped_input"]
        return tally


def tally_cell(tally: SpendTally, column: str, cell: Mapping[str, Any]) -> None:
    """Add one cell's provenance to ``tally``."""
    credits = float(cell.get("credits") or 0.0)
    tally.credits += credits
    tally.by_column[column] = tally.by_column.get(column, 0.0) + credits
    for provider, cost in (cell.get("by_provider") or {}).items():
        tally.by_provider[provider] = tally.by_provider.get(provider, 0.0) + float(cost)
    steps = cell.get("steps")
    if isinstance(steps, list):
        winner = cell.get("tool") if cell.get("miss") is None else None
        counts = tally.steps.setdefault(column, {})
        name = str(winner) if winner else NO_STEP
        counts[name] = counts.get(name, 0) + 1
        measured = tally.tried.setdefault(column, {})
        for step in steps:
            if str(step.get("outcome", "")).startswith("skipped"):
                continue
            figures = measured.setdefault(str(step.get("tool")), [0, 0, 0.0])
            figures[0] += 1
            figures[1] += step.get("outcome") == "hit"
            figures[2] += float(step.get("credits") or 0.0)
    receipt = cell.get("receipt")
    if isinstance(receipt, str):
        tally.receipts[receipt] = tally.receipts.get(receipt, 0) + 1
    if cell.get("miss") == SKIPPED_INPUT:
        tally.skipped_input += 1


def tally(rows: Iterable[Mapping[str, Any] | None]) -> SpendTally:
    """The tally of many rows' provenance."""
    total = SpendTally()
    for provenance in rows:
        total.add_row(provenance)
    return total


#: Rows read per page when a run's provenance is summed.
SPEND_PAGE_ROWS = 2000


async def run_spend(sheet: SheetStore, run_ref: str) -> SpendTally:
    """What a dataset run's cells cost, summed from the sheet store page by page.

    This is the exact figure: every row's provenance as written, whatever attempt
    computed it (the current details' tally is summed from chunk results, which a
    retried chunk's earlier attempts do not reach).
    """
    info = await sheet.run_info(run_ref)
    total = SpendTally()
    if info is None:
        return total
    for start in range(0, info.admitted, SPEND_PAGE_ROWS):
        page = await sheet.read_provenance(run_ref, start, start + SPEND_PAGE_ROWS)
        for _, provenance in page:
            total.add_row(provenance)
    return total
