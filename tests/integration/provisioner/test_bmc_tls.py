"""BMC TLS against the real emulator over HTTPS (sushy-tools with trustme certificates).

Trust on first use pins the certificate, the same certificate passes, a replaced one fails the
job with the BMC and both fingerprints named — and the impostor receives no request at all (so
no SessionService POST and no Authorization header); clearing the pin through the API lets the
new certificate be pinned. CA-bundle mode verifies against the trustme CA and refuses another
CA's certificate; the per-BMC opt-out works.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme

from karios.provisioner.drivers import BmcEndpoint, RedfishDriver
from karios.provisioner.drivers.tls import (
    BmcCertificateChanged,
    BmcCertificateUntrusted,
    TlsMode,
    fingerprint,
)
from tests.fixtures.apps import ADMIN, free_port
from tests.fixtures.provision import wait_bmc_clean, wait_job
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]
PASSWORD = "tls-lab-pw"  # the same BMC credentials whichever certificate the emulator presents


@dataclass
class Cert:
    cert: str  # PEM paths
    key: str
    fp: str  # SHA-256 fingerprint, as the provisioner pins it


@dataclass
class Pki:
    ca_pem: str  # the CA bundle of CA "a"
    a1: Cert  # signed by CA a
    a2: Cert  # signed by CA a, another key: the BMC's certificate replaced
    b1: Cert  # signed by another CA


def _issue(ca: trustme.CA, where: Path, name: str) -> Cert:
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    der = ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
    return Cert(str(cert), str(key), fingerprint(der))


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    where = tmp_path_factory.mktemp("bmc-pki")
    ca_a, ca_b = trustme.CA(), trustme.CA()
    ca_a.cert_pem.write_to_path(str(where / "ca-a.pem"))
    return Pki(
        str(where / "ca-a.pem"),
        _issue(ca_a, where, "a1"),
        _issue(ca_a, where, "a2"),
        _issue(ca_b, where, "b1"),
    )


def bmc(cert: Cert, *, port: int = 0, system: dict | None = None) -> RedfishEmulator:
    try:
        return RedfishEmulator(
            [system or fake_system("tls1")],
            ssl_cert=cert.cert,
            ssl_key=cert.key,
            port=port,
            password=PASSWORD,
        ).start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")


class MemoryPins:
    def __init__(self, pins: dict[str, str] | None = None, race: str | None = None) -> None:
        self.pins = dict(pins or {})
        self.race = race  # another replica's pin, written between our get and our record

    async def get(self, bmc_ip: str) -> str | None:
        return self.pins.get(bmc_ip)

    async def record(self, bmc_ip: str, fp: str) -> str:
        if self.race:
            self.pins.setdefault(bmc_ip, self.race)
        return self.pins.setdefault(bmc_ip, fp)


def endpoint(emu: RedfishEmulator, **kw) -> BmcEndpoint:
    return BmcEndpoint(
        bmc_ip="10.0.0.5", base_url=emu.url, username=emu.username, password=emu.password, retries=1, **kw
    )


async def system_of(ep: BmcEndpoint) -> str:
    async with RedfishDriver(ep) as drv:
        return await drv.system_uri()


# -- the driver against the emulator -------------------------------------------------------------


async def test_driver_pins_on_first_use_and_refuses_a_replaced_certificate(pki):
    port, system = free_port(), fake_system("tls1")
    pins = MemoryPins()
    emu = bmc(pki.a1, port=port, system=system)
    try:
        await system_of(endpoint(emu, pins=pins))
        assert pins.pins == {"10.0.0.5": pki.a1.fp}
        await system_of(endpoint(emu, pins=pins))  # the same certificate: fine
        before = emu.requests_seen()
        assert any("SessionService/Sessions" in r for r in before)  # the emulator logs what it gets
    finally:
        emu.stop()
    emu = bmc(pki.a2, port=port, system=system)  # same address, another certificate
    try:
        since = len(emu.log())
        with pytest.raises(BmcCertificateChanged) as exc:
            await system_of(endpoint(emu, pins=pins))
        msg = exc.value.message
        assert "BMC 10.0.0.5 presented a different TLS certificate" in msg
        assert f"sha256 {pki.a2.fp}, pinned {pki.a1.fp}" in msg
        assert emu.requests_seen(since) == []  # not one request: no credentials reached it
        assert pins.pins == {"10.0.0.5": pki.a1.fp}
    finally:
        emu.stop()


async def test_first_writer_wins_when_two_replicas_pin_at_once(pki):
    emu = bmc(pki.a1)
    try:
        with pytest.raises(BmcCertificateChanged, match=pki.a1.fp):
            await system_of(endpoint(emu, pins=MemoryPins(race="AA:BB")))
    finally:
        emu.stop()


async def test_ca_bundle_verifies_and_refuses_another_ca(pki):
    good, other = bmc(pki.a1), bmc(pki.b1)
    try:
        pins = MemoryPins()
        await system_of(endpoint(good, tls=TlsMode.ca, ca_bundle=pki.ca_pem, pins=pins))
        assert pins.pins == {}  # CA mode pins nothing
        since = len(other.log())
        with pytest.raises(BmcCertificateUntrusted) as exc:
            await system_of(endpoint(other, tls=TlsMode.ca, ca_bundle=pki.ca_pem, pins=pins))
        assert (
            "BMC 10.0.0.5" in exc.value.message
            and "unable to get local issuer certificate" in exc.value.message
        )
        assert other.requests_seen(since) == []
    finally:
        good.stop()
        other.stop()


async def test_opt_out_accepts_any_certificate_and_pins_nothing(pki):
    emu = bmc(pki.b1)
    try:
        pins = MemoryPins({"10.0.0.5": pki.a1.fp})
        await system_of(endpoint(emu, tls=TlsMode.insecure, pins=pins))
        assert pins.pins == {"10.0.0.5": pki.a1.fp}
    finally:
        emu.stop()


# -- through the gateway: provision jobs, the pin API --------------------------------------------


async def _provision(c: httpx.AsyncClient, ip: str, states: set[str], timeout: float = 90) -> dict:
    r = await c.post(
        "/controlnode/provision", json={"bmc_IP": ip, "vendor": "generic", "hostname": "t1"}, headers=ADMIN
    )
    assert r.status_code == 202, r.text
    return await wait_job(c, r.json()["job_id"], states, timeout=timeout)


async def _end(c: httpx.AsyncClient, job: dict, emu: RedfishEmulator) -> None:
    """Cancel a booting job and wait until its cleanup (over TLS) left the BMC clean."""
    assert (await c.post(f"/controlnode/job/{job['id']}/cancel", headers=ADMIN)).status_code == 200
    await wait_job(c, job["id"], {"cancelled"})
    await wait_bmc_clean(emu, emu.system_ids[0])


def _point(stack, ip: str, emu: RedfishEmulator, **extra) -> None:
    stack.cfg.bmc_endpoints[ip] = {
        "url": emu.url,
        "system_id": emu.system_ids[0],
        "username": emu.username,
        "password": emu.password,
        **extra,
    }


async def _pins(c: httpx.AsyncClient, ip: str) -> list[dict]:
    r = await c.get("/controlnode/bmc-tls", params={"bmc_ip": ip}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()["pins"]


async def test_provision_pins_refuses_a_replaced_certificate_and_clearing_the_pin_accepts_it(stack, pki):
    ip, port, system = "10.99.1.4", free_port(), fake_system("tls-stack")
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        await c.delete(f"/controlnode/bmc-tls/{ip}", headers=ADMIN)  # from an earlier run
        emu = bmc(pki.a1, port=port, system=system)
        try:
            _point(stack, ip, emu)
            await _end(c, await _provision(c, ip, {"booting"}), emu)
            assert [p["fingerprint"] for p in await _pins(c, ip)] == [pki.a1.fp]
            await _end(c, await _provision(c, ip, {"booting"}), emu)  # same certificate: fine
        finally:
            emu.stop()
        emu = bmc(pki.a2, port=port, system=system)
        try:
            since = len(emu.log())
            job = await _provision(c, ip, {"failed", "booting"}, timeout=60)
            assert job["job_status"] == "failed", job
            assert job["message"].startswith("BMC_TLS_CERT_CHANGED: BMC 10.99.1.4 presented a different"), job
            assert f"sha256 {pki.a2.fp}, pinned {pki.a1.fp}" in job["message"]
            assert emu.requests_seen(since) == []  # no SessionService POST, no Authorization header
            r = await c.delete(f"/controlnode/bmc-tls/{ip}", headers=ADMIN)
            assert r.status_code == 200 and r.json() == {"bmc_ip": ip, "fingerprint": pki.a1.fp}
            r = await c.delete(f"/controlnode/bmc-tls/{ip}", headers=ADMIN)
            assert r.status_code == 404 and r.json()["field"] == "bmc_ip"
            await _end(c, await _provision(c, ip, {"booting"}), emu)
            assert [p["fingerprint"] for p in await _pins(c, ip)] == [pki.a2.fp]
        finally:
            emu.stop()
        r = await c.get("/controlnode/bmc-tls", params={"bmc_ip": "not-an-ip"}, headers=ADMIN)
        assert r.status_code == 422 and r.json()["field"] == "bmc_ip"
        assert (await c.delete(f"/controlnode/bmc-tls/{ip}")).status_code == 401


async def test_provision_with_a_ca_bundle_and_the_per_bmc_opt_out(stack, pki):
    ip = "10.99.1.5"
    stack.cfg.bmc_ca_bundle = pki.ca_pem
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        await c.delete(f"/controlnode/bmc-tls/{ip}", headers=ADMIN)
        other = bmc(pki.b1)
        try:
            _point(stack, ip, other)
            since = len(other.log())
            job = await _provision(c, ip, {"failed", "booting"}, timeout=60)
            assert job["job_status"] == "failed", job
            assert job["message"].startswith("BMC_TLS_UNTRUSTED: BMC 10.99.1.5"), job
            assert other.requests_seen(since) == []
            _point(stack, ip, other, tls="insecure")  # the explicit per-BMC opt-out
            await _end(c, await _provision(c, ip, {"booting"}), other)
        finally:
            other.stop()
        good = bmc(pki.a1)
        try:
            _point(stack, ip, good)
            await _end(c, await _provision(c, ip, {"booting"}), good)
        finally:
            good.stop()
        assert await _pins(c, ip) == []  # neither CA mode nor the opt-out pins
