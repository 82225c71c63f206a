"""A paid answer whose receipt write fails is kept, never dropped and never paid again (F2).

Real SQLite receipt store (a subclass whose completions raise what SQLite raises when
the file stays locked, for as long as the test says), real provider server over
HTTP, the worker's real journal and ``Services.settle_journal``. The call goes
through the tool runner as a chunk attempt's would. Both idempotency contracts that
matter are run: ``key`` (the provider de-duplicates ``Idempotency-Key``) and ``none``
against a provider that ignores the key, where a second send would be a second charge.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from playline import demo
from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog
from playline.calls.live import LiveDispatcher, PacedSender
from playline.calls.runner import ToolRunner
from playline.config import Settings
from playline.db.ready import ReadyOnFirstUse
from playline.errors import PersistenceCircuitOpen
from playline.pacing.governor import Governor
from playline.provider_server import ServerConfig, ThreadedProviderServer, start_in_thread
from playline.services import Services
from playline.stores.receipts_ledger import ReceiptLedger
from playline.stores.sheet_ledger import SheetLedger
from tests.conftest import BULK

PERSON = {"first_name": "Ada", "last_name": "Lovelace", "domain": "settle.example"}
OTHER = {"first_name": "Alan", "last_name": "Turing", "domain": "settle.example"}


class FlakyReceipts(ReceiptLedger):
    """A real SQLite receipt store whose completions fail while the test says so.

    ``fail_next`` completions raise, then they go through; ``broken`` makes every one
    raise until it is cleared. The error is the one SQLite gives when its busy timeout
    runs out on a file another process keeps locked.
    """

    def __init__(self, ready: ReadyOnFirstUse, *, clock: Callable[[], float] | None = None) -> None:
        super().__init__(ready, clock=clock)
        self.fail_next = 0
        self.broken = False
        self.completions_tried = 0

    def _maybe_fail(self) -> None:
        self.completions_tried += 1
        if self.broken:
            raise sqlite3.OperationalError("database is locked")
        if self.fail_next > 0:
            self.fail_next -= 1
            raise sqlite3.OperationalError("database is locked")

    async def complete(
        self,
        key: str,
        *,
        lease_id: str,
        result: Any,
        credits: float,
        **recorded: Any,
    ) -> bool:
        self._maybe_fail()
        return await super().complete(
            key, lease_id=lease_id, result=result, credits=credits, **recorded
        )

    async def complete_batch(
        self,
        agg_key: str,
        *,
        lease_id: str,
        results: dict[str, Any],
        member_credits: Mapping[str, float],
        **recorded: Any,
    ) -> bool:
        self._maybe_fail()
        return await super().complete_batch(
            agg_key, lease_id=lease_id, results=results, member_credits=member_credits, **recorded
        )


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedProviderServer]:
    handle = start_in_thread(ServerConfig(latency_ms=(0.0, 1.0)))
    yield handle
    handle.stop()


@pytest.fixture(params=["key", "none"])
def idempotency(request: pytest.FixtureRequest, server: ThreadedProviderServer) -> str:
    """The tools' contract; with ``none`` the provider ignores Idempotency-Key too."""
    server.configure(
        **ServerConfig(
            latency_ms=(0.0, 1.0), idempotency="key" if request.param == "key" else "ignore"
        ).model_dump()
    )
    server.reset()
    return str(request.param)


@pytest.fixture
async def services(
    server: ThreadedProviderServer, idempotency: str, tmp_path: Path
) -> AsyncIterator[Services]:
    """A worker's services on a flaky receipt store, calling the provider server."""
    async with open_services(server, idempotency, tmp_path, demo.CATALOG.read_text()) as opened:
        yield opened


@asynccontextmanager
async def open_services(
    server: ThreadedProviderServer, idempotency: str, tmp_path: Path, text: str
) -> AsyncIterator[Services]:
    if idempotency == "none":
        text = text.replace('idempotency = "key"', 'idempotency = "none"')
        assert 'idempotency = "key"' not in text
    catalog_path = tmp_path / "catalog.toml"
    catalog_path.write_text(text)
    catalog = Catalog.from_toml(catalog_path)
    settings = Settings.from_env(
        {
            "PLAYLINE_PROVIDER_URL": server.base_url,
            "ACME_API_KEY": "test-acme-key",
            "FIRMO_API_KEY": "test-firmo-key",
        },
        home=tmp_path / "home",
        catalog_path=str(catalog_path),
    )
    receipts = FlakyReceipts.in_file(settings.home / "receipts.db")
    sheet = SheetLedger.in_file(settings.home / "sheet.db")
    async with httpx.AsyncClient() as http:
        yield Services(
            settings=settings,
            catalog=catalog,
            governor=Governor(catalog.pacing_policies()),
            receipts=receipts,
            sheet=sheet,
            http=http,
        )
    await receipts.close()
    await sheet.close()


def runner(services: Services, *, settle_patience_s: float = 300.0) -> ToolRunner:
    """A tool runner as one chunk attempt has (what ``make_runner`` builds in an activity)."""
    attempt = Attempt(
        receipts=services.receipts,
        owner=f"test/settle#{uuid.uuid4().hex[:6]}",
        lease_id=uuid.uuid4().hex,
        lease_ttl_s=30.0,
        settle_patience_s=settle_patience_s,
        journal=services.journal,
    )
    sender = PacedSender(attempt, services.governor, services.provider)
    return ToolRunner(services.catalog, attempt, LiveDispatcher(attempt, sender))


def receipts_in(services: Services) -> list[tuple[str, float]]:
    """(status, credits) of every receipt, read from the file as another process would."""
    db = sqlite3.connect(services.settings.home / "receipts.db")
    try:
        return db.execute("SELECT status, credits FROM playline_receipts ORDER BY key").fetchall()
    finally:
        db.close()


def flaky(services: Services) -> FlakyReceipts:
    assert isinstance(services.receipts, FlakyReceipts)
    return services.receipts


async def test_a_paid_answer_whose_write_fails_is_retried_and_recorded_once(
    services: Services, server: ThreadedProviderServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="playline.calls")
    store = flaky(services)
    store.fail_next = 3
    first = runner(services)
    result = await first.call("email_finder", PERSON)
    assert result.data["email"] and not result.cached
    assert store.completions_tried == 4  # three failures, then the write that landed
    assert sum("failed, retrying" in r.getMessage() for r in caplog.records) == 3
    assert receipts_in(services) == [("completed", 1.0)]  # once, with its credits once
    assert not services.journal.pending()
    ledger = server.ledger()
    assert ledger["received"] == 1 and ledger["charged"] == 1  # the retries re-sent nothing
    # The failure stopped new dispatch in that attempt: the next call goes nowhere.
    with pytest.raises(PersistenceCircuitOpen) as held:
        await first.call("email_finder", OTHER)
    assert held.value.prevented_calls == 1
    assert server.ledger()["received"] == 1
    # A later attempt finds the answer as a receipt hit: free.
    again = await runner(services).call("email_finder", PERSON)
    assert again.cached and again.data == result.data
    assert server.ledger()["received"] == 1
    assert first.stats.made == 1 and first.stats.credits == 1.0


async def test_past_the_patience_a_paid_answer_is_journalled_then_settled(
    services: Services, server: ThreadedProviderServer
) -> None:
    store = flaky(services)
    store.broken = True
    first = runner(services, settle_patience_s=0.5)
    with pytest.raises(PersistenceCircuitOpen) as gave_up:
        await first.call("email_finder", PERSON)
    assert "database is locked" in str(gave_up.value)
    assert store.completions_tried > 1  # retried within the patience first
    # Not dropped: on the worker's disk, and the receipt still says "running".
    assert services.journal.pending()
    (kept,) = (services.settings.journal_dir / "unsettled.jsonl").read_text().splitlines()
    assert '"credits":1.0' in kept
    assert receipts_in(services) == [("running", 0.0)]
    # A settle while the store still fails keeps the answer in the journal.
    with pytest.raises(sqlite3.OperationalError):
        await services.settle_journal()
    assert services.journal.pending()
    lines = [
        line
        for path in services.settings.journal_dir.glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert lines == [kept]
    # The store is back: the next chunk's settle writes the answer, the journal empties.
    store.broken = False
    await services.settle_journal()
    assert not services.journal.pending()
    assert receipts_in(services) == [("completed", 1.0)]
    await services.settle_journal()  # nothing left: settling again writes nothing
    assert receipts_in(services) == [("completed", 1.0)]
    # The retried chunk finds the journalled answer as a receipt hit: paid once in all.
    again = await runner(services).call("email_finder", PERSON)
    assert again.cached and again.data["email"]
    ledger = server.ledger()
    assert ledger["received"] == 1 and ledger["charged"] == 1
    assert ledger["double_charged"] == 0


async def test_a_bulk_answer_past_the_patience_is_journalled_then_settled_per_member(
    server: ThreadedProviderServer, idempotency: str, tmp_path: Path
) -> None:
    """One bulk request answers several rows; its answer is journalled as a whole and
    settled into every member's receipt."""
    text = demo.CATALOG.read_text().replace(
        'getters = { name = "name", industry = "industry", employees = "employees" }\n',
        'getters = { name = "name", industry = "industry", employees = "employees" }\n' + BULK,
    )
    assert BULK in text
    domains = [f"bulk{i}.example" for i in range(3)]
    async with open_services(server, idempotency, tmp_path, text) as services:
        store = flaky(services)
        store.broken = True
        first = runner(services, settle_patience_s=0.5)
        outcomes = await asyncio.gather(
            *(first.call("company_lookup", {"domain": d}) for d in domains),
            return_exceptions=True,
        )
        await first.dispatcher.aclose()
        assert all(isinstance(o, PersistenceCircuitOpen) for o in outcomes), outcomes
        ledger = server.ledger()
        assert ledger["received"] == 1 and ledger["items_charged"] == 3  # one bulk request
        assert services.journal.pending()
        store.broken = False
        await services.settle_journal()
        assert not services.journal.pending()
        # The request's aggregate and its three members, each credited once.
        settled = receipts_in(services)
        assert Counter(status for status, _ in settled) == {"completed": 4}
        assert sorted(credits for _, credits in settled) == [0.5, 0.5, 0.5, 1.5]
        later = runner(services)
        again = await asyncio.gather(
            *(later.call("company_lookup", {"domain": d}) for d in domains)
        )
        await later.dispatcher.aclose()
        assert all(r.cached and r.data["name"] for r in again)
        ledger = server.ledger()
        assert ledger["received"] == 1 and ledger["double_charged_items"] == 0
