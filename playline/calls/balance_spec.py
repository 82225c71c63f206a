"""Where a provider says how many credits an account has left (or has used).

A run's own figures (the credits its cells and receipts record) are playline's word;
the provider's balance is the provider's. Reading it before and after a run is how
``playline runs reconcile`` checks the one against the other (see
:mod:`playline.reconcile`). A provider declares its balance endpoint in the catalog:

```toml
[providers.hunter]
balance = { path = "/v2/account", used = "data.requests.searches.used" }

[providers.fullenrich]
balance = { path = "/api/v2/account/credits", remaining = "balance" }
```

``remaining`` reads a balance that goes down as credits are spent, ``used`` a counter
that goes up; exactly one is given. The request goes to the provider's base URL with
its API key, like a tool call, and is assumed free (the providers that document one
say so); playline reads it once per run and phase, whatever retries happen.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from playline.spec_model import SpecModel

__all__ = ["BalanceSpec"]


class BalanceSpec(SpecModel):
    """A provider's balance (or usage) endpoint, read before and after each run."""

    path: str
    """the endpoint's path on the provider's base URL (sent with its API key)"""
    method: Literal["GET", "POST"] = "GET"
    """the HTTP method of the balance request"""
    remaining: str | None = None
    """where the answer holds the credits left (a dotted path): a balance that goes down as credits
    are spent (not with `used`)"""
    used: str | None = None
    """where the answer holds the credits used so far (a dotted path): a counter that goes up as
    credits are spent (not with `remaining`)"""
    source: str | None = None
    """the documentation the endpoint was written from"""

    @model_validator(mode="after")
    def _one_reading(self) -> BalanceSpec:
        if (self.remaining is None) == (self.used is None):
            raise ValueError("a balance names exactly one of 'remaining' and 'used'")
        if not self.path.startswith("/"):
            raise ValueError(f"balance path {self.path!r} must start with '/'")
        return self

    @property
    def field(self) -> str:
        """The dotted path of the figure the answer holds."""
        value = self.remaining if self.remaining is not None else self.used
        assert value is not None
        return value

    @property
    def kind(self) -> Literal["remaining", "used"]:
        """Whether the figure is what is left or what was used."""
        return "remaining" if self.remaining is not None else "used"
