"""BMC TLS, the pure parts: the mode of a BMC, fingerprints, the handshake check, the errors,
and the order of the first contact (service root without credentials before any login)."""

from __future__ import annotations

import hashlib
import ssl

import httpx
import pytest
from pydantic import ValidationError

from karios.common.errors import ValidationFailed, error_from_dict
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.drivers import BmcEndpoint, RedfishDriver
from karios.provisioner.drivers.tls import (
    BmcCertificateChanged,
    BmcCertificateUntrusted,
    CertificateCheck,
    TlsMode,
    fingerprint,
    tls_mode,
)

OLD, NEW = b"certificate one", b"certificate two"


def test_fingerprint_is_sha256_in_colon_hex_pairs():
    fp = fingerprint(OLD)
    assert fp.replace(":", "") == hashlib.sha256(OLD).hexdigest().upper()
    assert len(fp) == 95 and fp.count(":") == 31
    assert fingerprint(NEW) != fp


@pytest.mark.parametrize(
    ("url", "override", "bundle", "mode"),
    [
        ("http://127.0.0.1:8000", {}, "", TlsMode.plain),
        ("http://127.0.0.1:8000", {"tls": "ca"}, "/ca.pem", TlsMode.plain),  # no TLS to verify
        ("https://10.0.0.5", {}, "", TlsMode.tofu),  # the default without a CA bundle
        ("https://10.0.0.5", {}, "/ca.pem", TlsMode.ca),
        ("HTTPS://10.0.0.5", {"tls": "insecure"}, "/ca.pem", TlsMode.insecure),  # per-BMC opt-out
        ("https://10.0.0.5", {"tls": "TOFU"}, "/ca.pem", TlsMode.tofu),
        ("https://10.0.0.5", {"verify_tls": False}, "", TlsMode.insecure),  # the older key
        ("https://10.0.0.5", {"verify_tls": True}, "", TlsMode.ca),
        ("https://10.0.0.5", {"tls": "ca", "verify_tls": False}, "", TlsMode.ca),  # tls wins
    ],
)
def test_mode_of_a_bmc(url, override, bundle, mode):
    assert tls_mode(url, override, bundle) == mode


@pytest.mark.parametrize("bad", ["plain", "off", ""])
def test_unknown_mode_is_refused_naming_the_field(bad):
    with pytest.raises(ValidationFailed) as exc:
        tls_mode("https://10.0.0.5", {"tls": bad})
    assert exc.value.field == "tls"


def test_config_refuses_an_unknown_per_bmc_mode():
    with pytest.raises(ValidationError, match=r"bmc_endpoints\[10.0.0.5\].tls"):
        ProvisionerConfig(bmc_endpoints={"10.0.0.5": {"tls": "nope"}})
    ok = ProvisionerConfig(bmc_endpoints={"10.0.0.5": {"tls": "insecure"}}, bmc_ca_bundle="/etc/ca.pem")
    assert ok.bmc_ca_bundle == "/etc/ca.pem"


def test_first_contact_records_then_the_same_certificate_passes():
    check = CertificateCheck("10.0.0.5", TlsMode.tofu)
    check.on_handshake(OLD)  # no pin yet: accepted, seen
    assert check.seen == fingerprint(OLD) and check.error() is None
    check.expected = check.seen
    check.on_handshake(OLD)
    assert check.error() is None


def test_a_changed_certificate_is_refused_with_both_fingerprints():
    check = CertificateCheck("10.0.0.5", TlsMode.tofu, expected=fingerprint(OLD))
    with pytest.raises(ssl.SSLCertVerificationError):
        check.on_handshake(NEW)
    err = check.error()
    assert isinstance(err, BmcCertificateChanged) and err.code == "BMC_TLS_CERT_CHANGED"
    assert not err.retryable
    msg = err.message
    assert msg.startswith("BMC_TLS_CERT_CHANGED: BMC 10.0.0.5 presented a different TLS certificate")
    assert f"sha256 {fingerprint(NEW)}, pinned {fingerprint(OLD)}" in msg
    assert "DELETE /controlnode/bmc-tls/10.0.0.5" in msg and "no credentials were sent" in msg
    # it crosses the bus as a dict and comes back as itself
    assert isinstance(error_from_dict(err.to_dict()), BmcCertificateChanged)


@pytest.mark.parametrize("mode", [TlsMode.insecure, TlsMode.ca])
def test_only_tofu_compares_fingerprints(mode):
    check = CertificateCheck("10.0.0.5", mode, expected=fingerprint(OLD))
    check.on_handshake(NEW)
    assert check.error() is None


def test_untrusted_certificate_error():
    check = CertificateCheck(
        "10.0.0.5", TlsMode.ca, ca_bundle="/ca.pem", untrusted="unable to get local issuer"
    )
    err = check.error()
    assert isinstance(err, BmcCertificateUntrusted) and err.code == "BMC_TLS_UNTRUSTED"
    assert "BMC 10.0.0.5" in err.message and "unable to get local issuer" in err.message


def test_ssl_contexts_of_the_modes(tmp_path):
    ca = CertificateCheck("10.0.0.5", TlsMode.ca).ssl_context()
    assert isinstance(ca, ssl.SSLContext)
    assert ca.verify_mode == ssl.CERT_REQUIRED and ca.check_hostname
    for mode in (TlsMode.tofu, TlsMode.insecure):
        ctx = CertificateCheck("10.0.0.5", mode).ssl_context()
        assert isinstance(ctx, ssl.SSLContext)
        assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
        assert issubclass(ctx.sslobject_class, ssl.SSLObject) and ctx.sslobject_class is not ssl.SSLObject
    with pytest.raises(FileNotFoundError):
        CertificateCheck("10.0.0.5", TlsMode.ca, ca_bundle=str(tmp_path / "missing.pem")).ssl_context()


async def test_first_request_is_the_service_root_without_credentials():
    seen: list[tuple[str, str, bool]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        auth = "authorization" in request.headers or "x-auth-token" in request.headers
        seen.append((request.method, request.url.path, auth))
        if request.url.path.endswith("/Sessions"):
            return httpx.Response(201, headers={"X-Auth-Token": "t", "Location": "/redfish/v1/S/1"})
        if request.url.path == "/redfish/v1/Systems":
            return httpx.Response(200, json={"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]})
        return httpx.Response(200, json={"Systems": {"@odata.id": "/redfish/v1/Systems"}})

    ep = BmcEndpoint(bmc_ip="10.0.0.5", base_url="https://10.0.0.5", username="u", password="pw-s3cret")
    async with RedfishDriver(ep, transport=httpx.MockTransport(handle)) as drv:
        assert await drv.system_uri() == "/redfish/v1/Systems/1"
    assert seen[0] == ("GET", "/redfish/v1", False)
    assert seen[1] == ("POST", "/redfish/v1/SessionService/Sessions", False)
    assert all(auth for _m, path, auth in seen[2:] if path != "/redfish/v1/S/1") and len(seen) >= 4
