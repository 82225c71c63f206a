"""Provider-call metrics reach Prometheus through the Temporal runtime's exporter."""

from __future__ import annotations

import httpx
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from playline.config import Settings
from playline.contract import PlayRunResult, RunOptions
from playline.provider_server.process import free_port
from playline.worker import build_worker, connect
from tests.conftest import new_id
from tests.plays import lead, write_csv


async def test_worker_exports_provider_call_metrics(
    client, provider, temporal_address, task_queue, tmp_path
) -> None:
    port = free_port()
    runtime = Runtime(
        telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}"))
    )
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(4)])
    worker_client = await connect(
        temporal_address, settings=Settings.from_env(home=tmp_path / "home"), runtime=runtime
    )
    async with build_worker(worker_client, task_queue=task_queue):
        result = await client.execute_workflow(
            "t_tool_column",
            args=[{"csv_path": str(csv_path)}, RunOptions()],
            id=new_id("metrics"),
            task_queue=task_queue,
            result_type=PlayRunResult,
        )
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    assert result.stats.calls_made == 4
    calls = [
        line
        for line in text.splitlines()
        if line.startswith("playline_provider_calls") and 'outcome="ok"' in line
    ]
    assert calls and float(calls[0].rsplit(" ", 1)[1]) == 4.0
    assert "playline_provider_rate" in text
    assert "playline_provider_latency" in text
