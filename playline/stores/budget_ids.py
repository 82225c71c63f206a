"""Budget ids as typed values: what a reservation draws on, built and matched as data.

The ledger keeps every budget under a text key (``run:<run>``,
``run:<run>/provider:<p>``, ``run:<run>/spend``, ``row:<payer>``, ``named:NAME``,
``named:NAME@2026-12-04``). Code builds and matches the classes below instead;
:func:`budget_key` is the one place that renders a key and :func:`parse_budget_key`
the one place that reads one back. The text is the stored one, unchanged, so SQLite
files, PostgreSQL schemas and recorded histories written before keep working.

A key no class here makes (a caller's own id: the store accepts any non-empty id)
reads back as :class:`OtherBudgetId`, kept as given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from playline.errors import InvalidBudget

__all__ = [
    "BudgetId",
    "NamedBudgetId",
    "OtherBudgetId",
    "ProviderShareId",
    "RowBudgetId",
    "RunBudgetId",
    "SpendBudgetId",
    "as_budget_id",
    "budget_key",
    "check_name",
    "parse_budget_key",
]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: A named budget's period as its key says it: a UTC day or month.
_PERIOD = re.compile(r"\d{4}-\d{2}(-\d{2})?")


class _Keyed:
    """What every budget id has: its stored key (:func:`budget_key`)."""

    __slots__ = ()

    @property
    def key(self) -> str:
        return budget_key(self)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class RunBudgetId(_Keyed):
    """A run's cap over every provider, in credits (``RunOptions(max_credits=...)``)."""

    run: str


@dataclass(frozen=True, slots=True)
class ProviderShareId(_Keyed):
    """One provider's cap within a run, in credits (``max_credits_by_provider``)."""

    run: str
    provider: str


@dataclass(frozen=True, slots=True)
class SpendBudgetId(_Keyed):
    """A run's cap in money (``RunOptions(max_spend=...)``): a call to provider P draws
    its credits times P's credit price on it (the reservation's scale)."""

    run: str


@dataclass(frozen=True, slots=True)
class RowBudgetId(_Keyed):
    """A row's own budget, limited to its worst case; also the key of the row's
    reservation against the run's budgets."""

    payer: str


@dataclass(frozen=True, slots=True)
class NamedBudgetId(_Keyed):
    """A budget runs share by name (``RunOptions(budget="NAME")``); ``period`` names one
    of its periods (``2026-12-04`` or ``2026-12``), ``None`` the current one. A malformed
    name or period is ``InvalidBudget``."""

    name: str
    period: str | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.period is not None and not _PERIOD.fullmatch(self.period):
            raise InvalidBudget(f"budget period {self.period!r} is not a day or a month")


@dataclass(frozen=True, slots=True)
class OtherBudgetId(_Keyed):
    """A budget id none of the classes above makes (a caller's own), kept as given."""

    id: str


BudgetId = (
    RunBudgetId | ProviderShareId | SpendBudgetId | RowBudgetId | NamedBudgetId | OtherBudgetId
)

_PROVIDER = "/provider:"
_SPEND = "/spend"


def check_name(name: str) -> str:
    """``name`` if it may name a budget (``[A-Za-z0-9_.-]{1,64}``), else ``InvalidBudget``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidBudget(
            f"budget name {str(name)[:80]!r} is not allowed: use 1 to 64 letters, digits, "
            "'_', '.' or '-'"
        )
    return name


def budget_key(budget: BudgetId) -> str:
    """The stored key of ``budget``: the one place a budget id becomes text."""
    match budget:
        case RunBudgetId(run):
            return f"run:{run}"
        case ProviderShareId(run, provider):
            return f"run:{run}{_PROVIDER}{provider}"
        case SpendBudgetId(run):
            return f"run:{run}{_SPEND}"
        case RowBudgetId(payer):
            return f"row:{payer}"
        case NamedBudgetId(name, None):
            return f"named:{name}"
        case NamedBudgetId(name, period):
            return f"named:{name}@{period}"
        case OtherBudgetId(given):
            return given
    raise InvalidBudget(f"not a budget id: {budget!r}")


def parse_budget_key(key: str) -> BudgetId:
    """The budget a stored key names: the one place a key is read back. A key that is
    empty or padded with spaces, or a ``named:`` key whose name or period is malformed,
    is ``InvalidBudget``."""
    if not isinstance(key, str) or not key or key != key.strip():
        raise InvalidBudget(f"budget id {str(key)[:80]!r} is empty or padded with spaces")
    kind, sep, rest = key.partition(":")
    if not sep:
        return OtherBudgetId(key)
    if kind == "named":
        name, at, period = rest.partition("@")
        return NamedBudgetId(name, period if at else None)
    if kind == "row":
        return RowBudgetId(rest)
    if kind == "run":
        if _PROVIDER in rest:
            run, _, provider = rest.rpartition(_PROVIDER)
            return ProviderShareId(run, provider)
        if rest.endswith(_SPEND):
            return SpendBudgetId(rest[: -len(_SPEND)])
        return RunBudgetId(rest)
    return OtherBudgetId(key)


def as_budget_id(budget: BudgetId | str) -> BudgetId:
    """``budget`` as a typed id: a stored key is parsed, a typed id checked (its key
    must read back as itself)."""
    if isinstance(budget, str):
        return parse_budget_key(budget)
    if parse_budget_key(budget_key(budget)) != budget:
        raise InvalidBudget(f"budget id {budget!r} does not read back as itself")
    return budget
