"""The provider catalog: which tools exist, where they live, what they cost, how fast they may go.

A catalog is declarative (a TOML file) so that pointing playline at real providers
is an edit, not a code change. It is validated as a whole when it is loaded; a bad
catalog is rejected before any play starts.

```toml
[providers.acme]
base_url = "http://127.0.0.1:8787"
base_url_env = "ACME_URL"                 # optional override from the environment
auth = { env = "ACME_API_KEY", header = "X-Api-Key", account = "acme-prod" }  # or env = [...]
idempotency = "none"                      # "key" | "natural" | "none" (default), see below
pacing = { rps = 50, burst = 5, per_minute = 2000, per_day = 50000, max_concurrency = 16 }
key_pacing = { rps = 20, per_day = 10000 }              # each key's own budget (optional)
timeout_s = 15                                          # default HTTP timeout of its tools

[tools.email_finder]
provider = "acme"
method = "POST"
path = "/v1/email/find"
input = { first_name = "str", last_name = "str", domain = "str" }
getters = { email = "email", confidence = "confidence" }
credits = 1.0
version = "1"
batch = { path = "/v1/email/find/bulk", max_items = 25 }   # optional bulk endpoint
timeout_s = 3.0                                         # optional, overrides the provider's
```

A provider with several API keys (several accounts) lists their variables in
``auth.env``; each key is its own pacing key (``acme:key=ACME_KEY_A``) with the
``key_pacing`` budget, on top of the provider-wide ``pacing``, and the governor
spreads calls across the keys.

**Idempotency** is a contract each tool states (or inherits from its provider):

* ``"key"``: the provider de-duplicates ``Idempotency-Key`` (a repeat is answered
  from its store, not charged again);
* ``"natural"``: the provider does not charge twice for the same input ("not
  charged twice for the same contact");
* ``"none"`` (the default): every request that reaches the provider may be charged.

For ``key`` and ``natural`` tools an ambiguous outcome (sent, no definitive answer)
is re-sent like any transient failure; for ``none`` tools it never is: the receipt
becomes ``ambiguous`` and only an explicit ``retry_ambiguous`` run re-sends it.

``auth.account`` names the account the keys belong to: receipts are scoped by it
instead of by the key values, so rotating a key (or adding one) keeps them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from playline.errors import (
    CatalogError,
    InvalidToolInput,
    UnknownTool,
    format_validation_errors,
)
from playline.pacing.policy import PacingPolicy

_FIELD_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}

#: How a tool's provider treats a repeated request; see the module docstring.
Idempotency = Literal["key", "natural", "none"]
#: Tools that may be re-sent after an ambiguous outcome without paying twice.
RESEND_SAFE: frozenset[str] = frozenset({"key", "natural"})
#: The largest provider response body a call reads by default (a bulk answer included).
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class AuthSpec(BaseModel):
    """Where a provider's API key(s) come from and which header carries them.

    ``env`` names one environment variable, or several for a provider used
    with several keys (accounts).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | tuple[str, ...]
    header: str = "Authorization"
    scheme: str | None = None  # e.g. "Bearer"; None sends the bare key
    #: the account the key(s) belong to: receipts are scoped by it, so a rotated or
    #: added key keeps them (None: scoped by the key values themselves)
    account: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _check_env(self) -> AuthSpec:
        envs = self.envs
        if not envs or any(not name for name in envs) or len(set(envs)) != len(envs):
            raise ValueError("auth.env must name one variable or a list of distinct ones")
        return self

    @property
    def envs(self) -> tuple[str, ...]:
        """The variables holding the keys, in catalog order."""
        return (self.env,) if isinstance(self.env, str) else tuple(self.env)


class ProviderSpec(BaseModel):
    """One provider: its base URL, its auth and its pacing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    base_url_env: str | None = None
    auth: AuthSpec | None = None
    pacing: PacingPolicy = PacingPolicy()
    #: the budget of each API key, when ``auth.env`` lists several (or one)
    key_pacing: PacingPolicy | None = None
    timeout_s: float = Field(default=15.0, gt=0)
    #: the idempotency contract of its tools, unless a tool states its own
    idempotency: Idempotency = "none"
    #: the most bytes one response may hold; a larger one is a provider error
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1)

    def key_envs(self) -> tuple[str, ...]:
        """The variables of the keys calls are spread across (none without auth)."""
        return self.auth.envs if self.auth is not None else ()

    def resolved_base_url(self, environ: Mapping[str, str]) -> str:
        """The base URL, overridden by ``environ[base_url_env]`` when that is set."""
        if self.base_url_env and environ.get(self.base_url_env):
            return environ[self.base_url_env].rstrip("/")
        return self.base_url.rstrip("/")


class BatchSpec(BaseModel):
    """A bulk endpoint: member inputs go in ``items_field``, results come back in order.

    Claimed calls wait up to ``linger_ms`` for company, then go out in requests of
    at most ``max_items`` (see :mod:`playline.calls.bulk`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    max_items: int = Field(default=25, ge=1, le=1000)
    linger_ms: float = Field(default=20.0, ge=0, le=5000)
    items_field: str = "items"
    results_field: str = "results"


class ToolSpec(BaseModel):
    """One tool: a provider endpoint with a typed input and named value getters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    provider: str
    method: Literal["GET", "POST"] = "POST"
    path: str
    input: dict[str, str] = Field(default_factory=dict)
    getters: dict[str, str] = Field(default_factory=dict)
    credits: float = Field(default=1.0, ge=0)
    version: str = "1"
    batch: BatchSpec | None = None
    #: HTTP timeout of this tool's calls; ``None``: the provider's ``timeout_s``
    timeout_s: float | None = Field(default=None, gt=0)
    #: the idempotency contract (filled from the provider's when the tool says none)
    idempotency: Idempotency = "none"

    @property
    def resend_safe(self) -> bool:
        """Whether a request that may have been charged can be sent again for free."""
        return self.idempotency in RESEND_SAFE

    @model_validator(mode="after")
    def _check_input_types(self) -> ToolSpec:
        for name, type_name in self.input.items():
            if type_name.rstrip("?") not in _FIELD_TYPES:
                raise ValueError(
                    f"tool {self.id!r}: input field {name!r} has type {type_name!r}; "
                    f"use one of {sorted(_FIELD_TYPES)} (suffix '?' for optional)"
                )
        return self

    @cached_property
    def input_model(self) -> type[BaseModel]:
        """A pydantic model built from ``input``; unknown fields are rejected."""
        fields: dict[str, Any] = {}
        for name, type_name in self.input.items():
            py_type = _FIELD_TYPES[type_name.rstrip("?")]
            if type_name.endswith("?"):
                fields[name] = (py_type | None, None)
            else:
                fields[name] = (py_type, ...)
        model: type[BaseModel] = create_model(
            f"{self.id}_input", __config__=ConfigDict(extra="forbid"), **fields
        )
        return model

    def validate_input(self, value: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and normalise a call's input, or raise ``InvalidToolInput``."""
        if not self.input:
            return dict(value)
        try:
            return self.input_model.model_validate(dict(value)).model_dump(exclude_none=True)
        except ValidationError as err:
            problems = format_validation_errors(err.errors())
            raise InvalidToolInput(f"tool {self.id!r} got invalid input: {problems}") from None

    def get(self, result: Any, name: str) -> Any:
        """Read a named value from a result through its getter (a dotted path)."""
        path = self.getters.get(name, name)
        value = result
        for part in path.split("."):
            if isinstance(value, Mapping):
                value = value.get(part)
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return None
        return value


class Catalog(BaseModel):
    """All providers and tools a worker can call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    providers: dict[str, ProviderSpec]
    tools: dict[str, ToolSpec]

    @model_validator(mode="before")
    @classmethod
    def _fill_tool_ids(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("tools"), Mapping):
            providers = data.get("providers")
            providers = providers if isinstance(providers, Mapping) else {}
            tools = {}
            for tool_id, spec in data["tools"].items():
                if isinstance(spec, Mapping):
                    spec = {"id": tool_id, **spec}
                    provider = providers.get(spec.get("provider"))
                    if "idempotency" not in spec and isinstance(provider, Mapping):
                        spec["idempotency"] = provider.get("idempotency", "none")
                tools[tool_id] = spec
            data = {**data, "tools": tools}
        return data

    @model_validator(mode="after")
    def _check_references(self) -> Catalog:
        for tool in self.tools.values():
            if tool.provider not in self.providers:
                raise ValueError(
                    f"tool {tool.id!r} names provider {tool.provider!r}, which the catalog "
                    f"does not declare (declared: {sorted(self.providers)})"
                )
        return self

    def tool(self, tool_id: str) -> ToolSpec:
        """The tool with this id, or ``UnknownTool`` naming the ones that exist."""
        try:
            return self.tools[tool_id]
        except KeyError:
            raise UnknownTool(
                f"unknown tool {tool_id!r}; the catalog declares: {', '.join(sorted(self.tools))}"
            ) from None

    def provider_of(self, tool_id: str) -> ProviderSpec:
        return self.providers[self.tool(tool_id).provider]

    @classmethod
    def from_toml(cls, path: str | Path) -> Catalog:
        """Load and validate a catalog file; every problem is reported at once."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise CatalogError(f"catalog file {path} does not exist") from None
        except tomllib.TOMLDecodeError as err:
            raise CatalogError(f"catalog file {path} is not valid TOML: {err}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            problems = format_validation_errors(err.errors(), top="catalog")
            raise CatalogError(f"catalog file {path} is invalid: {problems}") from None

    def pacing_policies(self) -> dict[str, PacingPolicy]:
        """The governor's policies: one per provider, plus one per key of a provider
        that declares ``key_pacing`` or several keys (see :func:`key_pacing_key`)."""
        policies: dict[str, PacingPolicy] = {}
        for name, spec in self.providers.items():
            policies[name] = spec.pacing
            envs = spec.key_envs()
            if spec.key_pacing is not None or len(envs) > 1:
                for env in envs:
                    policies[key_pacing_key(name, env)] = spec.key_pacing or spec.pacing
        return policies

    def pacing_keys(self, provider: str) -> list[str]:
        """The per-key pacing keys of ``provider`` (empty: it is paced as a whole only)."""
        spec = self.providers[provider]
        envs = spec.key_envs()
        if spec.key_pacing is None and len(envs) < 2:
            return []
        return [key_pacing_key(provider, env) for env in envs]

    def secret_variables(self) -> list[str]:
        """Every environment variable that holds an API key, over all providers."""
        return sorted({env for spec in self.providers.values() for env in spec.key_envs()})


def key_pacing_key(provider: str, env: str) -> str:
    """The pacing key of one API key: the provider and the *name* of its variable.

    The name, not the key, so it is safe to log, show in ``playline limits`` and
    store in the fleet tables.
    """
    return f"{provider}:key={env}"
