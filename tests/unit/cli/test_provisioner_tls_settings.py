"""HTTPS for media and images (issue 24 item 2): ``KARIOS_PROVISIONER_TLS`` serves the provisioner
with the deployment's certificate — it needs that certificate, uvicorn gets it, ``karios up`` and
``karios ready`` probe https, the BMC's media URL is https (an http one configured by hand is
refused at start), the install media carry the deployment's CA (``KARIOS_TLS_CA_BUNDLE`` →
``/karios/ca.pem``) and the live script trusts it before its first request; without a CA the
rendered scripts are those of before (the golden files do not change)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import trustme
from pydantic import ValidationError

from karios.cli import readiness
from karios.cli.services import server_tls, serves_tls
from karios.cli.up import Up
from karios.common.errors import PermanentFailure
from karios.common.settings import KariosSettings
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.install import CA_PATH, HostContext
from karios.provisioner.install.image import ImageMethod
from karios.provisioner.install.wipe import WipeMethod

TRUST_LINE = f"cat /{CA_PATH} >> /etc/ssl/certs/ca-certificates.crt"


def _tls(tmp_path: Path, **kw: object) -> KariosSettings:
    return KariosSettings(
        dev_mode=True, tls_certfile=tmp_path / "c.pem", tls_keyfile=tmp_path / "k.pem", **kw
    )  # type: ignore[arg-type]


def test_provisioner_tls_needs_the_certificate_and_gets_it(tmp_path: Path):
    with pytest.raises(ValidationError, match="KARIOS_PROVISIONER_TLS needs the certificate"):
        KariosSettings(dev_mode=True, provisioner_tls=True)
    gateway_only = _tls(tmp_path)
    assert not serves_tls("provisioner", gateway_only) and server_tls("provisioner", gateway_only) == {}
    both = _tls(tmp_path, provisioner_tls=True)
    assert both.provisioner_scheme == "https"
    assert server_tls("provisioner", both) == {
        "ssl_certfile": str(tmp_path / "c.pem"),
        "ssl_keyfile": str(tmp_path / "k.pem"),
    }
    assert serves_tls("api-gateway", both) and not serves_tls("bootapi", both)


def test_the_media_url_is_https_and_an_http_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in list(__import__("os").environ):
        if name.startswith("KARIOS_PROVISIONER_"):
            monkeypatch.delenv(name)
    cfg = ProvisionerConfig.from_env(_tls(tmp_path, provisioner_tls=True, provisioner_port=9443))
    assert cfg.media_url == "https://127.0.0.1:9443"
    assert ProvisionerConfig.from_env(_tls(tmp_path)).media_url == "http://127.0.0.1:8082"
    monkeypatch.setenv("KARIOS_PROVISIONER_MEDIA_URL", "http://10.0.0.1:8082")
    with pytest.raises(ValueError, match="KARIOS_PROVISIONER_MEDIA_URL is http:// but the provisioner"):
        ProvisionerConfig.from_env(_tls(tmp_path, provisioner_tls=True))
    monkeypatch.setenv("KARIOS_PROVISIONER_MEDIA_URL", "https://media.example:8082")
    monkeypatch.setenv("KARIOS_PROVISIONER_IMAGE_URL", "http://10.0.0.1:8082")
    with pytest.raises(ValueError, match="KARIOS_PROVISIONER_IMAGE_URL is http://"):
        ProvisionerConfig.from_env(_tls(tmp_path, provisioner_tls=True))


def test_karios_up_and_ready_probe_the_provisioner_over_https(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for name in list(__import__("os").environ):
        if name.startswith("KARIOS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KARIOS_TLS_CERTFILE", str(tmp_path / "c.pem"))
    monkeypatch.setenv("KARIOS_TLS_KEYFILE", str(tmp_path / "k.pem"))
    monkeypatch.setenv("KARIOS_PROVISIONER_TLS", "true")
    args = SimpleNamespace(
        timeout=5, max_crashes=3, crash_window=60, otlp_endpoint=None, cluster=0, replicas=1
    )
    up = Up(args, tmp_path / "state")  # type: ignore[arg-type]
    _, urls = up._add_services()
    assert urls["provisioner"].startswith("https://") and urls["api-gateway"].startswith("https://")
    assert up.sup.children["provisioner"].ready_url.startswith("https://")
    assert urls["bootapi"].startswith("http://")
    probed: list[str] = []
    monkeypatch.setattr(readiness, "probe", lambda url, timeout: (probed.append(url), (True, "ok"))[1])
    assert readiness.ready("provisioner", 1) == 0
    monkeypatch.setenv("KARIOS_PROVISIONER_TLS", "0")
    assert readiness.ready("provisioner", 1) == 0
    assert probed == ["https://127.0.0.1:8082/readyz", "http://127.0.0.1:8082/readyz"]


def _ctx(ca: str = "") -> HostContext:
    return HostContext(
        job_id="job-ca",
        token="t",
        callback_base="https://gw.example:8080/controlnode",
        hostname="node1",
        bmc_ip="10.0.0.5",
        os_username="debian",
        password_hash="x",
        image_url="https://prov.example:8082/images/bookworm/root.tar.zst",
        ca_bundle=ca,
    )


def _cfg(tmp_path: Path, ca: Path | None = None) -> ProvisionerConfig:
    return ProvisionerConfig(cache_dir=tmp_path, images_dir=tmp_path / "images", ca_bundle=ca)


def test_the_medium_carries_the_ca_and_the_live_scripts_trust_it_first(tmp_path: Path):
    pem = trustme.CA().cert_pem.bytes().decode()
    (tmp_path / "ca.pem").write_text(pem)
    assert _cfg(tmp_path, tmp_path / "ca.pem").ca_pem() == pem
    assert _cfg(tmp_path).ca_pem() == ""
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(PermanentFailure, match="no PEM certificate"):
        _cfg(tmp_path, tmp_path / "bad.pem").ca_pem()
    with pytest.raises(PermanentFailure, match="not readable"):
        _cfg(tmp_path, tmp_path / "missing.pem").ca_pem()

    image, wipe = ImageMethod(_cfg(tmp_path)), WipeMethod(_cfg(tmp_path))
    for render in (image.render_install_script, wipe.render_wipe_script):
        with_ca, without = render(_ctx(pem)), render(_ctx())
        lines = [line.strip() for line in with_ca.splitlines()]
        first_request = next(
            i for i, line in enumerate(lines) if "curl " in line and not line.startswith("#")
        )
        assert lines.index(TRUST_LINE) < first_request
        assert TRUST_LINE not in without and CA_PATH not in without
    installed = image.render_install_script(_ctx(pem))
    assert f"cp /{CA_PATH} $T/usr/local/share/ca-certificates/karios-deployment.crt" in installed
    assert "chroot $T update-ca-certificates" in installed
    assert "update-ca-certificates" not in image.render_install_script(_ctx())


def test_the_ca_is_in_the_overlay_of_image_and_wipe_media(tmp_path: Path):
    pem = trustme.CA().cert_pem.bytes().decode()
    suite = tmp_path / "images" / "bookworm"
    suite.mkdir(parents=True)
    for name in ("vmlinuz", "live.img", "root.tar.zst"):
        (suite / name).write_bytes(b"x")
    for method in (ImageMethod(_cfg(tmp_path)), WipeMethod(_cfg(tmp_path))):
        assert method.medium(_ctx(pem)).overlay[CA_PATH] == pem
        assert CA_PATH not in method.medium(_ctx()).overlay
