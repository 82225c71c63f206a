"""OpenTelemetry tracing through the SDK's own plugin: every tool call is a span in the
trace of whoever started the play, and no span carries a key or a payload.

The tracer provider is the SDK's replay-safe one with an in-memory exporter. It
is the process-global provider (``OpenTelemetryPlugin`` requires that), set once
for this module; its exporter is shut down afterwards so later tests record nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.contrib.opentelemetry import create_tracer_provider

import playline
from playline.config import Settings
from playline.telemetry import SPAN_NAME
from playline.worker import build_worker, connect
from tests.conftest import TEST_KEYS
from tests.plays import ToolColumnInput, lead, t_tool_column, write_csv


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.fail("a global tracer provider was already set by another test module")
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    exporter.shutdown()


def tool_calls(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.name == SPAN_NAME and s.context is not None and s.context.trace_id == trace_id
    ]


async def test_each_tool_call_is_a_span_in_the_starters_trace_with_receipt_and_outcome(
    exporter, temporal_address, provider, task_queue, tmp_path
) -> None:
    leads = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(4)])
    failing = write_csv(tmp_path / "failing.csv", [lead(7)])
    client = await connect(
        temporal_address, settings=Settings.from_env(home=tmp_path / "home"), tracing=True
    )
    tracer = trace.get_tracer("test")
    traces: dict[str, int] = {}
    async with build_worker(client, task_queue=task_queue):
        for name, csv_path in (("paid", leads), ("cached", leads), ("failing", failing)):
            if name == "failing":
                # Every attempt the sender makes (5) gets a 5xx: the row fails.
                provider.configure(fail_next={"5xx": 5})
            with tracer.start_as_current_span(f"user request: {name}") as root:
                await playline.execute_play(
                    client,
                    t_tool_column,
                    ToolColumnInput(csv_path=str(csv_path), dataset=f"t_{name}"),
                    task_queue=task_queue,
                )
                traces[name] = root.get_span_context().trace_id

    paid, cached, failed = (tool_calls(exporter, traces[n]) for n in ("paid", "cached", "failing"))
    assert len(paid) == 4 and len(cached) == 4 and len(failed) == 1
    for span in [*paid, *cached, *failed]:
        assert span.attributes is not None
        assert span.attributes["playline.provider"] == "acme"
        assert span.attributes["playline.tool"] == "email_finder"
    assert {(s.attributes or {}).get("playline.receipt") for s in paid} == {"miss"}
    assert {(s.attributes or {}).get("playline.outcome") for s in paid} == {"ok"}
    assert {(s.attributes or {}).get("playline.receipt") for s in cached} == {"hit"}
    assert (failed[0].attributes or {})["playline.outcome"] == "ProviderTransientError"
    assert failed[0].status.status_code is trace.StatusCode.ERROR

    # No key, no input, no result: not in attributes, events or status of any span.
    exported = "\n".join(s.to_json() for s in exporter.get_finished_spans())
    for secret in (*TEST_KEYS.values(), "Fn0", "Ln1", "co0.example", "T0007", str(leads)):
        assert secret not in exported
