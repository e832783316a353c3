"""Signed, expiring media URLs (pure: no I/O, the clock is passed in).

The BMC is given ``<media_url>/media/<job>.iso?expires=<unix seconds>&signature=<HMAC>``: an
HMAC-SHA256 (key derived from the secret key ring, :meth:`SecretBox.derived_keys`) over the path,
the job id and the expiry, base64url without padding. A request without both parameters, with a
signature that does not match (compared in constant time, against every key of the ring so a key
rotation does not cut a boot short) or past its expiry is refused with 403; nothing of the
presented values is echoed back. Whether the job still consumes its medium is checked by
:mod:`karios.provisioner.media.access` after the signature.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field
from urllib.parse import urlencode

from karios.common.crypto import SecretBox, hmac_b64
from karios.common.errors import Forbidden

EXPIRES = "expires"
SIGNATURE = "signature"
PURPOSE = "karios media url v1"
_EXPIRES = re.compile(r"[0-9]{1,12}")  # ASCII digits only (no "²", no 5,000-digit numbers)
_SIGNATURE = re.compile(r"[A-Za-z0-9_-]{43}")  # 32 bytes, base64url, no padding


class MediaUrlInvalid(Forbidden):
    code = "MEDIA_URL_INVALID"


class MediaUrlExpired(Forbidden):
    code = "MEDIA_URL_EXPIRED"


class MediaJobEnded(Forbidden):
    code = "MEDIA_JOB_ENDED"


def media_path(job_id: str) -> str:
    """The path a job's medium is served at (what the signature covers)."""
    return f"/media/{job_id}.iso"


@dataclass(frozen=True)
class MediaUrlSigner:
    """Signs with the active key; verifies against every key of the ring."""

    keys: dict[str, bytes] = field(repr=False)
    active: str

    @classmethod
    def from_box(cls, box: SecretBox) -> MediaUrlSigner:
        return cls(box.derived_keys(PURPOSE), box.active_key_id)

    @staticmethod
    def _mac(key: bytes, job_id: str, expires: int) -> str:
        return hmac_b64(key, f"{media_path(job_id)}\n{job_id}\n{expires}")

    def signature(self, job_id: str, expires: int) -> str:
        return self._mac(self.keys[self.active], job_id, expires)

    def url(self, base_url: str, job_id: str, expires: int) -> str:
        """The signed URL of the job's medium under ``base_url`` (the provisioner as BMCs reach it)."""
        query = urlencode({EXPIRES: expires, SIGNATURE: self.signature(job_id, expires)})
        return f"{base_url.rstrip('/')}{media_path(job_id)}?{query}"

    def verify(self, job_id: str, expires: str | None, signature: str | None, *, now: float) -> int:
        """The URL's expiry (unix seconds) if its signature is ours and it has not expired, else
        :class:`MediaUrlInvalid` / :class:`MediaUrlExpired` (403)."""
        if (
            not expires
            or not signature
            or not _EXPIRES.fullmatch(expires)
            or not _SIGNATURE.fullmatch(signature)
        ):
            raise MediaUrlInvalid("media URL: a signed URL is required (expires and signature)")
        at = int(expires)
        ok = False
        for key in self.keys.values():  # every key, no early exit
            ok |= hmac.compare_digest(self._mac(key, job_id, at).encode(), signature.encode())
        if not ok:
            raise MediaUrlInvalid("media URL: the signature does not match")
        if at <= now:
            raise MediaUrlExpired("media URL: expired (the job's stage deadline passed)")
        return at
