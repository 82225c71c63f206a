"""One provider request over httpx, and the classification of what came back.

This module knows HTTP and nothing about receipts or pacing: it builds the request
from the catalog (URL, auth header from the environment, ``Idempotency-Key``),
sends it, and turns every outcome into either a JSON result or a typed
``ProviderError``, together with what the response said about the provider's
limits (:class:`~playline.pacing.headers.RateLimitReport`) for the governor.

API keys are read at call time and placed only in the request: in its header, or
in its query string for a provider that documents no header (``auth.query``); then
the URL holds the key, and the HTTP libraries' logs are scrubbed of it
(:mod:`playline.calls.log_scrub`). A provider's response text can echo a key (a 401
body quoting the key it got), so every piece of response text that reaches an error
message passes through a :class:`SecretScrubber` holding every key value of every
provider in the catalog first. No message here quotes a request's URL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Required, TypedDict, Unpack

import httpx

from playline.calls.answer_errors import answer_error
from playline.calls.billing import parse_reported
from playline.calls.catalog import Catalog, ToolSpec
from playline.calls.log_scrub import REDACTED, SecretScrubber, scrub_http_logs
from playline.errors import (
    MissingApiKey,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
    ProviderTransientError,
)
from playline.pacing.headers import RateLimitReport, parse_rate_limit
from playline.pacing.headers import parse_retry_after as _parse_retry_after

__all__ = ["REDACTED", "Exchange", "ProviderClient", "SecretScrubber", "parse_retry_after"]

#: How much of a rejected response's body an error message quotes.
BODY_EXCERPT_CHARS = 300


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    return _parse_retry_after(value, now_wall=time.time() if now is None else now)


@dataclass(frozen=True, slots=True)
class Exchange:
    """A provider's answer to one request, before it is judged.

    ``report`` is what the response said about the provider's limits (empty
    when it said nothing); ``charged`` the credits the provider said it charged, when
    the tool's billing names a header for it; ``replayed`` whether the provider said
    the answer replays an earlier request under the same ``Idempotency-Key``
    (:data:`REPLAYED_HEADER`: it charged that request, not this one); :meth:`result`
    is the JSON body or the typed error.
    """

    tool: ToolSpec
    status: int
    report: RateLimitReport
    body: bytes
    scrub: SecretScrubber
    charged: float | None = None
    replayed: bool = False

    def result(self) -> Any:
        """The JSON body, or the typed ``ProviderError`` this response amounts to."""
        return _classify(self)


class SendOptions(TypedDict, total=False):
    """The keywords of :meth:`ProviderClient.exchange` (and ``send``) after the payload."""

    idempotency_key: Required[str]
    path: str | None
    key_env: str | None


class ProviderClient:
    """Sends tool calls to providers as the catalog describes them.

    Args:
        catalog: where each tool lives and how its provider authenticates.
        http: the shared httpx client.
        environ: the API keys and base-URL overrides the catalog names
            (``Settings.environ``); nothing else is read from it.
        scrub: the worker's scrubber (every secret it holds); default: one holding
            the catalog's API keys.
    """

    def __init__(
        self,
        catalog: Catalog,
        http: httpx.AsyncClient,
        *,
        environ: Mapping[str, str],
        scrub: SecretScrubber | None = None,
    ) -> None:
        self._catalog = catalog
        self._http = http
        self._env = environ
        self._scopes: dict[str, str] = {}  # per provider; the keys are read once, as the scrubber's
        self.scrub = scrub or SecretScrubber(
            environ[name] for name in catalog.secret_variables() if environ.get(name)
        )
        # httpx logs every request's URL at INFO: a key in the query string is scrubbed
        # from it (by parameter name, and by value) before any handler sees it.
        scrub_http_logs(catalog.key_parameters(), self.scrub)

    def auth_scope(self, tool: ToolSpec) -> str:
        """A digest naming the account(s) a call is made under, without revealing a key.

        Receipts are keyed by it so two accounts never share cached answers. A
        provider used with several keys has one scope for all of them (the call
        may go out under any), which changes when the set of keys does.
        """
        scope = self._scopes.get(tool.provider)
        if scope is None:
            provider = self._catalog.providers[tool.provider]
            account = provider.auth.account if provider.auth is not None else None
            if account is not None:
                # A named account keeps its receipts however its keys rotate.
                material = "\x00".join([tool.provider, "account", account])
            else:
                secrets = sorted(self._env.get(env, "") for env in provider.key_envs())
                material = "\x00".join([tool.provider, *secrets])
            scope = self._scopes[tool.provider] = hashlib.sha256(material.encode()).hexdigest()[:16]
        return scope

    def _credentials(
        self, tool: ToolSpec, idempotency_key: str, key_env: str | None
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The request's headers and the query parameters it carries the key in (empty
        unless the provider's ``auth.query`` names one)."""
        provider = self._catalog.providers[tool.provider]
        headers = {"Idempotency-Key": idempotency_key, "Accept": "application/json"}
        params: dict[str, str] = {}
        auth = provider.auth
        if auth is not None:
            env = key_env or auth.envs[0]
            if env not in auth.envs:
                raise ValueError(f"{env!r} is not one of {tool.provider!r}'s key variables")
            secret = self._env.get(env)
            if not secret:
                raise MissingApiKey(
                    f"provider {tool.provider!r} needs an API key in ${env}; "
                    "set it in the worker's environment"
                )
            if auth.query is not None:
                params[auth.query] = secret
            else:
                assert auth.header is not None  # AuthSpec fills it when query is unset
                headers[auth.header] = f"{auth.scheme} {secret}" if auth.scheme else secret
        return headers, params

    def check_auth(self, tool: ToolSpec) -> None:
        """Raise ``MissingApiKey`` now rather than at the first call."""
        provider = self._catalog.providers[tool.provider]
        for env in provider.key_envs() or (None,):
            self._credentials(tool, "check", env)

    def key_choices(self, tool: ToolSpec) -> list[tuple[str, str]]:
        """``(pacing key, key variable)`` of each API key calls of ``tool`` may use.

        Empty when the provider is paced as a whole (one key, no ``key_pacing``).
        """
        provider = self._catalog.providers[tool.provider]
        keys = self._catalog.pacing_keys(tool.provider)
        return list(zip(keys, provider.key_envs(), strict=True)) if keys else []

    def timeout_s(self, tool: ToolSpec) -> float:
        """The HTTP timeout of ``tool``'s calls: its own, else its provider's."""
        return tool.timeout_s or self._catalog.providers[tool.provider].timeout_s

    async def exchange(
        self,
        tool: ToolSpec,
        payload: Any,
        *,
        idempotency_key: str,
        path: str | None = None,
        key_env: str | None = None,
    ) -> Exchange:
        """Send one request and return the answer unjudged (transport failures raise).

        ``key_env`` picks which of the provider's keys authenticates the call
        (default: the first). The whole exchange (connect, send, every byte of the
        answer) must finish within :meth:`timeout_s`, and the body may hold at most
        the provider's ``max_response_bytes``: a provider trickling bytes or sending
        a huge body is cut off, not waited for. Raises ``ProviderTimeout`` when no
        whole answer came in time and ``ProviderTransientError`` when the connection
        failed or the body was too large; each says whether the request may have
        been processed (``may_have_charged``).
        """
        provider = self._catalog.providers[tool.provider]
        url = provider.resolved_base_url(self._env) + (path or tool.path)
        headers, key_params = self._credentials(tool, idempotency_key, key_env)
        timeout = self.timeout_s(tool)
        # Connecting (or waiting for a pooled connection) gives up a little before the
        # whole exchange's deadline, so a connection never made is told apart from an
        # answer that never came: only the second may have been charged.
        phases = httpx.Timeout(
            timeout, connect=CONNECT_SHARE * timeout, pool=CONNECT_SHARE * timeout
        )
        if tool.method == "GET":
            # The key last: an input never stands in for it (the catalog refuses an input
            # field named as the key's parameter).
            params = {**payload, **key_params} if key_params else payload
            request = self._http.build_request(
                "GET", url, params=params, headers=headers, timeout=phases
            )
        else:
            request = self._http.build_request(
                "POST",
                url,
                params=key_params or None,
                json=payload,
                headers=headers,
                timeout=phases,
            )
        try:
            async with asyncio.timeout(timeout):
                response = await self._http.send(request, stream=True)
                try:
                    body = await _read_capped(response, provider.max_response_bytes, tool)
                finally:
                    await response.aclose()
        except (httpx.ConnectTimeout, httpx.PoolTimeout):
            # Never sent: no connection was made (or none was free).
            raise ProviderTimeout(
                f"{tool.id}: could not connect to {tool.provider} within {timeout:g}s",
                tool_id=tool.id,
            ) from None
        except (httpx.TimeoutException, TimeoutError):
            raise ProviderTimeout(
                f"{tool.id}: no whole answer from {tool.provider} within {timeout:g}s",
                tool_id=tool.id,
                may_have_charged=True,
            ) from None
        except httpx.ConnectError as err:
            raise ProviderTransientError(
                f"{tool.id}: connection to {tool.provider} failed ({type(err).__name__})",
                tool_id=tool.id,
            ) from None
        except httpx.TransportError as err:
            # The request may have gone out: the connection broke while sending it or
            # while reading the answer.
            raise ProviderTransientError(
                f"{tool.id}: connection to {tool.provider} failed ({type(err).__name__})",
                tool_id=tool.id,
                may_have_charged=True,
            ) from None
        report = parse_rate_limit(response.headers, now_wall=time.time())
        header = tool.billing.charged_header
        charged = parse_reported(response.headers.get(header)) if header else None
        replayed = response.headers.get(REPLAYED_HEADER, "").strip().lower() == "true"
        return Exchange(tool, response.status_code, report, body, self.scrub, charged, replayed)

    async def send(self, tool: ToolSpec, payload: Any, **how: Unpack[SendOptions]) -> Any:
        """Send one request (``how``: :meth:`exchange`'s keywords); return its JSON body or
        raise a typed provider error."""
        exchange = await self.exchange(tool, payload, **how)
        return exchange.result()


async def _read_capped(response: httpx.Response, cap: int, tool: ToolSpec) -> bytes:
    """The response body, or ``ProviderTransientError`` once it passes ``cap`` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _too_large(tool, cap)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise _too_large(tool, cap)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(tool: ToolSpec, cap: int) -> ProviderTransientError:
    return ProviderTransientError(
        f"{tool.id}: {tool.provider} answered with more than {cap} bytes "
        "(the provider's max_response_bytes); the answer was not read",
        tool_id=tool.id,
        may_have_charged=True,
    )


#: The share of a call's timeout that connecting may take (see ``exchange``).
CONNECT_SHARE = 0.9

#: The header by which a provider marks an answer replayed for a repeated
#: ``Idempotency-Key`` (Stripe's name, which the local provider server sends too).
REPLAYED_HEADER = "Idempotent-Replayed"

#: 5xx answers that say the request was not processed (so it was not charged).
NOT_PROCESSED_5XX = frozenset({503})

#: Client errors that are about timing, not about the request: retried like a 5xx.
RETRYABLE_4XX = {
    408: "request timeout",
    409: "a request with this Idempotency-Key is still in flight",
    425: "too early",
}


def _classify(exchange: Exchange) -> Any:
    tool, status = exchange.tool, exchange.status
    retry_after = exchange.report.retry_after_s
    if status == 429:
        raise ProviderRateLimited(
            f"{tool.id}: {tool.provider} answered 429 (rate limited)"
            + (f", retry after {retry_after:g}s" if retry_after is not None else ""),
            tool_id=tool.id,
            status=status,
            retry_after_s=retry_after,
        )
    if status >= 500:
        # A 503 says "not processed, try later"; any other 5xx may come after the
        # provider did the work (and charged for it).
        raise ProviderTransientError(
            f"{tool.id}: {tool.provider} answered {status}",
            tool_id=tool.id,
            status=status,
            retry_after_s=retry_after,
            may_have_charged=status not in NOT_PROCESSED_5XX,
        )
    if status in RETRYABLE_4XX:
        # 409: the same Idempotency-Key is still being processed (a crashed attempt's
        # request, or our own timed-out one): the answer will be there; retry, paced.
        raise ProviderTransientError(
            f"{tool.id}: {tool.provider} answered {status} ({RETRYABLE_4XX[status]})",
            tool_id=tool.id,
            status=status,
            retry_after_s=retry_after,
        )
    if status in tool.no_match_status:
        # The provider's documented "nothing found" (People Data Labs' 404): a miss, not
        # an error. Its body is an error envelope, not a result: the result is null.
        return None
    if status >= 400:
        # Scrub the whole body before cutting it, so no part of a key survives the cut.
        text = exchange.scrub(exchange.body.decode("utf-8", errors="replace"))
        raise ProviderRejected(
            f"{tool.id}: {tool.provider} rejected the request with {status}: "
            f"{text[:BODY_EXCERPT_CHARS]}",
            tool_id=tool.id,
            status=status,
        )
    try:
        # A provider may echo the key in a result too: scrub it before it can reach a
        # receipt, the sheet, an export or history (a JSON string stays a JSON string).
        # NaN and Infinity (which JSON does not have) become null, so a paid answer
        # can be stored; nesting deep enough to exhaust the parser is not JSON either.
        text = exchange.scrub(exchange.body.decode("utf-8", errors="replace"))
        answer = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        # The provider answered (and likely charged) but the body is unusable.
        raise ProviderTransientError(
            f"{tool.id}: {tool.provider} answered {status} with a body that is not JSON",
            tool_id=tool.id,
            status=status,
            may_have_charged=True,
        ) from None
    if tool.error_field is not None:
        # An error answered with a 2xx (NeverBounce's `status: throttle_triggered`).
        error = answer_error(
            tool.error_field, answer, tool_id=tool.id, provider=tool.provider, status=status
        )
        if error is not None:
            raise error
    return answer


def _no_constant(name: str) -> None:
    """``NaN``, ``Infinity`` and ``-Infinity`` in a provider's JSON read as null."""
    return None
