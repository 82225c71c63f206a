"""The contract files (``tests/contracts/<provider>.toml``, see FORMAT.md) as models.

A contract is what a provider's own documents say: the request an endpoint takes and
the example answers it gives. It is written from those documents, never from the
preset; the tests hold each preset to it.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from playline.calls.catalog import Catalog, ProviderSpec, ToolSpec, load_preset, preset_names

HERE = Path(__file__).resolve().parent

Outcome = Literal["hit", "no_match", "rate_limited", "rejected", "transient", "job_failed"]
JsonType = Literal["str", "int", "float", "bool", "list", "dict"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Auth(_Strict):
    """Where the documented key goes: a header (with an optional scheme) or a query key."""

    header: str | None = None
    scheme: str | None = None
    query: str | None = None

    @model_validator(mode="after")
    def _one_place(self) -> Auth:
        if (self.header is None) == (self.query is None):
            raise ValueError("auth names exactly one of header or query")
        return self


class Shape(_Strict):
    """The keys a request (its query, or its JSON body's top level) must and may have."""

    query: list[str] = Field(default_factory=list)
    json_: list[str] = Field(default_factory=list, alias="json")
    optional: list[str] = Field(default_factory=list)
    types: dict[str, JsonType] = Field(default_factory=dict)


class Items(_Strict):
    """A request carrying a list of records (a bulk endpoint, a job's submit)."""

    source: str | None = None
    items_field: str | None = None
    max_items: int = Field(default=1, ge=1)
    item: list[str] = Field(default_factory=list)
    item_optional: list[str] = Field(default_factory=list)
    json_: list[str] = Field(default_factory=list, alias="json")
    optional: list[str] = Field(default_factory=list)
    max_item_bytes: int | None = Field(default=None, ge=1)


class Batch(Items):
    method: Literal["GET", "POST"] = "POST"
    path: str


class Job(Items):
    status_method: Literal["GET", "POST"] = "GET"
    status_path: str
    status_request: Shape = Field(default_factory=Shape)
    status_id_field: str | None = None
    unknown_job: Literal["running", "error"] | None = None

    @model_validator(mode="after")
    def _has_job_id(self) -> Job:
        if ("{job_id}" in self.status_path) == (self.status_id_field is not None):
            raise ValueError(
                "the job id goes in job.status_path ({job_id}) or in a POST status body's "
                "job.status_id_field, exactly one"
            )
        if self.status_id_field is not None and self.status_method != "POST":
            raise ValueError("job.status_id_field needs status_method = POST")
        return self


class Response(_Strict):
    status: int
    headers: dict[str, str] = Field(default_factory=dict)
    body: str


class Answer(_Strict):
    """One documented answer, and what playline must make of it."""

    source: str | None = None
    status: int | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None
    submit: Response | None = None
    poll: list[Response] = Field(default_factory=list)
    inputs: list[dict[str, Any]] | None = None
    outcome: Outcome
    expect: dict[str, Any] | list[dict[str, Any]] = Field(default_factory=dict)
    expect_missing: list[str] | list[list[str]] = Field(default_factory=list)
    credits: float | None = None
    max_wait_s: float | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Answer:
        direct = self.status is not None and self.body is not None
        if direct == (self.submit is not None):
            raise ValueError("an answer has status and body, or (a job tool's) submit")
        return self

    def response(self) -> Response:
        assert self.status is not None and self.body is not None
        return Response(status=self.status, headers=self.headers, body=self.body)

    def expected(self, count: int) -> list[tuple[dict[str, Any], list[str]]]:
        """Per input: the getter values to read, and the getters that must read None."""
        expect = self.expect if isinstance(self.expect, list) else [self.expect]
        expect = expect + [{}] * (count - len(expect))
        missing: list[list[str]]
        if self.expect_missing and isinstance(self.expect_missing[0], list):
            missing = [list(m) for m in self.expect_missing]  # type: ignore[arg-type]
        else:
            missing = [list(self.expect_missing)] + [[] for _ in range(count - 1)]  # type: ignore[arg-type]
        assert len(expect) == count and len(missing) == count, "one expect per input"
        return list(zip(expect, missing, strict=True))


class ToolContract(_Strict):
    source: str
    method: Literal["GET", "POST"]
    path: str
    auth: Auth
    sample_input: dict[str, Any]
    request: Shape | None = None
    batch: Batch | None = None
    job: Job | None = None
    answers: dict[str, Answer]

    @model_validator(mode="after")
    def _complete(self) -> ToolContract:
        if self.request is None and self.batch is None and self.job is None:
            raise ValueError("a tool contract needs request, batch or job")
        if not any(a.outcome == "hit" for a in self.answers.values()):
            raise ValueError("a tool contract needs at least one answer with outcome 'hit'")
        for name, answer in self.answers.items():
            if (answer.submit is not None) != (self.job is not None):
                raise ValueError(f"answer {name!r}: job tools answer with submit/poll, others not")
        return self

    @property
    def kind(self) -> Literal["single", "batch", "job"]:
        return "batch" if self.batch else "job" if self.job else "single"


class BalanceContract(_Strict):
    """A provider's documented balance (or usage) endpoint and its example answer."""

    source: str
    method: Literal["GET", "POST"] = "GET"
    path: str
    auth: Auth
    answer: Response
    #: the figure the preset's ``balance`` must read from the answer
    value: float


class Contract(_Strict):
    provider: str
    source: str
    base_url: str
    tools: dict[str, ToolContract]
    balance: BalanceContract | None = None


@cache
def contracts() -> dict[str, Contract]:
    """Every contract file, by its name (the preset's: ``<preset>.toml``)."""
    found: dict[str, Contract] = {}
    for path in sorted(HERE.glob("*.toml")):
        found[path.stem] = Contract.model_validate(tomllib.loads(path.read_text()))
    return found


def contract_of(tool_id: str) -> Contract:
    """The contract (file) documenting ``tool_id``."""
    for contract in contracts().values():
        if tool_id in contract.tools:
            return contract
    raise KeyError(f"no contract documents tool {tool_id!r}")


def tool_contracts() -> dict[str, tuple[str, ToolContract]]:
    """Every contracted tool: its provider (the catalog's name) and its contract."""
    found: dict[str, tuple[str, ToolContract]] = {}
    for contract in contracts().values():
        for tool_id, tool in contract.tools.items():
            assert tool_id not in found, f"two contracts document tool {tool_id!r}"
            found[tool_id] = (contract.provider, tool)
    return found


@cache
def preset_catalog() -> Catalog:
    """A catalog including every shipped preset, as a user's would."""
    return Catalog.model_validate({"include": preset_names()})


def preset_tools() -> dict[str, tuple[str, ToolSpec, ProviderSpec]]:
    """Every tool of every preset: the preset it is in, its spec and its provider's."""
    catalog = preset_catalog()
    tools: dict[str, tuple[str, ToolSpec, ProviderSpec]] = {}
    for name in preset_names():
        for tool_id in load_preset(name).get("tools", {}):
            tool = catalog.tools[tool_id]
            tools[tool_id] = (name, tool, catalog.providers[tool.provider])
    return tools


def cases() -> list[tuple[str, str]]:
    """Every (tool, answer) pair the contracts document, for parametrized tests."""
    return [
        (tool_id, answer)
        for tool_id, (_, tool) in sorted(tool_contracts().items())
        for answer in tool.answers
    ]
