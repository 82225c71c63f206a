"""A strict enforcing layer in front of the local provider server, for benchmarks.

The provider server's own limiters (:mod:`~playline.provider_server.limiters`' shapes)
are what playline's governor was first measured against. To judge the governor
against limits it was not tuned to, :class:`StrictLimits` wraps the server's ASGI app
and enforces, per provider (the first path segment: ``/acme/...``), limits of its own,
written apart from both (:class:`~playline.provider_server.limiters.StrictGcra`,
:class:`~playline.provider_server.limiters.StrictConcurrency`):

* ``concurrency``: at most that many requests in flight, counted from arrival until
  the answer's last byte is sent; one more is answered ``429`` at once, with no
  ``Retry-After`` and no rate-limit headers (as concurrency-capped APIs do);
* ``gcra``: ``{"rate": r, "burst": b}``, a GCRA with no slack, ``429`` with
  ``Retry-After`` written as ``retry_after`` says (``ceil``: whole seconds, at
  least 1; ``exact``; ``none``);
* ``fault_503``: that share of the admitted requests is answered ``503`` (not
  processed, not charged) after a delay drawn from ``fault_503_delay_s``; the
  request holds its concurrency slot meanwhile.

A refused request never reaches the server (its ledger does not see it). Every
request to a limited provider is recorded here as ``(provider, arrival, end,
status)`` on the layer's monotonic clock, which is what a benchmark reads to
measure calls in flight over time. Admin: ``POST /_strict/config`` (``{"providers":
{name: rule}}``, replacing every rule and resetting the limits' state),
``POST /_strict/reset`` (state and records), ``GET /_strict/calls?since=T``.

Run it as ``python -m playline.provider_server.strict`` (the same flags as
``python -m playline.provider_server``), or :class:`StrictProviderServerProcess`.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from playline.provider_server.limiters import StrictConcurrency, StrictGcra
from playline.provider_server.process import ProviderServerProcess

__all__ = ["StrictLimits", "StrictProviderServerProcess", "StrictRule"]

#: One call as the layer saw it: provider, arrival, end (monotonic seconds), status.
StrictRecord = tuple[str, float, float, int]


class GcraSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float = Field(gt=0)
    burst: int = Field(default=1, ge=1)


class StrictRule(BaseModel):
    """What the layer enforces on one provider (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: int | None = Field(default=None, ge=1)
    gcra: GcraSpec | None = None
    retry_after: Literal["ceil", "exact", "none"] = "ceil"
    fault_503: float = Field(default=0.0, ge=0.0, le=1.0)
    fault_503_delay_s: tuple[float, float] = (0.0, 0.0)


@dataclass
class _Provider:
    rule: StrictRule
    gcra: StrictGcra | None = None
    cap: StrictConcurrency | None = None

    @classmethod
    def of(cls, rule: StrictRule) -> _Provider:
        return cls(
            rule,
            StrictGcra(rule.gcra.rate, rule.gcra.burst) if rule.gcra else None,
            StrictConcurrency(rule.concurrency) if rule.concurrency else None,
        )


@dataclass
class StrictLimits:
    """ASGI middleware: enforce :class:`StrictRule`\\ s in front of ``app``."""

    app: ASGIApp
    max_records: int = 500_000
    seed: int = 0
    providers: dict[str, _Provider] = field(default_factory=dict)
    records: deque[StrictRecord] = field(init=False)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.records = deque(maxlen=self.max_records)
        self.rng = random.Random(self.seed)

    def configure(self, rules: dict[str, StrictRule]) -> None:
        self.providers = {name: _Provider.of(rule) for name, rule in rules.items()}

    def reset(self) -> None:
        self.providers = {name: _Provider.of(p.rule) for name, p in self.providers.items()}
        self.records.clear()
        self.rng = random.Random(self.seed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith("/_strict/"):
            await self._admin(scope, receive, send)
            return
        name = path.split("/", 2)[1] if path.count("/") >= 2 else ""
        provider = self.providers.get(name)
        if provider is None:
            await self.app(scope, receive, send)
            return
        await self._limited(name, provider, scope, receive, send)

    async def _limited(
        self, name: str, provider: _Provider, scope: Scope, receive: Receive, send: Send
    ) -> None:
        arrived = time.monotonic()
        rule = provider.rule
        if provider.cap is not None and not provider.cap.try_acquire():
            self.records.append((name, arrived, arrived, 429))
            await _reply(send, 429, {"error": "too many concurrent requests"}, {})
            return
        held = provider.cap is not None
        try:
            if provider.gcra is not None:
                wait = provider.gcra.try_admit(arrived)
                if wait is not None:
                    self.records.append((name, arrived, time.monotonic(), 429))
                    await _reply(send, 429, {"error": "rate limited"}, _retry_after(rule, wait))
                    return
            if rule.fault_503 and self.rng.random() < rule.fault_503:
                low, high = rule.fault_503_delay_s
                if high > 0:
                    await asyncio.sleep(self.rng.uniform(low, high))
                self.records.append((name, arrived, time.monotonic(), 503))
                await _reply(send, 503, {"error": "unavailable, retry later"}, {})
                return
            status = 0

            async def watch(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                await send(message)

            try:
                await self.app(scope, receive, watch)
            finally:
                self.records.append((name, arrived, time.monotonic(), status))
        finally:
            if held:
                assert provider.cap is not None
                provider.cap.release()

    async def _admin(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/_strict/calls" and method == "GET":
            query = parse_qs(scope.get("query_string", b"").decode())
            since = float(query.get("since", ["0"])[0])
            calls = [
                {"provider": p, "start": s, "end": e, "status": c}
                for p, s, e, c in self.records
                if s > since
            ]
            await _reply(send, 200, {"calls": calls, "now": time.monotonic()}, {})
            return
        if path == "/_strict/reset" and method == "POST":
            self.reset()
            await _reply(send, 200, {"ok": True}, {})
            return
        if path == "/_strict/config" and method == "POST":
            body = await _body(receive)
            try:
                data = json.loads(body or b"{}")
                rules = {
                    name: StrictRule.model_validate(rule)
                    for name, rule in dict(data.get("providers", {})).items()
                }
            except (ValueError, TypeError, AttributeError, ValidationError) as err:
                await _reply(send, 422, {"error": f"invalid strict config: {err}"}, {})
                return
            self.configure(rules)
            await _reply(send, 200, {n: r.model_dump() for n, r in rules.items()}, {})
            return
        await _reply(send, 404, {"error": f"no such admin route: {method} {path}"}, {})


def _retry_after(rule: StrictRule, wait_s: float) -> dict[str, str]:
    if rule.retry_after == "none":
        return {}
    if rule.retry_after == "exact":
        return {"retry-after": f"{max(0.001, wait_s):.3f}"}
    return {"retry-after": str(max(1, int(-(-wait_s // 1))))}


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _reply(send: Send, status: int, payload: Any, headers: dict[str, str]) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class StrictProviderServerProcess(ProviderServerProcess):
    """The provider server behind :class:`StrictLimits`, in a subprocess."""

    def command(self) -> list[str]:
        command = super().command()
        return [command[0], "-m", "playline.provider_server.strict", *command[3:]]

    def strict_configure(self, rules: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Replace every provider's strict rule (and reset the limits' state)."""
        result: dict[str, Any] = self._admin("POST", "/_strict/config", json={"providers": rules})
        return result

    def strict_reset(self) -> None:
        self._admin("POST", "/_strict/reset")

    def strict_calls(self, since: float = 0.0) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._admin("GET", f"/_strict/calls?since={since}")["calls"]
        return result


def main(argv: list[str] | None = None) -> int:
    """``python -m playline.provider_server.strict``: the server behind the strict layer."""
    from playline.provider_server.__main__ import serve

    return serve(argv, wrap=StrictLimits)


if __name__ == "__main__":
    sys.exit(main())
