"""Telemetry instruments: names with units, values in those units, spans without secrets.

Metrics are recorded inside a real activity context (``ActivityEnvironment``) on a
real Temporal runtime whose meter writes to a ``MetricBuffer``; spans go to an
in-memory exporter of a private tracer provider.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from temporalio.runtime import MetricBuffer, MetricBufferDurationFormat, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from playline.calls.attempt import NoMetrics
from playline.errors import ProviderRateLimited
from playline.telemetry import (
    HISTOGRAM_BUCKETS,
    SPAN_NAME,
    ProviderMetrics,
    RowMetrics,
    _tool_call_span,
    prometheus_config,
)

OUR_LABELS = {"provider", "tool", "outcome", "result"}


def record_everything() -> None:
    metrics = ProviderMetrics()
    metrics.call("acme", "email_finder", "ok", 0.012)
    metrics.call("acme", "email_finder", "rate_limited", 0.003)
    metrics.rate("acme", 12.5)
    metrics.receipt("acme", "email_finder", "hit")
    metrics.receipt("acme", "email_finder", "miss")
    metrics.credits("acme", "email_finder", 1.5)
    metrics.request("acme", "email_finder", replayed=False)
    metrics.request("acme", "email_finder", replayed=True)
    metrics.saved("acme", "email_finder", 2.0)
    metrics.governor_wait("acme", 0.25)
    rows = RowMetrics()
    rows.row("ok")
    rows.row("cached")
    rows.row("failed")


async def test_metrics_carry_their_unit_in_name_and_value() -> None:
    buffer = MetricBuffer(10_000, MetricBufferDurationFormat.SECONDS)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter
    env.run(record_everything)
    # Our labels only: the runtime adds its own (namespace, task queue, activity type...).
    recorded = [
        (
            u.metric.name,
            u.metric.unit,
            {k: v for k, v in u.attributes.items() if k in OUR_LABELS},
            u.value,
        )
        for u in buffer.retrieve_updates()
    ]

    assert (
        "playline_provider_latency_seconds",
        "s",
        {"provider": "acme", "tool": "email_finder"},
        0.012,
    ) in recorded
    assert ("playline_governor_wait_seconds", "s", {"provider": "acme"}, 0.25) in recorded
    assert (
        "playline_provider_credits",
        "credits",
        {"provider": "acme", "tool": "email_finder"},
        1.5,
    ) in recorded
    assert ("playline_provider_rate_per_second", "1/s", {"provider": "acme"}, 12.5) in recorded
    calls = [r for r in recorded if r[0] == "playline_provider_calls"]
    assert sorted(r[2]["outcome"] for r in calls) == ["ok", "rate_limited"]
    lookups = [r for r in recorded if r[0] == "playline_receipt_lookups"]
    assert sorted(r[2]["result"] for r in lookups) == ["hit", "miss"]
    rows = [r for r in recorded if r[0] == "playline_rows"]
    assert sorted(r[2]["outcome"] for r in rows) == ["cached", "failed", "ok"]
    # The accounts' requests, replays and saved credits (playline.calls.accounting).
    acme = {"provider": "acme", "tool": "email_finder"}
    assert [r[2:] for r in recorded if r[0] == "playline_provider_requests"] == [(acme, 1)] * 2
    assert [r[2:] for r in recorded if r[0] == "playline_provider_replays"] == [(acme, 1)]
    assert ("playline_provider_saved_credits", "credits", acme, 2.0) in recorded
    assert {r[1] for r in rows} == {"rows"}
    # Every histogram has buckets in its own unit for the Prometheus exporter.
    histograms = {name for name, *_ in recorded if name.endswith(("_seconds", "_credits"))}
    assert histograms == set(HISTOGRAM_BUCKETS)


def test_outside_an_activity_every_instrument_is_a_no_op() -> None:
    record_everything()  # no activity, no meter: nothing to raise


def test_prometheus_config_carries_the_buckets_and_keeps_overrides() -> None:
    config = prometheus_config(
        "127.0.0.1:9464", histogram_bucket_overrides={"x": [1.0]}, durations_as_seconds=True
    )
    assert config.histogram_bucket_overrides is not None
    assert config.histogram_bucket_overrides["x"] == [1.0]
    assert config.histogram_bucket_overrides["playline_provider_latency_seconds"][0] == 0.005
    assert config.durations_as_seconds is True


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def tracer(exporter: InMemorySpanExporter):  # type: ignore[no-untyped-def]
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def test_a_tool_call_span_names_provider_tool_receipt_and_outcome(exporter) -> None:
    with _tool_call_span(tracer(exporter), "acme", "email_finder") as span:
        span.receipt("miss")
    [finished] = exporter.get_finished_spans()
    assert finished.name == SPAN_NAME
    assert dict(finished.attributes or {}) == {
        "playline.provider": "acme",
        "playline.tool": "email_finder",
        "playline.receipt": "miss",
        "playline.outcome": "ok",
    }
    assert finished.status.status_code is not StatusCode.ERROR


def test_a_failed_call_records_the_error_type_and_never_its_message(exporter) -> None:
    secret = "first_name=Ada, key=sk-live-123"
    with (
        pytest.raises(ProviderRateLimited),
        _tool_call_span(tracer(exporter), "acme", "email_finder") as span,
    ):
        span.receipt("miss")
        raise ProviderRateLimited(secret, tool_id="email_finder", retry_after_s=1.0)
    [finished] = exporter.get_finished_spans()
    assert finished.attributes is not None
    assert finished.attributes["playline.outcome"] == "ProviderRateLimited"
    assert finished.status.status_code is StatusCode.ERROR
    assert finished.events == ()
    assert secret not in finished.to_json()


def test_no_metrics_opens_a_span_that_records_nothing() -> None:
    with NoMetrics().span("acme", "email_finder") as span:
        span.receipt("hit")
