"""playline's metrics reach Prometheus through the Temporal runtime's exporter.

One worker with a Prometheus endpoint runs three plays: four new leads (paid),
the same four again (receipt hits), and one row that fails. The scrape is then
read as Prometheus would: by metric name and labels, summed over the labels the
runtime adds (namespace, task queue, activity and workflow type).
"""

from __future__ import annotations

import re

import httpx
import pytest
from temporalio.runtime import Runtime, TelemetryConfig

from playline.config import Settings
from playline.provider_server.process import free_port
from playline.telemetry import HISTOGRAM_BUCKETS, prometheus_config
from playline.worker import build_worker, connect
from tests.plays import BOOM, lead, run, write_csv

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition: (name, labels, value)."""
    found = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = dict(LABEL.findall(match["labels"] or ""))
            found.append((match["name"], labels, float(match["value"])))
    return found


def total(text: str, name: str, **labels: str) -> float:
    return sum(
        value
        for sample, have, value in samples(text)
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    )


@pytest.fixture(scope="module")
def scraped() -> dict[str, str]:
    """The scrape of the worker, filled by the first test of the module."""
    return {}


async def test_worker_exports_row_receipt_and_provider_call_metrics(
    client, provider, temporal_address, task_queue, tmp_path, scraped
) -> None:
    port = free_port()
    runtime = Runtime(telemetry=TelemetryConfig(metrics=prometheus_config(f"127.0.0.1:{port}")))
    leads = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(4)])
    boom = write_csv(tmp_path / "boom.csv", [lead(9, first_name=BOOM)])
    worker_client = await connect(
        temporal_address, settings=Settings.from_env(home=tmp_path / "home"), runtime=runtime
    )
    async with build_worker(worker_client, task_queue=task_queue):
        first = await run(client, "t_tool_column", {"csv_path": str(leads)}, task_queue=task_queue)
        second = await run(client, "t_tool_column", {"csv_path": str(leads)}, task_queue=task_queue)
        failing = await run(
            client,
            "t_tool_column",
            {"csv_path": str(boom), "column_tool": "fail_on_boom", "dataset": "t_boom"},
            task_queue=task_queue,
        )
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    scraped["text"] = text
    # Checked here, not in tests of their own: xdist may run those in another process.
    check_latency_is_a_histogram_in_seconds_with_seconds_buckets(text)
    check_credits_and_governor_waits_are_exported(text)

    assert (first.stats.calls_made, second.stats.calls_cached) == (4, 4)
    assert failing.stats.rows_failed == 1
    assert total(text, "playline_provider_calls", outcome="ok", tool="email_finder") == 4
    assert total(text, "playline_rows", outcome="ok") == 4
    assert total(text, "playline_rows", outcome="cached") == 4
    assert total(text, "playline_rows", outcome="failed") == 1
    assert total(text, "playline_receipt_lookups", result="miss", provider="acme") == 4
    assert total(text, "playline_receipt_lookups", result="hit", provider="acme") == 4
    assert total(text, "playline_provider_rate_per_second", provider="acme") > 0


def check_latency_is_a_histogram_in_seconds_with_seconds_buckets(text: str) -> None:
    name = "playline_provider_latency_seconds"
    bounds = {
        labels["le"]
        for sample, labels, _ in samples(text)
        if sample == f"{name}_bucket" and labels.get("tool") == "email_finder"
    }
    assert bounds == {f"{b:g}" for b in HISTOGRAM_BUCKETS[name]} | {"+Inf"}
    assert total(text, f"{name}_count", tool="email_finder") == 4
    assert total(text, f"{name}_sum", tool="email_finder") > 0


def check_credits_and_governor_waits_are_exported(text: str) -> None:
    assert total(text, "playline_provider_credits_sum", provider="acme") == 4.0
    assert total(text, "playline_governor_wait_seconds_count", provider="acme") == 4
