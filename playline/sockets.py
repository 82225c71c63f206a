"""TCP sockets for the local servers playline starts: a free port, a listening socket.

Shared by the fake provider (``provider_server``), ``playline webhook`` and the pytest
fixtures (:mod:`playline.testing`), none of which should reach into another for them.
"""

from __future__ import annotations

import socket

__all__ = ["bind_socket", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket on ``host:port`` for uvicorn to listen on (port 0 picks one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections (no 40 ms stalls)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock
