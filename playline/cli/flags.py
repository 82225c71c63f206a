"""Flags several commands declare alike, declared once so their names, defaults and
help texts cannot drift apart between commands."""

from __future__ import annotations

import argparse


def add_temporal_flags(p: argparse.ArgumentParser) -> None:
    """``--address`` and ``--namespace``: the Temporal service a command talks to."""
    p.add_argument(
        "--address",
        help="Temporal frontend (default: $TEMPORAL_ADDRESS, the profile's, or localhost:7233)",
    )
    p.add_argument(
        "--namespace", help="Temporal namespace (default: $TEMPORAL_NAMESPACE or default)"
    )


def add_listen_flags(p: argparse.ArgumentParser, port: int) -> None:
    """``--host`` (loopback unless told otherwise) and ``--port`` of a command that serves."""
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    p.add_argument("--port", type=int, default=port, help=f"port (default {port})")
