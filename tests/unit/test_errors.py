"""How each error is treated is declared once, on its class."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from playline import errors


def test_non_retryable_types_come_from_the_classes() -> None:
    names = errors.non_retryable_types()
    for kind in (
        "RowFailed",
        "UnknownTool",
        "UnknownResolver",
        "InvalidToolInput",
        "InvalidPlayInput",
        "MissingApiKey",
        "CatalogError",
        "ProviderRejected",
    ):
        assert kind in names
    for kind in ("LeaseLost", "PersistenceCircuitOpen", "ProviderRateLimited", "ProviderTimeout"):
        assert kind not in names
    assert len(names) == len(set(names))


def test_chunk_fatal_errors_are_about_the_play_or_the_worker() -> None:
    import playline.pacing.fleet_store  # noqa: F401  (its error subclasses PlaylineError)

    fatal = {cls.__name__ for cls in _all(errors.PlaylineError) if cls.chunk_fatal}
    assert fatal == {
        "LeaseLost",
        "PersistenceCircuitOpen",
        "FleetPacingUnavailable",
        "MissingApiKey",
        "UnknownTool",
        "UnknownResolver",
        "SpendUnpriced",
    }


def test_root_cause_walks_the_cause_chain() -> None:
    class Failure(Exception):
        def __init__(self, cause: BaseException | None) -> None:
            super().__init__("wrapper")
            self.cause = cause

    inner = ValueError("the real reason")
    assert errors.root_cause(Failure(Failure(inner))) is inner
    assert errors.root_cause(inner) is inner


def test_validation_errors_are_one_line() -> None:
    class Model(BaseModel):
        a: int
        b: str

    with pytest.raises(ValidationError) as info:
        Model.model_validate({"a": "x"})
    assert errors.format_validation_errors(info.value.errors()) == (
        "a: Input should be a valid integer, unable to parse string as an integer; "
        "b: Field required"
    )


def _all(cls: type[errors.PlaylineError]) -> list[type[errors.PlaylineError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_all(sub))
    return found
