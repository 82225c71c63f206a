"""Errors a provider answers with a 200: a field of the body that says the call failed.

Some providers put their errors in a successful answer: NeverBounce's ``status`` is
``throttle_triggered`` when it rate-limits (``auth_failure``, ``general_failure`` ...
otherwise), Findymail's verifier and ZeroBounce answer ``{"error": "..."}`` when the
credits are gone or the key is bad, MillionVerifier's ``result`` is ``error``. Read as
answers, these would be stored as misses (and cached, and maybe billed); a tool's
``error_field`` names the field, and which of its values are which of playline's
error kinds, so they are classified like the HTTP statuses they stand for:

==================  ======================================  ===========================
kind                raised as                               like
==================  ======================================  ===========================
``rate_limited``    ``ProviderRateLimited`` (paced, retried) a 429
``transient``       ``ProviderTransientError`` (retried)     a 503: not processed
``rejected``        ``ProviderRejected`` (not retried)       a 4xx: bad key, no credits
==================  ======================================  ===========================

None of them is charged, as none of those providers bills an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import model_validator

from playline.errors import (
    ProviderError,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTransientError,
)
from playline.freshness import dig, is_present
from playline.spec_model import SpecModel

__all__ = ["ErrorFieldSpec", "ErrorKind", "answer_error"]

ErrorKind = Literal["rate_limited", "transient", "rejected"]

#: How much of a provider's error message an error quotes.
MESSAGE_CHARS = 300


class ErrorFieldSpec(SpecModel):
    """Where a 200 answer says the call failed, and what each value means.

    ``ok`` lists the values that mean the call succeeded; ``when`` maps values of ``field``
    to an error kind; ``any`` is the kind of any other present value (a value is present
    unless it is null, ``""``, ``[]`` or ``{}``; an absent field is an answer). A
    string ``error_field = "error"`` is short for ``{ field = "error", any = "rejected" }``.
    """

    field: str
    """where the answer says it failed (a dotted path)"""
    ok: tuple[str, ...] = ()
    """values of `field` that mean the call succeeded (NeverBounce's `"success"`), whatever `any`
    says"""
    when: dict[str, ErrorKind] = {}
    """values of `field` that mean an error, and which: "rate_limited" (retried after a pause, like
    a 429), "transient" (retried, like a 503) or "rejected" (not retried, like a 4xx: a bad key, no
    credits)"""
    any: ErrorKind | None = None
    """the kind of any other present value of `field` (unset: only the values in `when` are
    errors)"""
    message: str | None = None
    """where the answer gives the error's message, quoted in the error (its first 300 characters)"""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"field": data, "any": "rejected"} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _says_something(self) -> ErrorFieldSpec:
        if not self.when and self.any is None:
            raise ValueError("error_field needs `when` (values that are errors) or `any`")
        return self

    def kind_of(self, answer: Any) -> ErrorKind | None:
        """The error kind ``answer`` amounts to (``None``: it is a real answer)."""
        value = dig(answer, self.field)
        if not is_present(value) or isinstance(value, Mapping | list):
            return None if not is_present(value) else self.any
        key = str(value).lower() if isinstance(value, bool) else str(value)
        if key in self.ok:
            return None
        if key in self.when:
            return self.when[key]
        return self.any


def answer_error(
    spec: ErrorFieldSpec, answer: Any, *, tool_id: str, provider: str, status: int
) -> ProviderError | None:
    """The typed error a 2xx ``answer`` stands for, or ``None`` when it is an answer."""
    kind = spec.kind_of(answer)
    if kind is None:
        return None
    value = dig(answer, spec.field)
    said = dig(answer, spec.message) if spec.message else None
    detail = f"{spec.field} = {value!r}" + (f": {said}" if is_present(said) else "")
    message = f"{tool_id}: {provider} answered {status} with an error ({detail})"
    message = message[: len(tool_id) + len(provider) + 40 + MESSAGE_CHARS]
    if kind == "rate_limited":
        return ProviderRateLimited(message, tool_id=tool_id, status=status)
    if kind == "transient":
        return ProviderTransientError(message, tool_id=tool_id, status=status)
    return ProviderRejected(message, tool_id=tool_id, status=status)
