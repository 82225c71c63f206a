"""Webhook signatures: the HMAC schemes a catalog names, the header forms accepted, the
constant-time comparison, and the secret read from the variable the catalog names."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from playline.calls.catalog import WebhookSpec
from playline.webhook.verify import (
    WebhookSecretMissing,
    sign,
    signature_matches,
    signing_secret,
)

SECRET = b"s3cret-signing-key"
BODY = b'{"id":"job-1","status":"FINISHED","datas":[{"email":"a@b.co"}]}'


@pytest.mark.parametrize(
    ("algorithm", "digest"), [("hmac-sha1", hashlib.sha1), ("hmac-sha256", hashlib.sha256)]
)
def test_the_signature_is_the_hex_hmac_of_the_raw_body(algorithm: str, digest: Any) -> None:
    expected = hmac.new(SECRET, BODY, digest).hexdigest()
    assert sign(algorithm, SECRET, BODY) == expected
    assert signature_matches(algorithm, SECRET, BODY, expected)


@pytest.mark.parametrize("algorithm", ["hmac-sha1", "hmac-sha256"])
def test_upper_case_spaces_and_an_algorithm_prefix_are_accepted(algorithm: str) -> None:
    good = sign(algorithm, SECRET, BODY)
    name = algorithm.removeprefix("hmac-")
    for form in (good.upper(), f"  {good}\n", f"{name}={good}", f"{name.upper()}={good}"):
        assert signature_matches(algorithm, SECRET, BODY, form), form


def test_a_wrong_or_missing_signature_does_not_match() -> None:
    good = sign("hmac-sha256", SECRET, BODY)
    refused = [
        None,  # header missing
        "",
        "   ",
        sign("hmac-sha256", b"another secret", BODY),
        sign("hmac-sha256", SECRET, BODY + b" "),  # the body re-serialised is another body
        sign("hmac-sha1", SECRET, BODY),  # another scheme's digest
        good[:-1],  # truncated
        good + "0",
        f"sha1={good}",  # another algorithm's prefix
        "zz" + good[2:],  # not hex
        "é" * len(good),  # not ASCII
    ]
    for given in refused:
        assert not signature_matches("hmac-sha256", SECRET, BODY, given), given


def test_the_comparison_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)  # as verify calls it
    good = sign("hmac-sha1", SECRET, BODY)
    assert signature_matches("hmac-sha1", SECRET, BODY, good)
    assert not signature_matches("hmac-sha1", SECRET, BODY, "0" * len(good))
    assert not signature_matches("hmac-sha1", SECRET, BODY, "abc")
    assert len(calls) == 3
    assert all(b == good.encode() for _, b in calls)


def test_an_unknown_scheme_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown webhook signature 'hmac-md5'"):
        sign("hmac-md5", SECRET, BODY)


def test_the_secret_comes_from_the_variable_the_catalog_names() -> None:
    spec = WebhookSpec(
        url_field="webhook_url",
        signature="hmac-sha1",
        signature_header="X-Signature",
        secret_env="ACME_WEBHOOK_SECRET",
    )
    assert signing_secret(spec, {"ACME_WEBHOOK_SECRET": "abc"}) == b"abc"
    for environ in ({}, {"ACME_WEBHOOK_SECRET": ""}):
        with pytest.raises(WebhookSecretMissing) as caught:
            signing_secret(spec, environ)
        assert "$ACME_WEBHOOK_SECRET" in str(caught.value)
        assert "\n" not in str(caught.value)


def test_an_unsigned_tool_needs_no_secret() -> None:
    assert signing_secret(WebhookSpec(url_field="callback"), {}) is None
