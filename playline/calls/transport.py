"""The HTTP client every provider call goes through: httpx's API over aiohttp.

httpx is playline's client API (requests, timeouts, limits, proxies from the
environment, TLS verification). Its default transport (httpcore) spends most of a
busy worker's CPU in its connection pool: on every request and release it scans
every pooled connection. ``httpx_aiohttp.HttpxAiohttpClient`` keeps the httpx API
and hands the wire to aiohttp's connector instead: measured side by side in
``bench/http_transports.py`` at 0.13x the client CPU per request of httpx's own
pool (HTTP/2 through httpx failed outright at 200 concurrent streams).
``tests/integration/test_http_transport.py`` holds both transports to the same
behaviour: redirects are not followed, TLS is verified, proxies come from the
environment, timeouts and cancellation are exact, headers (``Idempotency-Key``)
arrive as sent, and a connection that fails (refused, certificate rejected, dropped)
is a connection error, not a timeout: httpx-aiohttp 0.2 maps every aiohttp connection
error to ``httpx.ConnectTimeout``, which :class:`_Transport` corrects.

Neither layer keeps cookies. One client serves every provider and every API key of a
worker: a cookie jar would hand a session cookie set for one account to requests made
with another's key (and parsing ``Set-Cookie`` into two jars cost about 5 % of a live
worker's CPU).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Literal

import aiohttp
import httpx
from httpx._types import CertTypes
from httpx_aiohttp import AiohttpTransport

from playline.pacing.sending import note_sending

__all__ = ["Transport", "make_http_client"]

Transport = Literal["aiohttp", "httpx"]

_DEFAULT_LIMITS = httpx.Limits()

#: Connect fast or fail; a provider's own read timeout comes from the catalog per call.
DEFAULT_TIMEOUT = httpx.Timeout(15.0, connect=5.0)


def make_http_client(
    *,
    max_connections: int = 256,
    max_keepalive: int = 32,
    transport: Transport = "aiohttp",
    timeout: httpx.Timeout = DEFAULT_TIMEOUT,
) -> httpx.AsyncClient:
    """The shared provider HTTP client of one worker process.

    Args:
        max_connections: connections open at once, across providers.
        max_keepalive: idle connections kept for reuse.
        transport: ``"aiohttp"`` (default) or ``"httpx"`` (httpcore, for comparison).
        timeout: the default timeout; calls pass their provider's own.
    """
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive)
    if transport == "httpx":
        # httpcore has no hook at the wire that keeps the task's context: stamped as
        # the request is handed to the pool (see pacing.sending).
        hooks = {"request": [_request_leaving]}
        return _CookielessClient(limits=limits, timeout=timeout, event_hooks=hooks)
    return _AiohttpClient(limits=limits, timeout=timeout)


async def _request_leaving(_request: httpx.Request) -> None:
    note_sending()


async def _headers_sent(*_args: object) -> None:
    """aiohttp wrote a request's headers: the moment a paced call left (see
    pacing.sending), after any wait for a connection or its setup, in the task that
    holds the call's permit."""
    note_sending()


def _stamping_trace() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_headers_sent)
    return trace


class _NoCookies(httpx.Cookies):
    """A jar that never takes a cookie from a response."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class _CookielessClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` that neither stores nor sends cookies between requests."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        # httpx's ``cookies`` setter copies into a plain ``Cookies``: set the jar itself.
        self._cookies = _NoCookies()


class _Transport(AiohttpTransport):
    """``AiohttpTransport`` whose connection failures are not reported as timeouts and
    whose aiohttp session keeps no cookies."""

    def get_client(self) -> aiohttp.ClientSession:
        if self.client is not None or self.uds:
            return super().get_client()
        # The base's TCP session, with a jar that discards what providers set.
        limit = self.limits.max_connections
        connector = aiohttp.TCPConnector(
            keepalive_timeout=self.limits.keepalive_expiry,
            ssl=self.ssl_context,
            local_addr=(self.local_address, 0) if self.local_address else None,
            limit=100 if limit is None else limit,  # aiohttp's default when none is set
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=[_stamping_trace()],
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.ConnectTimeout as err:
            cause = err.__cause__
            if cause is None or isinstance(cause, asyncio.TimeoutError | TimeoutError):
                raise  # a real connect timeout (aiohttp's are TimeoutErrors too)
            raise httpx.ConnectError(f"{type(cause).__name__}: {cause}", request=request) from cause


class _AiohttpClient(_CookielessClient):
    """httpx's client with :class:`_Transport` underneath, also for proxies from the
    environment (httpx builds one transport per proxy, through these two hooks)."""

    def _init_transport(
        self,
        verify: ssl.SSLContext | str | bool = True,
        cert: CertTypes | None = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = _DEFAULT_LIMITS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> httpx.AsyncBaseTransport:
        if transport is not None:
            return transport
        return _Transport(verify=verify, cert=cert, trust_env=trust_env, limits=limits)

    def _init_proxy_transport(
        self,
        proxy: httpx.Proxy,
        verify: ssl.SSLContext | str | bool = True,
        cert: CertTypes | None = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = _DEFAULT_LIMITS,
    ) -> httpx.AsyncBaseTransport:
        return _Transport(verify=verify, cert=cert, trust_env=trust_env, limits=limits, proxy=proxy)
