"""Payload encryption: Temporal stores only ciphertext of play inputs, results and previews.

A play's input (file paths, names), its preview rows and its output may hold
personal data, and Temporal keeps every payload in workflow history. With
``PLAYLINE_CODEC_KEYS`` set, :class:`AesGcmCodec` encrypts each payload on the
client and the worker before it leaves the process, so the server (and anyone
reading its database or history exports) sees ciphertext; ``playline
codec-server`` lets the Temporal UI show the plaintext to whoever runs it.

Format of ``PLAYLINE_CODEC_KEYS``: ``kid1:<base64 of 32 bytes>,kid2:<...>``. The
first key encrypts; every key decrypts. Each encrypted payload carries the id of
its key in its metadata, so keys rotate by putting a new key first and keeping
the old ones until the histories they wrote are gone. Generate a key with
``python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"``.

An encrypted payload is AES-256-GCM over the serialized original payload, with
a random 96-bit nonce prepended and the key id as associated data (a payload
cannot be passed off under another key id). Payloads without the encrypted
encoding (written before encryption was turned on) pass through unchanged.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from playline.errors import PlaylineError

__all__ = ["ENCODING", "KEY_ID", "AesGcmCodec", "CodecError", "parse_codec_keys"]

#: The ``encoding`` metadata of an encrypted payload.
ENCODING = b"binary/encrypted"
#: The metadata entry naming the key that encrypted a payload.
KEY_ID = "encryption-key-id"
KEY_BYTES = 32
NONCE_BYTES = 12


class CodecError(PlaylineError):
    """Payload keys are malformed, or a payload cannot be decrypted with them."""


def parse_codec_keys(spec: str) -> dict[str, bytes]:
    """``kid1:<base64>,kid2:<base64>`` as ``{kid: key}`` in order (the first encrypts)."""
    keys: dict[str, bytes] = {}
    for position, item in enumerate((part.strip() for part in spec.split(",")), start=1):
        if not item:
            continue
        key_id, sep, encoded = item.partition(":")
        key_id = key_id.strip()
        if not sep or not key_id:
            # Never echo the entry: it may be key material.
            raise CodecError(
                "PLAYLINE_CODEC_KEYS must look like 'kid1:<base64 of 32 bytes>,kid2:...'; "
                f"entry {position} has no key id"
            )
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except binascii.Error:
            raise CodecError(f"PLAYLINE_CODEC_KEYS: key {key_id!r} is not base64") from None
        if len(key) != KEY_BYTES:
            raise CodecError(
                f"PLAYLINE_CODEC_KEYS: key {key_id!r} is {len(key)} bytes; AES-256 needs "
                f"{KEY_BYTES} (base64 of 32 random bytes)"
            )
        if key_id in keys:
            raise CodecError(f"PLAYLINE_CODEC_KEYS: key id {key_id!r} appears twice")
        keys[key_id] = key
    if not keys:
        raise CodecError("PLAYLINE_CODEC_KEYS is set but holds no key")
    return keys


class AesGcmCodec(PayloadCodec):
    """Encrypts payloads with the first key and decrypts with any key, by key id.

    Args:
        keys: ``{key id: 32-byte key}``, in order; the first one encrypts.
    """

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not keys:
            raise CodecError("a payload codec needs at least one key")
        for key_id, key in keys.items():
            if len(key) != KEY_BYTES:
                raise CodecError(f"key {key_id!r} is {len(key)} bytes; AES-256 needs 32")
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self.key_id = next(iter(keys))

    @classmethod
    def from_spec(cls, spec: str) -> AesGcmCodec:
        """A codec from ``PLAYLINE_CODEC_KEYS``'s format (see :func:`parse_codec_keys`)."""
        return cls(parse_codec_keys(spec))

    @property
    def key_ids(self) -> list[str]:
        return list(self._ciphers)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        nonce = os.urandom(NONCE_BYTES)
        key_id = self.key_id.encode()
        sealed = self._ciphers[self.key_id].encrypt(nonce, payload.SerializeToString(), key_id)
        return Payload(metadata={"encoding": ENCODING, KEY_ID: key_id}, data=nonce + sealed)

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise CodecError(
                f"a payload was encrypted with key id {key_id!r}, which PLAYLINE_CODEC_KEYS "
                f"does not hold (it holds {', '.join(map(repr, self._ciphers))}); add that key"
            )
        nonce, sealed = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
        try:
            plain = cipher.decrypt(nonce, sealed, key_id.encode())
        except (InvalidTag, ValueError):
            raise CodecError(
                f"a payload encrypted with key id {key_id!r} does not decrypt with the key "
                "PLAYLINE_CODEC_KEYS holds under that id: the key is wrong or the payload "
                "was altered"
            ) from None
        return Payload.FromString(plain)
