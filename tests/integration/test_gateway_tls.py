"""TLS at the edge (issue 24 item 3): ``karios run api-gateway`` with ``KARIOS_TLS_CERTFILE`` /
``KARIOS_TLS_KEYFILE`` serves HTTPS only. A certificate of a test CA (trustme): /readyz and an
authenticated route answer over HTTPS for a client that trusts the CA, a client that does not is
refused the handshake, plain HTTP to the port gets no answer; ``karios ready api-gateway`` probes
it over HTTPS, and the CLI client reaches it with ``KARIOS_TLS_CA_BUNDLE`` (and not without).
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from tests.fixtures.apps import ADMIN, free_port
from tests.fixtures.wait import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class TlsGateway:
    def __init__(self, url: str, port: int, ca: Path, env: dict[str, str]) -> None:
        self.url, self.port, self.ca, self.env = url, port, ca, env

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@pytest.fixture
def tls_gateway(settings, tmp_path: Path) -> Iterator[TlsGateway]:  # type: ignore[no-untyped-def]
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, cafile = tmp_path / "gw.pem", tmp_path / "gw.key", tmp_path / "ca.pem"
    cert.private_key_pem.write_to_path(str(keyfile))
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(certfile), append=True)
    ca.cert_pem.write_to_path(str(cafile))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env.update(
        KARIOS_DEV_MODE="1",
        KARIOS_NATS_URL=settings.nats_url,
        KARIOS_DATABASE_URL=settings.database_url,
        KARIOS_BUS_PREFIX=settings.bus_prefix,
        KARIOS_BOOTSTRAP_ADMIN_TOKEN="kt_test-admin-token",
        KARIOS_LOG_JSON="false",
        KARIOS_HOST="127.0.0.1",
        KARIOS_GATEWAY_PORT=str(port),
        KARIOS_STATE_DIR=str(tmp_path / "state"),
        KARIOS_TLS_CERTFILE=str(certfile),
        KARIOS_TLS_KEYFILE=str(keyfile),
    )
    log = open(tmp_path / "gateway.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "karios.cli", "run", "api-gateway"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    gw = TlsGateway(f"https://127.0.0.1:{port}", port, cafile, env)
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()[-2000:]
            try:
                return httpx.get(f"{gw.url}/readyz", verify=gw.verify(), timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until_sync(ready, timeout=60, interval=0.2, what="the HTTPS gateway to be ready")
        yield gw
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_the_gateway_serves_https_only_with_its_certificate(tls_gateway: TlsGateway) -> None:
    gw = tls_gateway
    with httpx.Client(base_url=gw.url, verify=gw.verify(), timeout=10) as c:
        assert c.get("/readyz").status_code == 200
        tokens = c.get("/controlnode/tokens", headers=ADMIN)
        assert tokens.status_code == 200, tokens.text
        assert "bootstrap-admin" in tokens.text
        assert c.get("/controlnode/tokens").status_code == 401  # HTTPS is not a credential
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{gw.url}/readyz", timeout=10)  # a client that does not trust the CA
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port: no HTTP answer at all
        httpx.get(f"http://127.0.0.1:{gw.port}/readyz", timeout=10)


def test_karios_ready_and_the_cli_use_https(tls_gateway: TlsGateway) -> None:
    gw = tls_gateway

    def karios(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "karios.cli", *args],
            env={**gw.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    ready = karios("ready", "api-gateway")
    assert ready.returncode == 0, ready.stdout + ready.stderr
    client = {
        "KARIOS_URL": gw.url,
        "KARIOS_TOKEN": "kt_test-admin-token",
        "KARIOS_CONFIG": str(gw.ca.parent / "c.json"),
    }
    listed = karios("token", "list", **client, KARIOS_TLS_CA_BUNDLE=str(gw.ca))
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "bootstrap-admin" in listed.stdout
    untrusted = karios("token", "list", **client)
    assert untrusted.returncode != 0
    assert "certificate" in (untrusted.stdout + untrusted.stderr).lower()
    assert "kt_test-admin-token" not in untrusted.stdout + untrusted.stderr
