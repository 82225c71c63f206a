"""A contract server: answers each provider's documented examples and checks each request.

It serves every contracted provider under ``/<provider>`` on one loopback port. A test
tells it which documented answer a provider gives (:meth:`ContractServer.answer`);
every request that comes in is checked against the tool's contract (method, path,
auth, query or body shape, batch size, record size) and each departure is recorded
in :attr:`ContractServer.violations`, which the tests assert is empty. Test code only:
the project's own provider server (``playline.provider_server``) plays providers for
load and fault tests; this one plays the providers' *documents*.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.contracts.contract import (
    Answer,
    BalanceContract,
    Items,
    Response,
    Shape,
    ToolContract,
    contracts,
)

#: The API key the harness gives every provider: ``contract-key-<provider>``.
KEY_PREFIX = "contract-key-"
_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "list": list,
    "dict": dict,
}


@dataclass
class _Scenario:
    """What one provider answers now: one tool's documented answer."""

    tool_id: str
    tool: ToolContract
    answer: Answer
    polls: int = 0
    job_ids: set[str] = field(default_factory=set)
    requests: list[dict[str, Any]] = field(default_factory=list)


class ContractServer:
    """The documented providers on a loopback port (a thread of this process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scenarios: dict[str, dict[str, _Scenario]] = {}  # provider -> tool -> answer
        self.violations: list[str] = []
        #: the providers whose documented balance endpoint was read, in order
        self.balance_reads: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_POST(self) -> None:
                server._handle(self, "POST")

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests report what matters."""

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def base_url(self, provider: str) -> str:
        return f"{self.url}/{provider}"

    def start(self) -> ContractServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def answer(self, tool_id: str, answer_name: str, *, alone: bool = True) -> None:
        """From now on, ``tool_id`` answers its documented ``answer_name``; ``alone``: its
        provider's other tools answer nothing (every request is judged as this tool's)."""
        for contract in contracts().values():
            provider = contract.provider
            if tool_id in contract.tools:
                tool = contract.tools[tool_id]
                scenario = _Scenario(tool_id, tool, tool.answers[answer_name])
                with self._lock:
                    tools = {} if alone else self._scenarios.get(provider, {})
                    self._scenarios[provider] = {**tools, tool_id: scenario}
                return
        raise KeyError(f"no contract documents tool {tool_id!r}")

    def requests(self, provider: str) -> list[dict[str, Any]]:
        """The requests ``provider`` received under its current answers."""
        with self._lock:
            scenarios = self._scenarios.get(provider, {}).values()
            return [r for scenario in scenarios for r in scenario.requests]

    def _scenario(self, provider: str, method: str, path: str) -> _Scenario | None:
        """The answer a request is judged against: its tool's, by endpoint (the only
        tool answering for the provider, whatever the endpoint)."""
        scenarios = list(self._scenarios.get(provider, {}).values())
        if len(scenarios) == 1:
            return scenarios[0]
        for scenario in scenarios:
            if _endpoint_of(scenario.tool, method, path):
                return scenario
        return None

    # -- one request ------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(handler.path)
        provider, _, rest = split.path.lstrip("/").partition("/")
        path = "/" + rest
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        with self._lock:
            balance = _balance_of(provider, method, path)
            scenario = self._scenario(provider, method, path)
            if balance is not None:
                problems = _auth_problems(balance, provider, dict(handler.headers), query)
                self.violations += [f"{provider} balance {method} {path}: {p}" for p in problems]
                self.balance_reads.append(provider)
                response = balance.answer
            elif scenario is None:
                self.violations.append(f"{method} {split.path}: no documented endpoint answers")
                response = Response(status=404, body='{"detail": "Not Found"}')
            else:
                problems, response = self._judge(
                    provider, scenario, method, path, query, dict(handler.headers), raw
                )
                scenario.requests.append(
                    {"method": method, "path": path, "query": query, "body": raw.decode()}
                )
                self.violations += [f"{scenario.tool_id} {method} {path}: {p}" for p in problems]
        body = response.body.strip().encode()
        handler.send_response(response.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        for name, value in response.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)

    def _judge(
        self,
        provider: str,
        scenario: _Scenario,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        raw: bytes,
    ) -> tuple[list[str], Response]:
        """The request's departures from the contract, and the documented answer."""
        tool, answer = scenario.tool, scenario.answer
        problems = _auth_problems(tool, provider, headers, query)
        auth_query = {tool.auth.query} if tool.auth.query else set()
        query = {k: v for k, v in query.items() if k not in auth_query}
        if tool.job is not None:
            status_re = re.escape(tool.job.status_path).replace(r"\{job_id\}", "([^/]+)")
            polled = re.fullmatch(status_re, path)
            if polled and method == tool.job.status_method:
                problems += _shape_problems(query, tool.job.status_request, in_query=True)
                if tool.job.status_id_field is not None:
                    # The id travels in the status request's body (Icypeas' `id`).
                    body = _json(raw, problems)
                    problems += _shape_problems(body, tool.job.status_request, in_query=False)
                    polled_id = str(body.get(tool.job.status_id_field))
                else:
                    polled_id = polled.group(1)
                    if raw:
                        problems.append("a status poll with a body")
                if polled_id not in scenario.job_ids:
                    problems.append(f"polls job {polled_id!r}, which no submit answered")
                polls = answer.poll or [Response(status=404, body='{"detail": "Not Found"}')]
                response = polls[min(scenario.polls, len(polls) - 1)]
                scenario.polls += 1
                return problems, response
            problems += _method_path(method, path, tool.method, tool.path)
            problems += _items_problems(_json(raw, problems), tool.job)
            assert answer.submit is not None
            scenario.job_ids.update(_strings(json.loads(answer.submit.body or "null")))
            return problems, answer.submit
        if tool.batch is not None:
            problems += _method_path(method, path, tool.batch.method, tool.batch.path)
            problems += _items_problems(_json(raw, problems), tool.batch)
            return problems, answer.response()
        assert tool.request is not None
        problems += _method_path(method, path, tool.method, tool.path)
        if method == "GET":
            problems += _shape_problems(query, tool.request, in_query=True)
            if raw:
                problems.append("a GET with a body")
        else:
            problems += _shape_problems(_json(raw, problems), tool.request, in_query=False)
        return problems, answer.response()


def _endpoint_of(tool: ToolContract, method: str, path: str) -> bool:
    """Whether ``method path`` is one of the tool's documented endpoints."""
    if tool.job is not None:
        status_re = re.escape(tool.job.status_path).replace(r"\{job_id\}", "[^/]+")
        if method == tool.job.status_method and re.fullmatch(status_re, path):
            return True
    if tool.batch is not None:
        return (method, path) == (tool.batch.method, tool.batch.path)
    return (method, path) == (tool.method, tool.path)


def _strings(value: Any) -> set[str]:
    """Every string and number in a JSON value: the ids a submit's answer gives."""
    if isinstance(value, dict):
        return set().union(*(_strings(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value))
    if isinstance(value, str | int) and not isinstance(value, bool):
        return {str(value)}
    return set()


def _balance_of(provider: str, method: str, path: str) -> BalanceContract | None:
    """The provider's documented balance endpoint, when ``method path`` is it."""
    for contract in contracts().values():
        balance = contract.balance
        if contract.provider != provider or balance is None:
            continue
        if (balance.method, balance.path) == (method, path):
            return balance
    return None


def _auth_problems(
    tool: ToolContract | BalanceContract,
    provider: str,
    headers: dict[str, str],
    query: dict[str, str],
) -> list[str]:
    key = KEY_PREFIX + provider
    if tool.auth.query is not None:
        return [] if query.get(tool.auth.query) == key else [f"no key in query {tool.auth.query!r}"]
    assert tool.auth.header is not None
    want = f"{tool.auth.scheme} {key}" if tool.auth.scheme else key
    got = {k.lower(): v for k, v in headers.items()}.get(tool.auth.header.lower())
    if got is None:
        return [f"no {tool.auth.header} header"]
    if got != want:
        return [f"{tool.auth.header} header is not {want!r} (the key, as documented)"]
    return []


def _method_path(method: str, path: str, want_method: str, want_path: str) -> list[str]:
    problems = []
    if method != want_method:
        problems.append(f"method {method}, documented {want_method}")
    if path != want_path:
        problems.append(f"path {path}, documented {want_path}")
    return problems


def _json(raw: bytes, problems: list[str]) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        problems.append("the body is not JSON")
        return {}
    if not isinstance(body, dict):
        problems.append("the body is not a JSON object")
        return {}
    return body


def _keys(got: dict[str, Any], required: list[str], optional: list[str], where: str) -> list[str]:
    problems = [f"{where} lacks {name!r}" for name in required if name not in got]
    allowed = set(required) | set(optional)
    problems += [f"{where} has {name!r}, not documented" for name in got if name not in allowed]
    return problems


def _shape_problems(got: dict[str, Any], shape: Shape, *, in_query: bool) -> list[str]:
    where = "the query" if in_query else "the body"
    required = shape.query if in_query else shape.json_
    problems = _keys(got, required, shape.optional, where)
    for name, type_name in shape.types.items():
        if name in got and not isinstance(got[name], _TYPES[type_name]):
            problems.append(f"{where}'s {name!r} is not a {type_name}")
    return problems


def _items_problems(body: dict[str, Any], spec: Items) -> list[str]:
    if spec.items_field is None:
        return _keys(body, spec.item + spec.json_, spec.item_optional + spec.optional, "the body")
    rest = {k: v for k, v in body.items() if k != spec.items_field}
    problems = _keys(rest, spec.json_, spec.optional, "the body")
    items = body.get(spec.items_field)
    if not isinstance(items, list) or not items:
        return [*problems, f"the body's {spec.items_field!r} is not a list of records"]
    if len(items) > spec.max_items:
        problems.append(f"{len(items)} records in one request, documented at most {spec.max_items}")
    for at, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append(f"record {at} is not an object")
            continue
        problems += _keys(item, spec.item, spec.item_optional, f"record {at}")
        size = len(json.dumps(item).encode())
        if spec.max_item_bytes is not None and size > spec.max_item_bytes:
            limit = spec.max_item_bytes
            problems.append(f"record {at} has {size} bytes, documented at most {limit}")
    return problems


@contextmanager
def contract_server() -> Iterator[ContractServer]:
    server = ContractServer().start()
    try:
        yield server
    finally:
        server.stop()
