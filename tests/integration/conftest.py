"""Store fixtures for the contract suites: every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from playline.config import Settings
from playline.stores.backends import Stores, open_stores
from tests.pg import pg_schema


class Clock:
    """A clock the tests move by hand (seconds since the epoch)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgresql"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh, empty store location of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store'}"
        return
    async with pg_schema() as url:
        yield url


@pytest.fixture
async def stores(store_url: str, clock: Clock) -> AsyncIterator[Stores]:
    """Both stores of a fresh location, migrated, on the test's clock."""
    opened = await open_stores(Settings(store_url=store_url), create=True, clock=clock)
    try:
        yield opened
    finally:
        await opened.close()
