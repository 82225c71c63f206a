"""A play's required columns, declared on ``@play``: which declaration a ``--csv`` is
held to, the one-line refusal, what ``ctx.csv`` checks untold, and the registry's
payload with and without the new field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from playline import PlayContext, play
from playline.cli import input_columns
from playline.cli.input_columns import (
    Declaration,
    check_input_columns,
    declaration_of,
    missing_columns_refusal,
)
from playline.contract import DatasetRef, RunOptions
from playline.datasets.csv_io import header_text
from playline.errors import InvalidPlayInput
from playline.published_plays import QueuePlays, queue_plays
from playline.workflows import context
from playline.workflows.registry import PublishedPlays, WorkerPlays


class CsvInput(BaseModel):
    csv_path: str


class NoCsvInput(BaseModel):
    domain: str


@play(name="t_cols_declared", required_columns=["id", "domain"])
async def t_cols_declared(ctx: PlayContext, input: CsvInput) -> None:
    """A play declaring two columns (never run: its class is what is read)."""


@play(name="t_cols_none")
async def t_cols_none(ctx: PlayContext, input: CsvInput) -> None:
    """A play declaring none."""


def published(columns: dict[str, list[str]], plays: list[str] | None = None) -> QueuePlays:
    found = QueuePlays("q", plays={p: ["w1"] for p in plays or list(columns)}, live=["w1"])
    found.columns = columns
    return found


# -- the declaration -------------------------------------------------------------


def test_the_decorator_keeps_the_declaration_on_the_play() -> None:
    assert t_cols_declared.required_columns == ("id", "domain")
    assert t_cols_none.required_columns == ()


def test_a_declaration_that_cannot_mean_what_it_says_is_refused_at_import() -> None:
    with pytest.raises(InvalidPlayInput, match=r"a list of names, not one string"):
        play(name="t_cols_string", required_columns="email")(t_cols_declared.play_fn)
    with pytest.raises(InvalidPlayInput, match=r"non-blank names"):
        play(name="t_cols_blank", required_columns=["id", " "])(t_cols_declared.play_fn)

    async def no_csv(ctx: PlayContext, input: NoCsvInput) -> None: ...

    with pytest.raises(InvalidPlayInput, match=r"NoCsvInput has no csv_path field"):
        play(name="t_cols_no_csv", required_columns=["id"])(no_csv)


def test_the_workers_declaration_wins_over_the_one_imported_here() -> None:
    said = declaration_of("p", "q", published({"p": ["email"]}), t_cols_declared)
    assert said == Declaration(("email",), "the workers on task queue 'q'")
    # The workers' play declares none: nothing is required, whatever this process has.
    none = declaration_of("p", "q", published({"p": []}), t_cols_declared)
    assert none is not None and none.columns == ()


def test_without_the_workers_word_the_play_imported_here_decides() -> None:
    local = declaration_of("t_cols_declared", "q", None, t_cols_declared)
    assert local is not None and local.columns == ("id", "domain")
    assert "as imported here (tests.unit.test_required_columns)" in local.source
    # Workers answered but did not publish columns (an older playline): the same.
    older = published({}, plays=["t_cols_declared"])
    assert declaration_of("t_cols_declared", "q", older, t_cols_declared) == local
    # Nobody knows the play: nothing to check here (the workers check what ctx.csv names).
    assert declaration_of("unknown", "q", None, None) is None


# -- the refusal -----------------------------------------------------------------


def test_a_missing_column_is_one_line_with_the_file_hints_and_the_whole_header() -> None:
    header = ["id", "first_name", "last_name", "company_domain"]
    declaration = Declaration(("id", "domain", "title"), "the workers on task queue 'q'")
    line = missing_columns_refusal("data/people.csv", "my_play", header, declaration)
    assert line is not None and "\n" not in line
    assert line.startswith("data/people.csv lacks column(s) play 'my_play' requires: ")
    # One entry per missing column, in the declared order, a hint where one is close.
    assert "requires: 'domain' (did you mean 'company_domain'?), 'title';" in line
    # The whole header (all four), not three of them.
    assert "the header has 4 columns: 'id', 'first_name', 'last_name', 'company_domain'" in line
    assert line.endswith(
        "nothing was uploaded or started (required columns declared by the workers on "
        "task queue 'q')"
    )
    assert (
        missing_columns_refusal("p.csv", "my_play", [*header, "domain", "title"], declaration)
        is None
    )


def test_the_whole_header_still_never_quotes_what_is_not_a_column_name() -> None:
    text = header_text(["id", "ACME_API_KEY=sk_live_SECRET", "x" * 40])
    assert "SECRET" not in text and "x" * 40 not in text
    assert text == (
        "the header has 3 columns: 'id', <a 27-character name, not shown>, "
        "<a 40-character name, not shown>"
    )


async def test_the_file_header_is_read_here_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    people = tmp_path / "people.csv"
    people.write_text("\ufeffid , company_domain\n1,a.example\n")
    monkeypatch.setattr(input_columns, "import_plays", lambda modules: None)

    refused = await check_input_columns(
        None,  # type: ignore[arg-type]  # asked already: no client call
        "t_cols_declared",
        "q",
        str(people),
        None,
        asked=True,
    )
    # The BOM and the blanks around names are read as the upload reads them.
    assert refused is not None
    assert "'domain' (did you mean 'company_domain'?)" in refused
    assert "the header has 2 columns: 'id', 'company_domain'" in refused

    people.write_text("id,domain\n1,a.example\n")
    assert (
        await check_input_columns(None, "t_cols_declared", "q", str(people), None, asked=True)
        is None
    )  # type: ignore[arg-type]
    # A file whose header cannot be read is left to the upload, which says why.
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert (
        await check_input_columns(None, "t_cols_declared", "q", str(empty), None, asked=True)
        is None
    )  # type: ignore[arg-type]


# -- ctx.csv untold --------------------------------------------------------------


async def loaded_columns(
    monkeypatch: pytest.MonkeyPatch, input_csv: str | None, declared: list[str], **csv: Any
) -> list[str]:
    """The ``required_columns`` the load activity is asked to check by ``ctx.csv``."""
    sent: list[Any] = []

    async def execute_activity_method(activity: Any, arg: Any, **kwargs: Any) -> DatasetRef:
        sent.append(arg)
        return DatasetRef(id="people.csv@0", count=1, columns=["id"])

    monkeypatch.setattr(context.workflow, "execute_activity_method", execute_activity_method)
    monkeypatch.setattr(context.workflow, "logger", __import__("logging").getLogger("t"))
    ctx = PlayContext("p", RunOptions())
    monkeypatch.setattr(ctx, "publish", lambda: None)
    ctx.declare_input_csv(input_csv, declared)
    await ctx.csv("people", csv.pop("path", "store:people.csv@0"), **csv)
    [load] = sent
    return list(load.required_columns)


async def test_ctx_csv_checks_the_input_file_for_the_declared_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = "store:people.csv@0"
    assert await loaded_columns(monkeypatch, path, ["id", "domain"]) == ["id", "domain"]
    # An explicit list wins, the empty one too.
    assert await loaded_columns(
        monkeypatch, path, ["id", "domain"], required_columns=["email"]
    ) == ["email"]
    assert await loaded_columns(monkeypatch, path, ["id", "domain"], required_columns=[]) == []
    # Another file the play loads is not held to the input's columns.
    assert await loaded_columns(monkeypatch, path, ["id"], path="/data/blocklist.csv") == []
    # Nothing declared: nothing checked, as before.
    assert await loaded_columns(monkeypatch, path, []) == []


# -- the registry's payload ------------------------------------------------------


def test_a_worker_from_before_the_field_decodes_and_says_nothing_about_columns() -> None:
    old = {"identity": "old@host", "plays": ["p"], "at": 1.0, "version": "0.1.0"}
    worker = WorkerPlays.model_validate(old)
    assert worker.columns is None
    registry = PublishedPlays.model_validate({"workers": {"old@host": old}})
    found = queue_plays("q", ["old@host"], registry)
    assert found is not None and found.plays == {"p": ["old@host"]}
    assert found.columns == {}  # unknown, not "none required"


def test_the_live_worker_that_started_last_says_which_columns() -> None:
    def worker(identity: str, at: float, columns: dict[str, list[str]] | None) -> WorkerPlays:
        return WorkerPlays(identity=identity, plays=["p", "q"], at=at, columns=columns)

    registry = PublishedPlays(
        workers={
            "new": worker("new", 3.0, {"p": ["id", "email"]}),
            "older": worker("older", 2.0, {"p": ["id"], "q": ["x"]}),
            "gone": worker("gone", 9.0, {"p": ["stale"]}),
            "ancient": worker("ancient", 4.0, None),
        }
    )
    found = queue_plays("q", ["new", "older", "ancient"], registry)
    assert found is not None
    assert found.columns == {"p": ["id", "email"], "q": []}
    assert found.gone == ["gone"]
