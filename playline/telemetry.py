"""Provider-call metrics through the Temporal SDK's own metric meter.

This is the Temporal side of :class:`playline.calls.attempt.CallMetrics`: the
call path records through that protocol and never imports Temporal.

Inside an activity the meter is the worker runtime's (so ``playline worker
--metrics-port`` exposes them to Prometheus beside Temporal's own metrics); outside
one (unit tests, scripts) every method is a no-op.

* ``playline_provider_calls`` (counter; provider, tool, outcome): ok, rate_limited,
  transient, rejected, timeout, fixture;
* ``playline_provider_latency`` (histogram, seconds; provider, tool);
* ``playline_provider_rate`` (gauge, requests/s; provider): the governor's rate in
  force after the call, which drops on a 429 and climbs back on success.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity
from temporalio.common import MetricCounter, MetricGaugeFloat, MetricHistogramTimedelta


class ProviderMetrics:
    """Metric instruments for the tool calls of one activity attempt (a ``CallMetrics``)."""

    def __init__(self) -> None:
        self._calls: MetricCounter | None = None
        self._latency: MetricHistogramTimedelta | None = None
        self._rate: MetricGaugeFloat | None = None
        if activity.in_activity():
            meter = activity.metric_meter()
            self._calls = meter.create_counter(
                "playline_provider_calls", "provider calls by outcome"
            )
            self._latency = meter.create_histogram_timedelta(
                "playline_provider_latency", "provider call latency"
            )
            self._rate = meter.create_gauge_float(
                "playline_provider_rate", "governor rate in force", "1/s"
            )

    def call(self, provider: str, tool: str, outcome: str, latency_s: float | None = None) -> None:
        if self._calls is None:
            return
        self._calls.add(1, {"provider": provider, "tool": tool, "outcome": outcome})
        if latency_s is not None and self._latency is not None:
            self._latency.record(timedelta(seconds=latency_s), {"provider": provider, "tool": tool})

    def rate(self, provider: str, rps: float | None) -> None:
        if self._rate is not None and rps is not None:
            self._rate.set(rps, {"provider": provider})
