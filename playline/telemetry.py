"""Metrics through the Temporal SDK's own meter; spans through OpenTelemetry.

This is the Temporal side of :class:`playline.calls.attempt.CallMetrics`: the call
path records through that protocol and never imports Temporal or OpenTelemetry.

**Metrics.** Inside an activity the meter is the worker runtime's, so ``playline
worker --metrics-port`` (or any ``Runtime`` you give the client) exports them
beside Temporal's own, with its labels (namespace, task queue, activity and
workflow type); outside one (unit tests, scripts) every method is a no-op. Each
name says its unit, and every histogram records in that unit:

=====================================  =========  ==================================
name                                   kind       labels; meaning
=====================================  =========  ==================================
``playline_provider_calls``            counter    provider, tool, outcome (ok,
                                                  rate_limited, transient, rejected,
                                                  timeout): provider requests
``playline_provider_latency_seconds``  histogram  provider, tool: request latency
``playline_provider_rate_per_second``  gauge      provider: the governor's rate in
                                                  force (drops on a 429)
``playline_governor_wait_seconds``     histogram  provider: time a request waited
                                                  for the governor's permit
``playline_provider_credits``          histogram  provider, tool: credits one paid
                                                  answer cost (answers billed 0 are
                                                  not recorded); its ``_sum`` is the
                                                  credits spent
``playline_receipt_lookups``           counter    provider, tool, result (hit, miss,
                                                  waited): how claims were answered
``playline_provider_requests``         counter    provider, tool: HTTP requests sent
                                                  (retries included; the accounts'
                                                  ``requests``)
``playline_provider_replays``          counter    provider, tool: answers the provider
                                                  replayed for a repeated
                                                  Idempotency-Key (not charged)
``playline_provider_saved_credits``   histogram  provider, tool: credits a receipt had
                                                  cost, per call it answered free; its
                                                  ``_sum`` is the credits saved
``playline_rows``                      counter    outcome (ok, cached, failed): rows
                                                  finished by chunk activities
=====================================  =========  ==================================

Row outcomes do not overlap: ``ok`` rows paid for at least one provider call,
``cached`` rows were answered entirely by receipts (or needed no call), ``failed``
rows recorded an error. Temporal's histograms default to millisecond buckets, so
exporters must be given :data:`HISTOGRAM_BUCKETS` (:func:`prometheus_config` does).

**Spans.** With the ``otel`` extra installed, every tool call is an OpenTelemetry
span ``playline.tool_call`` with ``playline.provider``, ``playline.tool``,
``playline.receipt`` (hit, miss, waited, shared) and ``playline.outcome`` (``ok`` or
the error's type); never the input, the result, a receipt key or an API key. Add
``temporalio.contrib.opentelemetry.OpenTelemetryPlugin`` to the client (see
:func:`playline.worker.connect`'s ``tracing``) and the spans join the trace of
whoever started the play; until a tracer provider is set none is opened.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from temporalio import activity
from temporalio.common import MetricCounter, MetricGaugeFloat, MetricHistogramFloat
from temporalio.runtime import PrometheusConfig

from playline.calls.attempt import CallSpan

__all__ = [
    "HISTOGRAM_BUCKETS",
    "SPAN_NAME",
    "ProviderMetrics",
    "RowMetrics",
    "prometheus_config",
]

SPAN_NAME = "playline.tool_call"
TRACER_NAME = "playline"

#: Bucket boundaries of playline's histograms, in the unit each name says.
HISTOGRAM_BUCKETS: Mapping[str, Sequence[float]] = {
    "playline_provider_latency_seconds": (
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
        10.0,
        30.0,
    ),
    "playline_governor_wait_seconds": (
        0.001,
        0.005,
        0.01,
        0.05,
        0.1,
        0.5,
        1.0,
        5.0,
        10.0,
        30.0,
        60.0,
    ),
    "playline_provider_credits": (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0),
    "playline_provider_saved_credits": (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0),
}


def prometheus_config(bind_address: str, **options: Any) -> PrometheusConfig:
    """A ``PrometheusConfig`` with playline's histogram buckets (and ``options``)."""
    overrides = {**HISTOGRAM_BUCKETS, **dict(options.pop("histogram_bucket_overrides", {}))}
    return PrometheusConfig(
        bind_address=bind_address, histogram_bucket_overrides=overrides, **options
    )


# The instruments of a tool call by kind: (name, description, unit). One table
# serves both the creation and the lookups, so a name is spelled once.
_COUNTERS = (
    ("playline_provider_calls", "provider requests by outcome", "requests"),
    ("playline_budget_overshoots", "charges settled above their reservation", "calls"),
    ("playline_receipt_lookups", "receipt claims by result", "lookups"),
    ("playline_provider_requests", "HTTP requests sent, retries included", "requests"),
    ("playline_provider_replays", "answers replayed for a repeated key", "answers"),
)
_HISTOGRAMS = (
    ("playline_provider_latency_seconds", "provider request latency", "s"),
    ("playline_governor_wait_seconds", "time waited for a governor permit", "s"),
    ("playline_provider_credits", "credits charged per paid request", "credits"),
    ("playline_provider_saved_credits", "credits a receipt saved per call", "credits"),
)
_GAUGES = (("playline_provider_rate_per_second", "governor rate in force", "1/s"),)


class ProviderMetrics:
    """The metrics and spans of one activity attempt's tool calls (a ``CallMetrics``).

    Outside an activity the instrument tables stay empty, so every method is a no-op.
    """

    def __init__(self) -> None:
        self._counters: dict[str, MetricCounter] = {}
        self._histograms: dict[str, MetricHistogramFloat] = {}
        self._gauges: dict[str, MetricGaugeFloat] = {}
        self._tracer = _tracer()
        if activity.in_activity():
            meter = activity.metric_meter()
            self._counters = {spec[0]: meter.create_counter(*spec) for spec in _COUNTERS}
            self._histograms = {
                spec[0]: meter.create_histogram_float(*spec) for spec in _HISTOGRAMS
            }
            self._gauges = {spec[0]: meter.create_gauge_float(*spec) for spec in _GAUGES}

    def _add(self, name: str, labels: Mapping[str, str]) -> None:
        counter = self._counters.get(name)
        if counter is not None:
            counter.add(1, labels)

    def _record(self, name: str, value: float, labels: Mapping[str, str]) -> None:
        histogram = self._histograms.get(name)
        if histogram is not None:
            histogram.record(value, labels)

    def call(self, provider: str, tool: str, outcome: str, latency_s: float | None = None) -> None:
        self._add(
            "playline_provider_calls", {"provider": provider, "tool": tool, "outcome": outcome}
        )
        if latency_s is not None:
            self._record(
                "playline_provider_latency_seconds", latency_s, {"provider": provider, "tool": tool}
            )

    def rate(self, provider: str, rps: float | None) -> None:
        gauge = self._gauges.get("playline_provider_rate_per_second")
        if gauge is not None and rps is not None:
            gauge.set(rps, {"provider": provider})

    def receipt(self, provider: str, tool: str, status: str) -> None:
        self._add(
            "playline_receipt_lookups", {"provider": provider, "tool": tool, "result": status}
        )

    def credits(self, provider: str, tool: str, credits: float) -> None:
        self._record("playline_provider_credits", credits, {"provider": provider, "tool": tool})

    def request(self, provider: str, tool: str, *, replayed: bool) -> None:
        labels = {"provider": provider, "tool": tool}
        self._add("playline_provider_requests", labels)
        if replayed:
            self._add("playline_provider_replays", labels)

    def saved(self, provider: str, tool: str, credits: float) -> None:
        self._record(
            "playline_provider_saved_credits", credits, {"provider": provider, "tool": tool}
        )

    def overshoot(self, tool: str) -> None:
        self._add("playline_budget_overshoots", {"tool": tool})

    def governor_wait(self, provider: str, waited_s: float) -> None:
        self._record("playline_governor_wait_seconds", max(0.0, waited_s), {"provider": provider})

    def span(self, provider: str, tool: str) -> AbstractContextManager[CallSpan]:
        if self._tracer is None or not _tracing_configured():
            return contextlib.nullcontext(_NO_SPAN)
        return _tool_call_span(self._tracer, provider, tool)


class RowMetrics:
    """Rows finished by one chunk attempt, by outcome (``ok``, ``cached``, ``failed``)."""

    def __init__(self) -> None:
        self._rows: MetricCounter | None = None
        if activity.in_activity():
            self._rows = activity.metric_meter().create_counter(
                "playline_rows", "rows finished by outcome", "rows"
            )

    def row(self, outcome: str) -> None:
        if self._rows is not None:
            self._rows.add(1, {"outcome": outcome})


class _NoSpan:
    def receipt(self, status: str) -> None:
        return None


_NO_SPAN = _NoSpan()


class _OtelCallSpan:
    """A ``CallSpan`` over an OpenTelemetry span."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def receipt(self, status: str) -> None:
        self._span.set_attribute("playline.receipt", status)


@functools.cache
def _tracer() -> Any:
    """playline's OpenTelemetry tracer, or ``None`` without the ``otel`` extra.

    Looked up once: the API's tracer follows whatever provider is set later.
    """
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace.get_tracer(TRACER_NAME)


def _tracing_configured() -> bool:
    """Whether a tracer provider was set (spans from the API's default proxy go nowhere)."""
    from opentelemetry import trace

    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@contextlib.contextmanager
def _tool_call_span(tracer: Any, provider: str, tool: str) -> Iterator[CallSpan]:
    from opentelemetry.trace import Status, StatusCode

    with tracer.start_as_current_span(
        SPAN_NAME,
        attributes={"playline.provider": provider, "playline.tool": tool},
        # Exception messages may quote the input; only the type is recorded.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield _OtelCallSpan(span)
        except BaseException as err:
            outcome = type(err).__name__
            span.set_attribute("playline.outcome", outcome)
            span.set_status(Status(StatusCode.ERROR, outcome))
            raise
        span.set_attribute("playline.outcome", "ok")
