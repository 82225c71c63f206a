"""Command line entry point: ``python -m playline.provider_server``.

Runs the local provider server in the foreground so the demo (and
``ProviderServerProcess``) has a real HTTP endpoint to call. It binds loopback
only unless told otherwise, and prints exactly one line,
``provider server listening on http://HOST:PORT``, once it accepts connections.
``--idempotency ignore`` makes it charge every request whatever its
``Idempotency-Key``, like most real enrichment APIs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from socket import socket
from typing import Any, cast

from pydantic import ValidationError
from starlette.types import ASGIApp

from playline.provider_server.config import ServerConfig
from playline.provider_server.process import READY_PREFIX, make_uvicorn_server
from playline.sockets import bind_socket


def _pairs(values: Sequence[str], flag: str, cast: type) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not name:
            raise ValueError(f"{flag} expects PROVIDER=NUMBER (e.g. acme=200), got {value!r}")
        try:
            result[name] = cast(number)
        except ValueError:
            raise ValueError(f"{flag} {value!r}: {number!r} is not a number") from None
    return result


def _latency(value: str) -> tuple[float, float]:
    low, sep, high = value.partition(",")
    try:
        return (float(low), float(high if sep else low))
    except ValueError:
        raise ValueError(f"--latency-ms expects LOW,HIGH in milliseconds, got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m playline.provider_server",
        description="Run the local fake provider server (acme + firmo) for demos and tests.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8787, help="port (0 picks a free one)")
    parser.add_argument("--rps", action="append", default=[], metavar="PROVIDER=RPS")
    parser.add_argument("--burst", action="append", default=[], metavar="PROVIDER=N")
    parser.add_argument("--latency-ms", metavar="LOW,HIGH", help="uniform latency range")
    parser.add_argument("--seed", type=int, help="seed of the fault-injection RNG")
    parser.add_argument(
        "--idempotency",
        choices=["key", "ignore"],
        help="honour Idempotency-Key (key, the default) or charge every request (ignore)",
    )
    parser.add_argument("--config-json", help="a ServerConfig as JSON; the flags above override")
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig described by the parsed command line (raises ValueError)."""
    data: dict[str, Any] = json.loads(args.config_json) if args.config_json else {}
    if not isinstance(data, dict):
        raise ValueError("--config-json must be a JSON object")
    if args.rps:
        data["rate_limit_rps"] = {
            **data.get("rate_limit_rps", {}),
            **_pairs(args.rps, "--rps", float),
        }
    if args.burst:
        bursts = _pairs(args.burst, "--burst", int)
        data["rate_limit_burst"] = {**data.get("rate_limit_burst", {}), **bursts}
    if args.latency_ms:
        data["latency_ms"] = _latency(args.latency_ms)
    if args.seed is not None:
        data["seed"] = args.seed
    if args.idempotency is not None:
        data["idempotency"] = args.idempotency
    return ServerConfig.model_validate(data)


def _announce(sock: socket, host: str) -> Callable[[], None]:
    def announce() -> None:
        port = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        print(f"{READY_PREFIX}http://{shown}:{port}", flush=True)

    return announce


def main(argv: list[str] | None = None) -> int:
    """Run the server until interrupted; returns the process exit code."""
    return serve(argv)


def serve(argv: list[str] | None, wrap: Callable[[ASGIApp], ASGIApp] | None = None) -> int:
    """Parse ``argv``, bind and run until interrupted; ``wrap`` puts a layer (the
    strict server's limits) around the app, so every entry point reports a bad
    configuration or a taken port the same way."""
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, ValidationError) as err:
        print(f"error: invalid provider server configuration: {err}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as err:
        print(f"error: cannot bind {args.host}:{args.port}: {err}", file=sys.stderr)
        return 1
    server = make_uvicorn_server(config, on_started=_announce(sock, args.host))
    if wrap is not None:
        server.config.app = wrap(cast(ASGIApp, server.config.app))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
