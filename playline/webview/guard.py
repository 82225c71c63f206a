"""Who may see the sheets: this machine, or whoever holds the token.

Pages show rows, so the view is for its user only unless told otherwise:

* it binds loopback by default, and binding another address needs a token
  (:func:`check_exposure`, as ``codec-server``'s);
* a request from another address must carry the token: ``Authorization: Bearer
  <token>``, or the cookie a browser gets by opening ``/?token=<token>`` once (the
  address bar then drops it). Without it: 401, and nothing is read;
* a request must name an allowed ``Host`` (a DNS-rebinding page is refused, as the
  codec server refuses it), and a form post must come from the view's own origin
  (another site's page cannot press its buttons).

Tokens are compared in constant time; neither they nor any row reach a log.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import URL
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from playline.errors import PlaylineError

__all__ = ["TOKEN_COOKIE", "Guard", "check_exposure", "is_loopback"]

TOKEN_COOKIE = "playline_ui_token"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface


def check_exposure(host: str, token: str | None) -> None:
    """Refuse to serve sheets beyond loopback without a token."""
    if token or is_loopback(host):
        return
    raise PlaylineError(
        f"refusing to serve the sheets on {host} without a token: pass --token (or bind 127.0.0.1)"
    )


class Guard:
    """ASGI middleware: the token for non-loopback clients, same-origin posts."""

    def __init__(self, app: ASGIApp, *, token: str | None, hosts: Sequence[str]) -> None:
        self.app = app
        self.token = token
        self.hosts = {h.lower() for h in hosts}

    def _has_token(self, conn: HTTPConnection) -> bool:
        if self.token is None:
            return False
        expected = self.token.encode()
        bearer = conn.headers.get("authorization", "")
        given = bearer[7:] if bearer.lower().startswith("bearer ") else ""
        for candidate in (
            given,
            conn.cookies.get(TOKEN_COOKIE, ""),
            conn.query_params.get("token", ""),
        ):
            if candidate and hmac.compare_digest(candidate.encode(), expected):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        host = (conn.url.hostname or "").lower()
        if self.hosts and host not in self.hosts:
            await PlainTextResponse("unknown host", 400)(scope, receive, send)
            return
        client = conn.client.host if conn.client else ""
        token_ok = self._has_token(conn)
        if not is_loopback(client) and not token_ok:
            response: Response = PlainTextResponse(
                "this sheet view needs its token: open /?token=<token> or send "
                "Authorization: Bearer <token>",
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        if "token" in conn.query_params and token_ok:
            # Keep the token out of the address bar and the history: a cookie from now on.
            clean = URL(scope=scope).remove_query_params("token")
            target = clean.path + (f"?{clean.query}" if clean.query else "")
            response = RedirectResponse(target, 303)
            response.set_cookie(TOKEN_COOKIE, self.token or "", httponly=True, samesite="strict")
            await response(scope, receive, send)
            return
        if scope["method"] == "POST" and not _same_origin(conn):
            await PlainTextResponse("cross-site form refused", 403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _same_origin(conn: HTTPConnection) -> bool:
    """A post's ``Origin`` (or ``Referer``) names the host it was sent to."""
    origin = conn.headers.get("origin") or conn.headers.get("referer")
    if not origin or origin == "null":
        return False
    return urlsplit(origin).netloc.lower() == conn.headers.get("host", "").lower()
