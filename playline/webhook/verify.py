"""Checking a webhook delivery's signature: pure functions, no I/O.

A provider that signs its deliveries (a tool's ``job.webhook.signature``) sends the
hex HMAC of the *raw* body, keyed with a secret both sides hold, in a header
(``signature_header``). playline reads the secret from the environment variable the
catalog names (``secret_env``): the catalog holds only the variable's name, never the
secret. The comparison is :func:`hmac.compare_digest` (constant time), so a forger
learns nothing from how long a wrong guess took to be refused.

Accepted header forms: the hex digest, in either case, optionally prefixed with the
algorithm (``sha256=<hex>``, as GitHub-style senders write it) and surrounded by
whitespace. Anything else (empty, not hex, not ASCII, another algorithm's prefix) is
simply a mismatch.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from typing import Any

from playline.calls.catalog import WebhookSpec
from playline.errors import PlaylineError

__all__ = [
    "ALGORITHMS",
    "WebhookSecretMissing",
    "sign",
    "signature_matches",
    "signing_secret",
]

#: The signature schemes a catalog may name, and their hash functions.
ALGORITHMS: dict[str, Callable[..., Any]] = {
    "hmac-sha1": hashlib.sha1,
    "hmac-sha256": hashlib.sha256,
}


class WebhookSecretMissing(PlaylineError):
    """A tool's deliveries are signed but the receiver has no secret to check them
    with (its ``secret_env`` variable is unset or empty)."""


def signing_secret(spec: WebhookSpec, environ: Mapping[str, str]) -> bytes | None:
    """The secret that checks ``spec``'s signatures; ``None`` when it signs nothing.

    Raises :class:`WebhookSecretMissing`, naming the variable (never a value), when
    the deliveries are signed and the variable is unset or empty.
    """
    if spec.signature == "none":
        return None
    name = spec.secret_env or ""
    value = environ.get(name, "") if name else ""
    if not value:
        raise WebhookSecretMissing(
            f"webhook signatures ({spec.signature}) need the secret in ${name or '?'}, "
            "which is not set in the receiver's environment"
        )
    return value.encode()


def sign(algorithm: str, secret: bytes, body: bytes) -> str:
    """The hex HMAC of ``body`` with ``secret`` (``algorithm``: a key of
    :data:`ALGORITHMS`), as a signing provider computes it."""
    try:
        digest = ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown webhook signature {algorithm!r}; use one of {', '.join(ALGORITHMS)}"
        ) from None
    return hmac.new(secret, body, digest).hexdigest()


def signature_matches(algorithm: str, secret: bytes, body: bytes, given: str | None) -> bool:
    """Whether ``given`` (the header's value; ``None``: absent) is ``body``'s signature.

    The comparison is constant time over the expected digest's length; a missing,
    empty or malformed value is ``False``.
    """
    expected = sign(algorithm, secret, body).encode("ascii")
    if not given:
        return False
    value = given.strip()
    prefix = algorithm.removeprefix("hmac-") + "="
    if value[: len(prefix)].lower() == prefix:
        value = value[len(prefix) :]
    try:
        presented = value.lower().encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(presented, expected)
