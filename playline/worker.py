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
from playline.errors import PlaylineError
from playline.plugin import PlaylinePlugin
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
                f"--plays {name}: cannot import it ({err}); run from the directory that "
                "holds it or install its package"
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
    namespace: str = "default",
    settings: Settings | None = None,
    runtime: Runtime | None = None,
    tracing: bool = False,
) -> Client:
    """A client carrying the playline plugin (pydantic converter, plays, activities).

    Workers built from it register playline and open their services from
    ``settings``; a client used only to start plays never opens them. The
    address defaults to ``settings.temporal_address`` (``$TEMPORAL_ADDRESS``);
    ``settings.codec_keys`` turn on payload encryption. ``tracing`` adds the
    SDK's ``OpenTelemetryPlugin`` (the ``otel`` extra): set a tracer provider
    from ``temporalio.contrib.opentelemetry.create_tracer_provider()`` first.
    """
    settings = settings or Settings.from_env()
    plugins: list[Plugin] = [PlaylinePlugin(settings=settings)]
    if tracing:
        plugins.append(tracing_plugin())
    return await Client.connect(
        address or settings.temporal_address,
        namespace=namespace,
        plugins=plugins,
        runtime=runtime,
    )


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
    address: str | None = None,
    namespace: str = "default",
    task_queue: str = DEFAULT_TASK_QUEUE,
    plays: Sequence[str] = (),
    settings: Settings | None = None,
    ready: asyncio.Event | None = None,
    metrics_port: int | None = None,
    tracing: bool = False,
) -> None:
    """Run a worker until cancelled.

    ``metrics_port`` serves Prometheus metrics on ``127.0.0.1:PORT/metrics`` (with
    playline's histogram buckets, see :mod:`playline.telemetry`); ``tracing``
    adds OpenTelemetry tracing (see :func:`connect`).
    """
    settings = settings or Settings.from_env()
    address = address or settings.temporal_address
    import_plays(plays)
    runtime = None
    if metrics_port:
        runtime = Runtime(
            telemetry=TelemetryConfig(metrics=prometheus_config(f"127.0.0.1:{metrics_port}"))
        )
    client = await connect(
        address, namespace=namespace, settings=settings, runtime=runtime, tracing=tracing
    )
    worker = build_worker(client, task_queue=task_queue)
    logger.info("playline worker polling %s on %s", task_queue, address)
    async with worker:
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
