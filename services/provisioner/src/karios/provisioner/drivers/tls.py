"""TLS towards a BMC: verify against a CA bundle, trust on first use (a pinned certificate
fingerprint, like an SSH host key), or an explicit per-BMC opt-out.

The check runs inside the TLS handshake of every connection the driver's httpx client opens
(an :class:`ssl.SSLObject` subclass set as the context's ``sslobject_class``): a BMC that
presents another certificate than the pinned one is refused before a single HTTP byte (and so
before any credential) is sent on that connection. See docs/provisioning.md "BMC TLS".
"""

from __future__ import annotations

import enum
import functools
import hashlib
import ssl
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from karios.common.errors import PermanentFailure, ValidationFailed, register_error

CLEAR_HINT = "DELETE /controlnode/bmc-tls/{ip} (role fabric_admin)"


class TlsMode(enum.StrEnum):
    plain = "plain"  # http:// endpoint: no TLS at all (the lab emulator)
    ca = "ca"  # verify the chain (and the address) against the CA bundle or the system store
    tofu = "tofu"  # pin the leaf certificate's SHA-256 on first contact, refuse a changed one
    insecure = "insecure"  # explicit per-BMC opt-out: no verification


@register_error
class BmcCertificateChanged(PermanentFailure):
    """The BMC presented another certificate than the one pinned on first contact."""

    code = "BMC_TLS_CERT_CHANGED"
    http_status = 502


@register_error
class BmcCertificateUntrusted(PermanentFailure):
    """The BMC's certificate does not verify against the configured CA bundle."""

    code = "BMC_TLS_UNTRUSTED"
    http_status = 502


# -- pure rules -------------------------------------------------------------------------------


def fingerprint(der: bytes) -> str:
    """SHA-256 of a DER certificate as upper-case hex pairs: ``AB:CD:…`` (95 characters)."""
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def tls_mode(base_url: str, override: dict[str, Any], ca_bundle: str = "") -> TlsMode:
    """The TLS mode of one BMC: per-BMC ``tls`` (``ca`` | ``tofu`` | ``insecure``; the older
    ``verify_tls`` true/false means ``ca``/``insecure``), else ``ca`` when a CA bundle is
    configured, else ``tofu``. An ``http://`` endpoint has no TLS (``plain``)."""
    if urlsplit(base_url).scheme.lower() == "http":
        return TlsMode.plain
    wanted = override.get("tls")
    if wanted is None and "verify_tls" in override:
        wanted = TlsMode.ca if override["verify_tls"] else TlsMode.insecure
    if wanted is None:
        return TlsMode.ca if ca_bundle else TlsMode.tofu
    try:
        mode = TlsMode(str(wanted).lower())
    except ValueError:
        mode = TlsMode.plain
    if mode == TlsMode.plain:
        raise ValidationFailed(f"tls: {wanted!r} is not one of ca, tofu, insecure", field="tls")
    return mode


def changed_message(bmc_ip: str, presented: str, pinned: str) -> str:
    return (
        f"{BmcCertificateChanged.code}: BMC {bmc_ip} presented a different TLS certificate "
        f"(sha256 {presented}, pinned {pinned}); no credentials were sent. If the BMC's certificate "
        f"was replaced on purpose, clear the pin with {CLEAR_HINT.format(ip=bmc_ip)} and provision again"
    )


def untrusted_message(bmc_ip: str, reason: str) -> str:
    return (
        f"{BmcCertificateUntrusted.code}: BMC {bmc_ip} presented a TLS certificate that does not "
        f"verify against the configured CA bundle ({reason}); no credentials were sent"
    )


class PinStore(Protocol):
    """Where pinned fingerprints live (PostgreSQL in the service, a dict in unit tests)."""

    async def get(self, bmc_ip: str) -> str | None: ...

    async def record(self, bmc_ip: str, fingerprint: str) -> str:
        """Pin ``fingerprint`` unless a pin exists; returns the pin in force (first writer wins)."""
        ...


# -- the handshake check ------------------------------------------------------------------------


@dataclass
class CertificateCheck:
    """What one driver expects of its BMC's certificate, and what the handshakes saw.

    ``expected``: the pinned fingerprint every handshake must present (tofu; None before the
    first contact). ``seen``: the last fingerprint presented. ``refused``/``untrusted``: why a
    handshake was refused (read by the driver to raise a clear, permanent error).
    """

    bmc_ip: str
    mode: TlsMode
    ca_bundle: str = ""
    expected: str | None = None
    seen: str | None = None
    refused: str | None = None  # the presented fingerprint that did not match the pin
    untrusted: str | None = None  # the verification failure (ca mode)

    def on_handshake(self, der: bytes | None) -> None:
        """Called once per connection after the handshake; raises to refuse the connection."""
        self.seen = fingerprint(der) if der else None
        if self.mode == TlsMode.tofu and self.expected is not None and self.seen != self.expected:
            self.refused = self.seen or "none"
            raise ssl.SSLCertVerificationError(f"certificate of BMC {self.bmc_ip} does not match its pin")

    def error(self) -> PermanentFailure | None:
        """The refusal of the last handshake as a job-failing error (None: not a TLS refusal)."""
        if self.refused is not None and self.expected is not None:
            return BmcCertificateChanged(changed_message(self.bmc_ip, self.refused, self.expected))
        if self.untrusted is not None:
            return BmcCertificateUntrusted(untrusted_message(self.bmc_ip, self.untrusted))
        return None

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The ``verify=`` of the driver's httpx client."""
        if self.mode == TlsMode.plain:
            return _default_context()  # unused on http://; shared: building one costs ~25 ms of CPU
        if self.mode == TlsMode.ca:
            ctx = ssl.create_default_context(cafile=self.ca_bundle or None)
        else:  # tofu / insecure: the chain is not verified; tofu checks the pin instead
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no CA store to load
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        ctx.sslobject_class = _checked_object_class(self)
        return ctx


@functools.cache
def _default_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def _checked_object_class(check: CertificateCheck) -> type[ssl.SSLObject]:
    class CheckedSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except ssl.SSLCertVerificationError as exc:
                check.untrusted = str(exc.verify_message or exc.reason or exc)
                raise
            check.on_handshake(self.getpeercert(binary_form=True))

    return CheckedSSLObject
