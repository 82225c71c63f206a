"""``playline webhook``: the receiver asynchronous providers call back when a job moves.

::

    playline webhook [--host 127.0.0.1] [--port 8790] [--catalog PATH]

It serves :func:`playline.webhook.webhook_app` over the workers' job ledger (the store
``PLAYLINE_STORE_URL`` / ``PLAYLINE_HOME`` names; it must exist: a worker creates it)
with the workers' catalog (``--catalog``, else ``PLAYLINE_CATALOG``, else the demo's),
and signals ``jobs_ready`` to the dataset runs waiting on a job (Temporal from
``TEMPORAL_ADDRESS`` or ``--address``). Workers put the callback base it prints,
``PLAYLINE_WEBHOOK_URL``, in each submit; in production that is the public URL of a
reverse proxy or tunnel in front of it (the receiver binds loopback by default).
The per-job token in each callback URL is a secret, so the server keeps no access log.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping

import uvicorn
from temporalio.client import Client

from playline import demo
from playline.calls.catalog import Catalog, ToolSpec
from playline.cli.flags import add_listen_flags, add_temporal_flags
from playline.cli.render import console
from playline.config import Settings
from playline.errors import PlaylineError
from playline.sockets import bind_socket
from playline.stores.backends import open_stores
from playline.webhook import webhook_app, webhook_tools

__all__ = ["DEFAULT_PORT", "add_webhook_parser", "cmd_webhook", "signaller"]

DEFAULT_PORT = 8790
#: The signal a dataset run takes when its jobs finished (no arguments).
JOBS_READY_SIGNAL = "jobs_ready"

logger = logging.getLogger("playline.webhook")


def add_webhook_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hook = sub.add_parser(
        "webhook",
        help="receive asynchronous providers' job callbacks (webhooks)",
        description="Serve POST /hooks/<provider>/<token> for the catalog's webhook tools: "
        "check each delivery, store the job's status in the workers' job ledger and wake the "
        "dataset runs waiting on it.",
    )
    add_listen_flags(hook, DEFAULT_PORT)
    hook.add_argument(
        "--catalog",
        help="the workers' catalog (default: $PLAYLINE_CATALOG, else the demo catalog)",
    )
    hook.add_argument("--home", help="state directory (default $PLAYLINE_HOME or .playline)")
    add_temporal_flags(hook)


def signaller(client: Client) -> Callable[[str], Awaitable[None]]:
    """``notify(workflow_id)``: the ``jobs_ready`` signal to that workflow's latest run."""

    async def notify(workflow_id: str) -> None:
        await client.get_workflow_handle(workflow_id).signal(JOBS_READY_SIGNAL)

    return notify


def unset_secrets(tools: list[ToolSpec], environ: Mapping[str, str]) -> list[str]:
    """One line per signing secret the receiver lacks (its deliveries would be 500)."""
    lines = []
    for tool in tools:
        spec = tool.job.webhook if tool.job is not None else None
        if spec is not None and spec.signature != "none" and not environ.get(spec.secret_env or ""):
            lines.append(
                f"${spec.secret_env} is not set: deliveries for tool {tool.id!r} "
                f"({spec.signature}) are refused until it is"
            )
    return lines


def callback_base(host: str, port: int) -> str:
    """``http://HOST:PORT`` (an IPv6 literal bracketed)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    if not 0 <= port < 65536:
        raise PlaylineError(f"--port must be 0 to 65535, got {port}")
    try:
        return bind_socket(host, port)
    except OSError as err:
        why = "the port is in use" if err.errno == errno.EADDRINUSE else err.strerror or err
        raise PlaylineError(
            f"cannot listen on {callback_base(host, port)}: {why}; choose another --port"
        ) from None


async def cmd_webhook(args: argparse.Namespace, settings: Settings) -> int:
    from playline.worker import connect

    catalog_path = args.catalog or settings.catalog_path or str(demo.CATALOG)
    catalog = Catalog.from_toml(catalog_path)
    tools = webhook_tools(catalog)
    if not tools:
        raise PlaylineError(
            f"catalog {catalog_path} has no tool taking webhooks (a tool with a job.webhook "
            "table); pass the workers' catalog with --catalog or PLAYLINE_CATALOG"
        )
    sock = _bind(args.host, args.port)
    try:
        async with await open_stores(settings, create=False) as stores:
            client = await connect(settings=settings)
            app = webhook_app(stores.jobs, catalog, signaller(client), settings.environ)
            config = uvicorn.Config(
                app,
                log_level="warning",
                # the access log would print each callback path, and so each job's token
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
            )
            port = sock.getsockname()[1]
            base = callback_base(args.host, port)
            names = ", ".join(sorted(tool.id for tool in tools))
            console.print(
                f"webhook receiver on {base} (tools {names}; store {stores.where}; Temporal "
                f"{settings.temporal_address}); workers must set PLAYLINE_WEBHOOK_URL={base} "
                "(or the public URL that reaches it)"
            )
            for line in unset_secrets(tools, settings.environ):
                console.print(f"[yellow]warning:[/] {line}")
            await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        with contextlib.suppress(OSError):
            sock.close()
    return 0
