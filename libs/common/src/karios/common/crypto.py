"""AES-256-GCM for secrets at rest.

Stored form: ``v1:<key id>:<base64 nonce>:<base64 ciphertext+tag>`` — the key id travels
with the ciphertext so keys can rotate (old keys stay in the keyring for decryption).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from karios.common.errors import KariosError


class SecretDecryptError(KariosError):
    code = "SECRET_DECRYPT_FAILED"
    http_status = 500


class SecretBox:
    """Encrypts with the active key; decrypts with whichever key id the ciphertext names."""

    def __init__(self, keyring: dict[str, bytes], active_key_id: str) -> None:
        if active_key_id not in keyring:
            raise ValueError(f"active key id {active_key_id!r} not in keyring")
        for kid, key in keyring.items():
            if len(key) != 32:
                raise ValueError(f"key {kid!r} must be 32 bytes")
        self._keys = dict(keyring)
        self._active = active_key_id

    def encrypt(self, plaintext: str, *, context: str = "") -> str:
        nonce = os.urandom(12)
        ct = AESGCM(self._keys[self._active]).encrypt(nonce, plaintext.encode(), context.encode() or None)
        return f"v1:{self._active}:{base64.b64encode(nonce).decode()}:{base64.b64encode(ct).decode()}"

    def decrypt(self, token: str, *, context: str = "") -> str:
        try:
            version, kid, nonce_b64, ct_b64 = token.split(":", 3)
        except ValueError:
            raise SecretDecryptError("stored secret is malformed") from None
        if version != "v1" or kid not in self._keys:
            raise SecretDecryptError(f"stored secret uses unknown key id {kid!r}")
        try:
            pt = AESGCM(self._keys[kid]).decrypt(
                base64.b64decode(nonce_b64), base64.b64decode(ct_b64), context.encode() or None
            )
        except (InvalidTag, ValueError):
            raise SecretDecryptError("stored secret failed authentication") from None
        return pt.decode()

    @property
    def active_key_id(self) -> str:
        return self._active

    def derived_keys(self, purpose: str) -> dict[str, bytes]:
        """One 32-byte key per keyring key for ``purpose`` (HKDF-SHA256, info = purpose), by key id:
        a MAC key (e.g. signed media URLs) is never the encryption key itself, and rotates with it."""
        return {
            kid: HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose.encode()).derive(key)
            for kid, key in self._keys.items()
        }

    def key_id_of(self, token: str) -> str:
        return token.split(":", 2)[1]

    def needs_rotation(self, token: str) -> bool:
        return self.key_id_of(token) != self._active

    @classmethod
    def from_settings(cls, settings) -> SecretBox:  # type: ignore[no-untyped-def]
        return cls(settings.keyring, settings.secret_key_id)


def hmac_b64(key: bytes, message: str) -> str:
    """HMAC-SHA256 of ``message`` under ``key``, base64url without padding: the one signature of
    the tokens and URLs signed with a key of the ring (``SecretBox.derived_keys``)."""
    return (
        base64.urlsafe_b64encode(hmac.new(key, message.encode(), hashlib.sha256).digest())
        .rstrip(b"=")
        .decode()
    )
