"""The discovery token (issue 27 item 3), pure: no I/O, the clock is passed in.

bootapi answers a MAC no host owns (with discovery on) with the live environment in discovery mode
and puts a token on its kernel line (``karios.discovery=<token>``); the provisioner serves that
boot's overlay only for a valid token, and the gateway takes the hardware report only with it.

``<key id>.<mac, 12 hex>.<expiry, unix seconds>.<HMAC>``: an HMAC-SHA256 (key derived from the
secret key ring for this purpose only, :meth:`SecretBox.derived_keys`) over the MAC and the expiry,
base64url without padding. Stateless: every service holding the key ring checks it, and a key
rotation does not cut a boot short (verified against every key of the ring). Nothing but the MAC
and the expiry is in it — the characters ``[A-Za-z0-9_.-]`` only, safe on a kernel line and in a URL
path. It proves the report comes from a machine that asked bootapi for a boot script for that MAC
within the token's lifetime (:data:`DEFAULT_TTL`).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field

from karios.common.crypto import SecretBox, hmac_b64
from karios.common.errors import Unauthorized, register_error
from karios.common.netaddr import normalize_mac

PURPOSE = "karios discovery token v1"
KERNEL_ARG = "karios.discovery"  # the kernel argument carrying the token
HEADER = "X-Karios-Discovery-Token"  # how the live environment presents it
DEFAULT_TTL = 1800.0  # seconds: PXE, a 60 MB download, the boot and the report fit many times over
TOKEN_MAX = 128
_TOKEN = re.compile(r"([A-Za-z0-9_-]{1,16})\.([0-9a-f]{12})\.([0-9]{1,12})\.([A-Za-z0-9_-]{43})")


@register_error
class DiscoveryTokenInvalid(Unauthorized):
    """No discovery token, or not one Karios issued (the same answer for both)."""

    code = "DISCOVERY_TOKEN_INVALID"


@register_error
class DiscoveryTokenExpired(Unauthorized):
    """A discovery token past its expiry: the machine must PXE-boot again for a new one."""

    code = "DISCOVERY_TOKEN_EXPIRED"


@dataclass(frozen=True)
class DiscoveryTokens:
    """Issues with the active key; verifies against every key of the ring."""

    keys: dict[str, bytes] = field(repr=False)
    active: str

    @classmethod
    def from_box(cls, box: SecretBox) -> DiscoveryTokens:
        return cls(box.derived_keys(PURPOSE), box.active_key_id)

    @classmethod
    def from_settings(cls, settings: object) -> DiscoveryTokens:
        return cls.from_box(SecretBox.from_settings(settings))

    @staticmethod
    def _mac(key: bytes, mac_hex: str, expires: int) -> str:
        return hmac_b64(key, f"{PURPOSE}\n{mac_hex}\n{expires}")

    def issue(self, mac: str, *, now: float, ttl: float = DEFAULT_TTL) -> str:
        """A token for ``mac`` (any notation) good until ``now + ttl``."""
        mac_hex = normalize_mac(mac).replace(":", "")
        expires = int(now + ttl)
        return f"{self.active}.{mac_hex}.{expires}.{self._mac(self.keys[self.active], mac_hex, expires)}"

    def verify(self, token: str | None, *, now: float) -> str:
        """The MAC (``aa:bb:…``) the token was issued for, if it is ours and not expired; else
        :class:`DiscoveryTokenInvalid` / :class:`DiscoveryTokenExpired` (401). Nothing of the
        presented value is echoed back."""
        m = _TOKEN.fullmatch(token or "") if token and len(token) <= TOKEN_MAX else None
        if m is None:
            raise DiscoveryTokenInvalid("missing or invalid discovery token")
        kid, mac_hex, expires, signature = m.group(1), m.group(2), int(m.group(3)), m.group(4)
        key = self.keys.get(kid)
        if key is None or not hmac.compare_digest(self._mac(key, mac_hex, expires), signature):
            raise DiscoveryTokenInvalid("missing or invalid discovery token")
        if now > expires:
            raise DiscoveryTokenExpired("the discovery token has expired: PXE-boot the machine again")
        return normalize_mac(mac_hex)
