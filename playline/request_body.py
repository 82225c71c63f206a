"""A request body read with a cap, for playline's own small HTTP servers.

The codec server and the webhook receiver face callers they cannot trust to send
little: a body past the cap is refused (413) as soon as it is declared or has
streamed that far, never read whole first.
"""

from __future__ import annotations

from starlette.requests import Request

__all__ = ["BodyTooLarge", "read_capped_body"]


class BodyTooLarge(Exception):
    """The request's body is over the server's limit."""


async def read_capped_body(request: Request, limit: int) -> bytes:
    """The body of ``request``, or :class:`BodyTooLarge` once it passes ``limit`` bytes
    (declared in ``Content-Length`` or streamed)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge
    return bytes(body)
