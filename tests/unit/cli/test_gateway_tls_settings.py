"""TLS settings of the gateway (issue 24 item 3): certificate and key come as a pair, uvicorn gets
them for the gateway only, ``karios up`` gives the gateway (and its context) an https URL, the
installer's default callback URL follows, and the CLI verifies against KARIOS_TLS_CA_BUNDLE."""

from __future__ import annotations

import ssl
from pathlib import Path
from types import SimpleNamespace

import pytest
import trustme
from pydantic import ValidationError

from karios.cli.client.api import CliError, tls_verify
from karios.cli.services import server_tls
from karios.cli.up import Up
from karios.common.settings import KariosSettings
from karios.provisioner.config import ProvisionerConfig


def test_certificate_and_key_come_together(tmp_path: Path):
    with pytest.raises(ValidationError, match="KARIOS_TLS_CERTFILE and KARIOS_TLS_KEYFILE"):
        KariosSettings(dev_mode=True, tls_certfile=tmp_path / "c.pem")
    with pytest.raises(ValidationError, match="set both"):
        KariosSettings(dev_mode=True, tls_keyfile=tmp_path / "k.pem")
    plain = KariosSettings(dev_mode=True, tls_certfile="", tls_keyfile="")  # empty = unset
    assert plain.gateway_scheme == "http" and server_tls("api-gateway", plain) == {}
    tls = KariosSettings(dev_mode=True, tls_certfile=tmp_path / "c.pem", tls_keyfile=tmp_path / "k.pem")
    assert tls.gateway_scheme == "https"
    assert server_tls("api-gateway", tls) == {
        "ssl_certfile": str(tmp_path / "c.pem"),
        "ssl_keyfile": str(tmp_path / "k.pem"),
    }
    assert server_tls("provisioner", tls) == {}  # BMCs and installers keep their plain HTTP
    assert ProvisionerConfig.from_env(tls).callback_url.startswith("https://")


def test_karios_up_gives_the_gateway_an_https_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in list(__import__("os").environ):
        if name.startswith("KARIOS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KARIOS_TLS_CERTFILE", str(tmp_path / "c.pem"))
    monkeypatch.setenv("KARIOS_TLS_KEYFILE", str(tmp_path / "k.pem"))
    args = SimpleNamespace(
        timeout=5, max_crashes=3, crash_window=60, otlp_endpoint=None, cluster=0, replicas=2
    )
    up = Up(args, tmp_path / "state")  # type: ignore[arg-type]
    _, urls = up._add_services()
    assert urls["api-gateway"].startswith("https://") and urls["api-gateway-2"].startswith("https://")
    assert up.sup.children["api-gateway"].ready_url.startswith("https://")
    assert urls["provisioner"].startswith("http://")


def test_the_cli_verifies_against_the_ca_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("KARIOS_TLS_CA_BUNDLE", raising=False)
    assert tls_verify() is True  # the system's trust store
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    monkeypatch.setenv("KARIOS_TLS_CA_BUNDLE", str(ca))
    assert isinstance(tls_verify(), ssl.SSLContext)
    monkeypatch.setenv("KARIOS_TLS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(CliError, match="KARIOS_TLS_CA_BUNDLE"):
        tls_verify()
