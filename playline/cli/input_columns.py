"""``--csv``'s header checked against the play's required columns on this machine,
before anything is uploaded or started.

A play declares the columns its CSV must have (``@play(required_columns=[...])``).
The workers publish that declaration with the play's name
(:mod:`playline.published_plays`), so the CLI checks the file the user gave against
what the workers that will run the play require; when no worker answers (none polls
yet, or they run a playline that does not publish columns) it uses the play as this
process imports it. A file that lacks one is refused with one line: the file as the
user named it, each missing column with the header's closest name, and the whole
header. Nothing reaches the store or Temporal, so a typo in a header costs nothing.

The decision (:func:`declaration_of`, :func:`missing_columns_refusal`) is pure;
:func:`check_input_columns` gathers what it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client

from playline.datasets.csv_io import column_hint, header_text, missing_columns, open_csv
from playline.errors import InvalidPlayInput
from playline.published_plays import QueuePlays, read_published_plays
from playline.worker import import_plays
from playline.workflows.play import PlayWorkflow, registered_plays

__all__ = [
    "Declaration",
    "check_input_columns",
    "declaration_of",
    "missing_columns_refusal",
]


@dataclass(frozen=True, slots=True)
class Declaration:
    """A play's required columns and who said so (how the refusal names its source)."""

    columns: tuple[str, ...]
    source: str


def declaration_of(
    play: str,
    task_queue: str,
    published: QueuePlays | None,
    local: type[PlayWorkflow[Any, Any]] | None,
) -> Declaration | None:
    """Which required columns a run of ``play`` is held to.

    The live workers' word first: they run the play, and a worker's module may differ
    from this process's (or this process may not import it at all); their ``[]``
    means the play declares none. Otherwise the play as imported here; ``None`` when
    neither knows the play (the workers still check whatever ``ctx.csv`` names)."""
    if published is not None and play in published.columns:
        return Declaration(
            tuple(published.columns[play]), f"the workers on task queue {task_queue!r}"
        )
    if local is not None:
        source = f"the play as imported here ({local.__module__})"
        return Declaration(local.required_columns, source)
    return None


def missing_columns_refusal(
    given: str, play: str, header: Sequence[str], declaration: Declaration
) -> str | None:
    """The one-line refusal of a file whose header lacks a required column, or
    ``None`` when it has them all. ``given`` is the path as the user typed it."""
    missing = missing_columns(header, declaration.columns)
    if not missing:
        return None
    named = []
    for column in missing:
        close = column_hint(column, header)
        named.append(f"{column!r}" + (f" (did you mean {close!r}?)" if close else ""))
    return (
        f"{given} lacks column(s) play {play!r} requires: {', '.join(named)}; "
        f"{header_text(header)}; nothing was uploaded or started (required columns "
        f"declared by {declaration.source})"
    )


def _header(given: str) -> list[str] | None:
    """The file's header, or ``None`` when it cannot be read as one: the upload then
    says why, as it always has (it checks the whole file, this only its first line)."""
    try:
        with open_csv(given, name=given) as rows:
            return rows.columns
    except InvalidPlayInput:
        return None


async def check_input_columns(
    client: Client,
    play: str,
    task_queue: str,
    given: str,
    published: QueuePlays | None = None,
    *,
    asked: bool = False,
) -> str | None:
    """The refusal of ``given`` (``--csv``) for ``play``, or ``None`` to go on.

    ``published`` is what the workers on ``task_queue`` said, when the caller asked
    already (``asked``); otherwise they are asked here."""
    if not asked:
        published = await read_published_plays(client, task_queue)
    local = None
    if published is None or play not in published.columns:
        import_plays(())
        local = registered_plays().get(play)
    declaration = declaration_of(play, task_queue, published, local)
    if declaration is None or not declaration.columns:
        return None
    header = _header(given)
    if header is None:
        return None
    return missing_columns_refusal(given, play, header, declaration)
