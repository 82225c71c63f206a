"""One provider request over httpx, and the classification of what came back.

This module knows HTTP and nothing about receipts or pacing: it builds the request
from the catalog (URL, auth header from the environment, ``Idempotency-Key``),
sends it, and turns every outcome into either a JSON result or a typed
``ProviderError``. The API key is read at call time and placed only in the request
header; it never appears in an error message, a log line or a receipt.
"""

from __future__ import annotations

import email.utils
import hashlib
import time
from collections.abc import Mapping
from typing import Any

import httpx

from playline.calls.catalog import Catalog, ToolSpec
from playline.errors import (
    MissingApiKey,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
    ProviderTransientError,
)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


class ProviderClient:
    """Sends tool calls to providers as the catalog describes them."""

    def __init__(
        self,
        catalog: Catalog,
        http: httpx.AsyncClient,
        *,
        environ: Mapping[str, str],
    ) -> None:
        """``environ`` holds the API keys and base-URL overrides the catalog names
        (``Settings.environ``); nothing else is read from it."""
        self._catalog = catalog
        self._http = http
        self._env = environ

    def auth_scope(self, tool: ToolSpec) -> str:
        """A digest naming the account a call is made under, without revealing the key.

        Receipts are keyed by it so two accounts never share cached answers.
        """
        provider = self._catalog.providers[tool.provider]
        secret = self._env.get(provider.auth.env, "") if provider.auth else ""
        return hashlib.sha256(f"{tool.provider}\x00{secret}".encode()).hexdigest()[:16]

    def _headers(self, tool: ToolSpec, idempotency_key: str) -> dict[str, str]:
        provider = self._catalog.providers[tool.provider]
        headers = {"Idempotency-Key": idempotency_key, "Accept": "application/json"}
        if provider.auth is not None:
            secret = self._env.get(provider.auth.env)
            if not secret:
                raise MissingApiKey(
                    f"provider {tool.provider!r} needs an API key in ${provider.auth.env}; "
                    "set it in the worker's environment"
                )
            scheme = provider.auth.scheme
            headers[provider.auth.header] = f"{scheme} {secret}" if scheme else secret
        return headers

    def check_auth(self, tool: ToolSpec) -> None:
        """Raise ``MissingApiKey`` now rather than at the first call."""
        self._headers(tool, "check")

    async def send(
        self,
        tool: ToolSpec,
        payload: Any,
        *,
        idempotency_key: str,
        path: str | None = None,
    ) -> Any:
        """Send one request; return its JSON body or raise a typed provider error."""
        provider = self._catalog.providers[tool.provider]
        url = provider.resolved_base_url(self._env) + (path or tool.path)
        headers = self._headers(tool, idempotency_key)
        try:
            if tool.method == "GET":
                response = await self._http.get(
                    url, params=payload, headers=headers, timeout=provider.timeout_s
                )
            else:
                response = await self._http.post(
                    url, json=payload, headers=headers, timeout=provider.timeout_s
                )
        except httpx.TimeoutException:
            raise ProviderTimeout(
                f"{tool.id}: no answer from {tool.provider} within {provider.timeout_s:g}s",
                tool_id=tool.id,
            ) from None
        except httpx.TransportError as err:
            raise ProviderTransientError(
                f"{tool.id}: connection to {tool.provider} failed ({type(err).__name__})",
                tool_id=tool.id,
            ) from None
        return _classify(tool, response)


def _classify(tool: ToolSpec, response: httpx.Response) -> Any:
    status = response.status_code
    if status == 429:
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        raise ProviderRateLimited(
            f"{tool.id}: {tool.provider} answered 429 (rate limited)"
            + (f", retry after {retry_after:g}s" if retry_after is not None else ""),
            tool_id=tool.id,
            status=status,
            retry_after_s=retry_after,
        )
    if status >= 500:
        raise ProviderTransientError(
            f"{tool.id}: {tool.provider} answered {status}",
            tool_id=tool.id,
            status=status,
            retry_after_s=parse_retry_after(response.headers.get("Retry-After")),
        )
    if status >= 400:
        raise ProviderRejected(
            f"{tool.id}: {tool.provider} rejected the request with {status}: {response.text[:300]}",
            tool_id=tool.id,
            status=status,
        )
    try:
        return response.json()
    except ValueError:
        raise ProviderTransientError(
            f"{tool.id}: {tool.provider} answered {status} with a body that is not JSON",
            tool_id=tool.id,
            status=status,
        ) from None
