"""What the sheet view asks of Temporal, as a protocol: the runs, one run, its controls.

The view sits below the command line (it imports no ``playline.cli``); the command
``playline ui`` hands it a desk built on the very functions ``playline runs`` uses
(:mod:`playline.cli.ui`), so a pause from the page is the same update with the same
refusals as one from a terminal. Tests of the pages may hand it their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

__all__ = ["ACTIONS", "Action", "ExportChoice", "RunDesk", "RunEstimate", "RunSummary"]

Action = Literal["pause", "resume", "cancel", "budget"]
ACTIONS: tuple[Action, ...] = ("pause", "resume", "cancel", "budget")


@dataclass
class RunSummary:
    """One play run as the runs page and a sheet's header show it (no row data)."""

    workflow_id: str
    run_id: str | None
    play: str
    status: str
    rows_done: int | None = None
    rows_total: int | None = None
    rows_failed: int | None = None
    credits: float | None = None
    money: str | None = None
    started: str | None = None
    ended: str | None = None
    ui_url: str | None = None
    #: what the run waits for now (budget, a provider's quota, jobs, a pause), a line each
    waits: list[str] = field(default_factory=list)
    #: the run references of its dataset runs, in order (the sheet shows one)
    run_refs: list[str] = field(default_factory=list)
    #: ``{provider: {"credit_price", "currency"}}`` the workers reported (money of a cell)
    prices: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per provider, what the run's account and the governor say now: ``requests``,
    #: ``charged``, ``hits``, ``shared``, ``credits``, ``saved`` (the accounts' terms)
    #: and, while it runs, ``rate_rps`` (in force), ``share_rps`` (this run's calls per
    #: second), ``paused_s`` (a Retry-After holding its calls)
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: whether the run holds its rows until its budget is raised (its pending rows
    #: are held, not merely not started)
    held_for_budget: bool = False
    #: whether Temporal still runs it (controls apply)
    running: bool = False


@dataclass(frozen=True)
class ProviderEstimate:
    """What an estimate said of one provider: credits in the worst case and expected."""

    worst: float
    expected: float


@dataclass
class RunEstimate:
    """The estimate a run is shown beside: the latest ``playline estimate`` of the same
    play on the same input, made before the run started (``playline run``'s pre-flight
    estimate is one)."""

    workflow_id: str
    #: when it was made (UTC text)
    made: str | None
    rows: int
    by_provider: dict[str, ProviderEstimate] = field(default_factory=dict)
    #: ``{provider: {"credit_price", "currency"}}`` as the estimate priced credits
    prices: dict[str, Any] = field(default_factory=dict)
    ui_url: str | None = None


@dataclass(frozen=True)
class ExportChoice:
    """What ``runs export`` writes: CSV or JSON lines, with provenance, changes only."""

    fmt: Literal["csv", "jsonl"] = "csv"
    provenance: bool = False
    changes: bool = False


class RunDesk(Protocol):
    """Temporal's side of the view."""

    async def list_runs(self, limit: int) -> list[RunSummary]:
        """Plays, newest first, with playline's search attributes."""
        ...

    async def run(self, workflow_id: str) -> RunSummary:
        """One run, with its dataset runs and what it waits for; raises
        ``PlaylineError`` (one line) when there is no such run."""
        ...

    async def act(self, workflow_id: str, action: Action, amount: float | None) -> str:
        """Send the control ``playline runs <action>`` sends; the line it prints, or
        ``PlaylineError`` with the line it refuses with."""
        ...

    async def budget(self, run: RunSummary) -> float | None:
        """The run's credit cap as the budget ledger holds it now (``None``: no cap)."""
        ...

    async def export(self, workflow_id: str, path: Path, choice: ExportChoice) -> int:
        """Write what ``playline runs export`` writes to ``path``; the rows written."""
        ...

    async def estimate(self, run: RunSummary) -> RunEstimate | None:
        """The estimate to show beside the run's spend (:class:`RunEstimate`), or
        ``None`` when none was made (or it is no longer kept)."""
        ...
