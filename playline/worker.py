"""The worker entry point: a Temporal client and worker carrying the playline plugin.

``playline worker`` calls ``run_worker``; so can your own code. Plays are found by
importing the modules that declare them (``--plays mypkg.plays``); the demo play is
always included.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from temporalio.client import Client, Plugin
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.worker import Worker

from playline.config import Settings
from playline.errors import PlaylineError, TemporalUnavailable
from playline.plugin import PlaylinePlugin
from playline.services import Services
from playline.telemetry import prometheus_config

DEFAULT_TASK_QUEUE = "playline"
DEFAULT_PLAYS = ("playline.demo.enrich_leads",)

logger = logging.getLogger("playline.worker")


def import_plays(modules: Sequence[str]) -> None:
    """Import the modules that declare plays and resolvers (registering them).

    The current directory is importable, as with ``python -m``, so
    ``playline worker --plays mypkg.plays`` works from a project's root.
    """
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for name in (*DEFAULT_PLAYS, *modules):
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise PlaylineError(
                f"cannot import plays module {name!r}: {err}; run from the directory that "
                "holds it, or install its package"
            ) from None


def tracing_plugin() -> Plugin:
    """The SDK's ``OpenTelemetryPlugin`` (the ``otel`` extra), or a clear error without it."""
    try:
        from temporalio.contrib.opentelemetry import OpenTelemetryPlugin
    except ImportError:
        raise PlaylineError("tracing needs OpenTelemetry: pip install 'playline[otel]'") from None
    return OpenTelemetryPlugin()


async def connect(
    address: str | None = None,
    *,
    settings: Settings | None = None,
    services: Services | None = None,
    runtime: Runtime | None = None,
    tracing: bool = False,
) -> Client:
    """A client carrying the playline plugin (pydantic converter, plays, activities).

    The connection (address, namespace, TLS, API key) comes from ``settings``
    (``Settings.from_env()``: the SDK's environment configuration); ``address``
    overrides its address. Workers built from the client open their services from
    ``settings`` unless already-open ``services`` are given; a client used only to
    start plays never opens them. An unreachable server is one clear
    ``TemporalUnavailable`` error, not a traceback. ``settings.codec_keys`` turn
    on payload encryption; ``tracing`` adds the SDK's ``OpenTelemetryPlugin`` (the
    ``otel`` extra: set a tracer provider first).
    """
    settings = settings or Settings.from_env()
    if address:
        settings = settings.with_overrides(temporal_address=address)
    kwargs = settings.client_connect_kwargs()
    plugins: list[Plugin] = [PlaylinePlugin(settings=settings, services=services)]
    if tracing:
        plugins.append(tracing_plugin())
    try:
        return await Client.connect(**kwargs, plugins=plugins, runtime=runtime)
    except RuntimeError as err:
        raise TemporalUnavailable(
            f"cannot reach Temporal at {settings.temporal_address} "
            f"(namespace {settings.temporal_namespace}): {_connect_reason(err)}. Start one "
            "with `playline dev`, or point TEMPORAL_ADDRESS (or a TEMPORAL_PROFILE) at yours"
        ) from None


def _connect_reason(err: RuntimeError) -> str:
    text = str(err)
    for needle, reason in (
        ("Connection refused", "connection refused"),
        ("dns error", "the host name does not resolve"),
        ("timed out", "the connection timed out"),
        ("Unauthenticated", "the API key or certificate was refused"),
        ("PermissionDenied", "permission denied for this namespace"),
    ):
        if needle.lower() in text.lower():
            return reason
    return text.splitlines()[0][:200]


def build_worker(
    client: Client,
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    max_concurrent_activities: int = 64,
) -> Worker:
    """A worker for a client from ``connect`` (the plugin comes with the client)."""
    return Worker(
        client,
        task_queue=task_queue,
        max_concurrent_activities=max_concurrent_activities,
    )


async def run_worker(
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    plays: Sequence[str] = (),
    settings: Settings | None = None,
    ready: asyncio.Event | None = None,
    metrics_port: int | None = None,
    tracing: bool = False,
) -> None:
    """Run a worker until cancelled.

    ``metrics_port`` serves Prometheus metrics on ``METRICS_HOST:PORT/metrics`` (with
    playline's histogram buckets, see :mod:`playline.telemetry`); ``tracing`` adds
    OpenTelemetry tracing (see :func:`connect`).

    Everything that can be wrong with the worker's configuration (plays that do not
    import, a bad catalog, an unreachable store or Temporal) fails here, before any
    polling starts, as a ``PlaylineError`` naming the cause: a worker that cannot
    work never sits silently on a task queue.
    """
    settings = settings or Settings.from_env()
    import_plays(plays)
    runtime = None
    if metrics_port:
        runtime = Runtime(
            telemetry=TelemetryConfig(
                metrics=prometheus_config(f"{settings.metrics_host}:{metrics_port}")
            )
        )
    services = await Services.open(settings)
    try:
        client = await connect(
            settings=settings, services=services, runtime=runtime, tracing=tracing
        )
        worker = build_worker(client, task_queue=task_queue)
        logger.info("playline worker polling %s on %s", task_queue, settings.temporal_address)
        running = asyncio.ensure_future(worker.run())
        if ready is not None:
            ready.set()
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            await worker.shutdown()
            raise
    finally:
        await services.close()
