"""The AES-GCM payload codec: key format, round trips, rotation, one-line errors, the
plugin's keys from the environment, and the codec server's host and exposure rules."""

from __future__ import annotations

import base64
import os

import pytest
from temporalio.api.common.v1 import Payload

from playline.cli.codec_server import allowed_hosts, check_exposure
from playline.codec import ENCODING, KEY_ID, AesGcmCodec, CodecError, parse_codec_keys
from playline.config import Settings
from playline.errors import PlaylineError
from playline.plugin import PlaylinePlugin


def b64key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def plain(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=text.encode())


def test_the_key_spec_is_ordered_ids_with_base64_keys() -> None:
    a, b = b64key(), b64key()
    keys = parse_codec_keys(f" new:{a} , old:{b},")
    assert list(keys) == ["new", "old"]
    assert keys["new"] == base64.b64decode(a)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("", "holds no key"),
        ("nokey", "has no key id"),
        (":QUJD", "has no key id"),
        ("k1:not base64!", "key 'k1' is not base64"),
        ("k1:" + base64.b64encode(b"short").decode(), "key 'k1' is 5 bytes; AES-256 needs 32"),
    ],
)
def test_a_malformed_key_spec_is_a_one_line_error(spec: str, problem: str) -> None:
    with pytest.raises(CodecError, match=problem) as raised:
        parse_codec_keys(spec)
    assert "\n" not in str(raised.value)


def test_a_key_id_given_twice_is_rejected_and_no_key_is_ever_echoed() -> None:
    key = base64.b64encode(bytes(range(32))).decode()  # "AAECAwQF..."
    with pytest.raises(CodecError, match="'k1' appears twice") as raised:
        parse_codec_keys(f"k1:{key},k1:{key}")
    assert key not in str(raised.value)
    with pytest.raises(CodecError, match="entry 2 has no key id") as raised:
        parse_codec_keys(f"k1:{key},{key}")
    assert "AAECAwQF" not in str(raised.value)


async def test_payloads_round_trip_as_ciphertext_naming_their_key() -> None:
    codec = AesGcmCodec.from_spec(f"k1:{b64key()}")
    original = plain('{"email": "ada@example.com"}')
    [sealed] = await codec.encode([original])
    assert sealed.metadata["encoding"] == ENCODING
    assert sealed.metadata[KEY_ID] == b"k1"
    assert b"ada@example.com" not in sealed.data and b"json/plain" not in sealed.data
    [again] = await codec.encode([original])
    assert again.data != sealed.data  # a fresh nonce each time
    assert await codec.decode([sealed, again]) == [original, original]


async def test_rotation_encrypts_with_the_first_key_and_decrypts_with_any() -> None:
    old_key, new_key = b64key(), b64key()
    before = AesGcmCodec.from_spec(f"old:{old_key}")
    after = AesGcmCodec.from_spec(f"new:{new_key},old:{old_key}")
    [written_before] = await before.encode([plain("1")])
    [written_after] = await after.encode([plain("2")])
    assert written_after.metadata[KEY_ID] == b"new"
    assert await after.decode([written_before, written_after]) == [plain("1"), plain("2")]


async def test_unencrypted_payloads_pass_through_decoding() -> None:
    codec = AesGcmCodec.from_spec(f"k1:{b64key()}")
    assert await codec.decode([plain("written before encryption")]) == [
        plain("written before encryption")
    ]


async def test_an_unknown_key_id_is_a_clear_error_naming_it() -> None:
    [sealed] = await AesGcmCodec.from_spec(f"gone:{b64key()}").encode([plain("x")])
    with pytest.raises(CodecError, match=r"key id 'gone', which PLAYLINE_CODEC_KEYS does not hold"):
        await AesGcmCodec.from_spec(f"k1:{b64key()}").decode([sealed])


async def test_a_wrong_key_or_an_altered_payload_is_a_clear_error() -> None:
    [sealed] = await AesGcmCodec.from_spec(f"k1:{b64key()}").encode([plain("x")])
    other = AesGcmCodec.from_spec(f"k1:{b64key()}")
    with pytest.raises(CodecError, match=r"key id 'k1' does not decrypt .* the key is wrong"):
        await other.decode([sealed])
    # Passing the ciphertext off under another key id fails too (the id is authenticated).
    key = b64key()
    codec = AesGcmCodec.from_spec(f"a:{key},b:{key}")
    [sealed] = await codec.encode([plain("x")])
    sealed.metadata[KEY_ID] = b"b"
    with pytest.raises(CodecError, match="key id 'b' does not decrypt"):
        await codec.decode([sealed])


def test_the_plugin_encrypts_when_settings_hold_keys_and_not_otherwise() -> None:
    assert PlaylinePlugin(settings=Settings()).codec is None
    with_keys = PlaylinePlugin(settings=Settings(codec_keys=f"k1:{b64key()}"))
    assert isinstance(with_keys.codec, AesGcmCodec) and with_keys.codec.key_ids == ["k1"]
    assert "codec_keys" not in repr(Settings(codec_keys="k1:secret"))
    assert Settings.from_env({"PLAYLINE_CODEC_KEYS": "k1:x"}).codec_keys == "k1:x"


def test_a_bare_plugin_reads_the_codec_keys_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("PLAYLINE_CODEC_KEYS", f"env:{b64key()}")
    bare = PlaylinePlugin()
    assert isinstance(bare.codec, AesGcmCodec) and bare.codec.key_ids == ["env"]
    # An explicit codec, or explicit settings, still win over the environment.
    mine = AesGcmCodec.from_spec(f"mine:{b64key()}")
    assert PlaylinePlugin(codec=mine).codec is mine
    assert PlaylinePlugin(settings=Settings()).codec is None
    monkeypatch.delenv("PLAYLINE_CODEC_KEYS")
    assert PlaylinePlugin().codec is None


@pytest.mark.parametrize(
    ("bound", "extra", "expected"),
    [
        ("127.0.0.1", [], ["127.0.0.1", "localhost", "::1", "[::1]"]),
        (
            "0.0.0.0",
            ["Codec.Internal"],
            ["127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0", "codec.internal"],
        ),
        ("fd00::5", [], ["127.0.0.1", "localhost", "::1", "[::1]", "fd00::5", "[fd00::5]"]),
    ],
)
def test_the_codec_server_answers_loopback_its_bound_host_and_the_allowed_ones(
    bound: str, extra: list[str], expected: list[str]
) -> None:
    assert allowed_hosts(bound, extra) == expected


def test_the_codec_server_needs_a_token_or_an_explicit_override_beyond_loopback() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        check_exposure(host, None)
    for host in ("0.0.0.0", "::", "192.168.1.5", "codec.example.com"):
        with pytest.raises(PlaylineError, match=f"refusing to serve decryption on {host}"):
            check_exposure(host, None)
        check_exposure(host, "a-token")
        check_exposure(host, None, insecure_no_token=True)
