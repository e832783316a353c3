"""Plain HTTP on BOOTAPI_LISTEN_ADDR and the optional parallel HTTPS listener, serving one app."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from karios.bootapi.listeners import build_servers, run_servers
from tests.fixtures.apps import free_port
from tests.fixtures.bootapi import boot_settings
from tests.fixtures.wait import wait_until


def self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bootapi.test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return tmp_path / "cert.pem", tmp_path / "key.pem"


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
async def test_http_and_https_listeners_serve_the_same_boot_path(settings, inventory, tmp_path, server):
    cert, key = self_signed(tmp_path)
    http_port, https_port = free_port(), free_port()
    servers = build_servers(
        settings,
        boot_settings(
            listen_addr=f"127.0.0.1:{http_port}",
            tls_listen_addr=f"127.0.0.1:{https_port}",
            tls_cert_file=cert,
            tls_key_file=key,
            server=server,
        ),
    )
    task = asyncio.create_task(run_servers(servers))
    try:
        await wait_until(lambda: all(s.started for s in servers), what="both listeners to start")
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(cert))) as c:
            plain = await c.get(f"http://127.0.0.1:{http_port}/ipxe/52:54:00:aa:00:11")
            tls = await c.get(f"https://127.0.0.1:{https_port}/ipxe/52:54:00:aa:00:11")
            assert (await c.get(f"https://127.0.0.1:{https_port}/readyz")).status_code == 200
        tls12 = ssl.create_default_context(cafile=str(cert))
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2  # iPXE's HTTPS: TLS 1.2 must be accepted
        async with httpx.AsyncClient(verify=tls12) as c:
            assert (await c.get(f"https://127.0.0.1:{https_port}/readyz")).status_code == 200
        assert plain.headers["server"] == tls.headers["server"] == server
        assert plain.status_code == tls.status_code == 200
        assert plain.text == tls.text and "inst.ks=http://" in plain.text  # installers get http:// URLs
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.wait_for(task, 20)
