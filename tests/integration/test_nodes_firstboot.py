"""First-boot auto-registration (issue 13 item 3) and the installer callbacks' contract (issue 12
item 7): real NATS + PostgreSQL, the sushy-tools Redfish emulator, the real inventory,
provisioner and gateway.

A provision job on the emulator whose first-boot callback is posted (as the installed OS does)
makes the node a compute node of the fabric's node set, with the credentials the installer set;
a repeated first boot is refused and neither duplicates nor moves it. Unauthenticated callbacks
answer the same way whether or not the job or BMC exists (no existence oracle), and the OpenAPI
document says so.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.common.contracts.inventory import NodeAccess, NodeAccessQuery
from karios.common.contracts.nodes import password_context
from karios.common.crypto import SecretBox
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import (
    medium_token,
    retire_leftover_jobs,
    use_installer_media,
    wait_job,
    write_inventory,
)
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]
BMCS = ["10.96.0.1", "10.96.0.2"]
OS_IP = "10.96.1.21"
OS_PASSWORD = "fb-S3cret-pw"
MISSING_JOB = "00000000-0000-4000-8000-000000000000"


@pytest.fixture(scope="module")
def emulator():
    try:
        emu = RedfishEmulator([fake_system(f"fb{i}") for i in (1, 2)], auth=True)
        emu.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


@pytest.fixture
async def stack(settings, serve, emulator, tmp_path_factory):
    await retire_leftover_jobs(settings.database_url)
    inventory = write_inventory(tmp_path_factory.mktemp("inventory") / "inventory.yaml", BMCS)
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    cfg = ProvisionerConfig(
        cache_dir=Path(tempfile.gettempdir()) / "karios-test-media-cache",
        media_dir=tmp_path_factory.mktemp("media"),
        images_dir=tmp_path_factory.mktemp("images"),
        stage_deadline=600,
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=15,
        power_deadline=20,
        install_method="preseed",
        bmc_endpoints={
            ip: {
                "url": emulator.url,
                "system_id": sid,
                "username": emulator.username,
                "password": emulator.password,
            }
            for ip, sid in zip(BMCS, emulator.system_ids, strict=True)
        },
    )
    prov_app = provisioner_app(settings, cfg)
    use_installer_media(prov_app.state.jobs)
    prov = await serve(prov_app)
    gw = await serve(gateway_app(settings))
    cfg.media_url, cfg.callback_url = prov.url, gw.url
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        yield c, cfg, gw.app
    for ip in (OS_IP, "10.96.1.22"):
        await _sql(settings, "DELETE FROM inventory.compute_nodes WHERE node_ip = :ip", ip=ip)


async def _sql(settings, stmt: str, **params):  # type: ignore[no-untyped-def]
    from tests.fixtures.fabric import sql

    return await sql(settings, stmt, **params)


async def _provision_to_booting(c: httpx.AsyncClient, cfg: ProvisionerConfig, bmc: str) -> tuple[str, str]:
    body = {"bmc_IP": bmc, "vendor": "dell", "hostname": "fb-node", "os_password": OS_PASSWORD}
    r = await c.post("/controlnode/provision/dell", json=body, headers=ADMIN)
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    await wait_job(c, job, {"booting"}, timeout=120)
    token, _ = medium_token(cfg.media_dir / f"{job}.iso")
    return job, token


async def test_first_boot_registers_the_node_as_a_compute_node_once(stack, settings):
    c, cfg, gw_app = stack
    job, token = await _provision_to_booting(c, cfg, BMCS[0])
    h = {"X-Karios-Job-Token": token}
    assert (
        await c.post(f"/controlnode/job/{job}/complete", json={"os_ip": OS_IP}, headers=h)
    ).status_code == 200
    r = await c.post("/controlnode/firstboot", json={"bmc_ip": BMCS[0], "os_ip": OS_IP}, headers=h)
    assert r.status_code == 200 and r.json()["state"] == "completed", r.text

    r = await c.get(f"/controlnode/nodes/{OS_IP}", headers=ADMIN)
    assert r.status_code == 200, r.text
    node = r.json()
    assert (node["source"], node["bmc_ip"], node["hostname"], node["os_username"], node["auth"]) == (
        "firstboot",
        BMCS[0],
        "fb-node",
        "debian",
        "password",
    )
    assert node["host_key_fingerprint"] == ""  # pinned at the fabric's first contact
    assert OS_PASSWORD not in r.text

    # In the fabric's node set, with the password the installer set (as ciphertext on the bus).
    rt = gw_app.state.runtime
    raw = await rt.bus.request(
        rt.bus.subjects.query("inventory", "node_access"), NodeAccessQuery(node_ip=OS_IP)
    )
    (access,) = [NodeAccess.model_validate(a) for a in raw]
    assert access.source == "firstboot" and access.bmc_ip == BMCS[0] and access.os_password_enc
    assert OS_PASSWORD not in access.model_dump_json()
    box = SecretBox.from_settings(settings)
    assert box.decrypt(access.os_password_enc, context=password_context(OS_IP)) == OS_PASSWORD

    # A repeated first boot is refused (the token of a completed job accepts nothing: issue 24
    # S1) and neither duplicates nor moves the node.
    for ip in (OS_IP, "10.96.1.22"):
        r = await c.post("/controlnode/firstboot", json={"bmc_ip": BMCS[0], "os_ip": ip}, headers=h)
        assert r.status_code == 409 and "no longer accepts /firstboot" in r.json()["message"], r.text
    listed = [n for n in (await c.get("/controlnode/nodes?limit=1000", headers=ADMIN)).json()["items"]]
    assert [n["node_ip"] for n in listed if n["bmc_ip"] == BMCS[0]] == [OS_IP]
    rows = await _sql(
        settings, "SELECT count(*) AS n FROM inventory.compute_nodes WHERE bmc_ip = :b", b=BMCS[0]
    )
    assert rows[0]["n"] == 1

    # A node registered by BMC with an OS IP (the seed's register) is in the node set too.
    reg = {"bmc_ip": "10.96.0.9", "os_ip": "10.96.1.29", "os_username": "root", "fqdn": "reg-node"}
    assert (await c.post("/controlnode/register", json=reg, headers=ADMIN)).status_code == 200
    r = await c.get("/controlnode/nodes/10.96.1.29", headers=ADMIN)
    assert (r.json()["source"], r.json()["bmc_ip"], r.json()["hostname"]) == (
        "registry",
        "10.96.0.9",
        "reg-node",
    )
    await _sql(settings, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = '10.96.0.9'")


async def test_callbacks_give_no_existence_oracle(stack):
    c, cfg, _ = stack
    job, token = await _provision_to_booting(c, cfg, BMCS[1])
    wrong = {"X-Karios-Job-Token": "not-the-token"}
    step = {"step": "a", "state": "active"}

    def same(a: httpx.Response, b: httpx.Response) -> None:
        assert (a.status_code, a.json()) == (b.status_code, b.json()), (a.text, b.text)
        assert a.status_code == 401 and a.json()["code"] == "UNAUTHORIZED"

    for headers in (wrong, {}):
        # An existing job with a wrong (or no) token, and a job that does not exist.
        same(
            await c.post(f"/controlnode/job/{job}/step", json=step, headers=headers),
            await c.post(f"/controlnode/job/{MISSING_JOB}/step", json=step, headers=headers),
        )
        same(
            await c.post(f"/controlnode/job/{job}/complete", json={"os_ip": "10.96.1.22"}, headers=headers),
            await c.post(
                f"/controlnode/job/{MISSING_JOB}/complete", json={"os_ip": "10.96.1.22"}, headers=headers
            ),
        )
        # A BMC with a job and a BMC Karios never heard of.
        same(
            await c.post(
                "/controlnode/firstboot", json={"bmc_ip": BMCS[1], "os_ip": "10.96.1.22"}, headers=headers
            ),
            await c.post(
                "/controlnode/firstboot", json={"bmc_ip": "10.96.9.9", "os_ip": "10.96.1.22"}, headers=headers
            ),
        )
    # cloud-init's phone_home (token in the query): a wrong token and a missing job alike.
    form = {"instance_id": "karios-x", "hostname": "h"}
    for query in ("?token=not-the-token", ""):
        same(
            await c.post(f"/controlnode/job/{job}/phone-home{query}", data=form),
            await c.post(f"/controlnode/job/{MISSING_JOB}/phone-home{query}", data=form),
        )
    # The right token still works (the job is untouched by the attempts above).
    r = await c.post(f"/controlnode/job/{job}/step", json=step, headers={"X-Karios-Job-Token": token})
    assert r.status_code == 200, r.text
    # phone_home before the install completed: the job's state does not accept a first boot yet.
    r = await c.post(f"/controlnode/job/{job}/phone-home?token={token}", data=form)
    assert r.status_code == 409, r.text
    # After /complete, cloud-init's phone_home is the first boot of a whole-disk image: same job,
    # same token, the address /complete reported; what cloud-init posted is in the job's message.
    h = {"X-Karios-Job-Token": token}
    assert (
        await c.post(f"/controlnode/job/{job}/complete", json={"os_ip": "10.96.1.22"}, headers=h)
    ).is_success
    form = {
        "instance_id": f"karios-{job}",
        "hostname": "fb-node",
        "fqdn": "fb.example",
        "pub_key_ed25519": "k",
    }
    r = await c.post(f"/controlnode/job/{job}/phone-home?token={token}", data=form)
    assert r.status_code == 200 and r.json()["state"] == "completed", r.text
    said = f"instance_id=karios-{job}, hostname=fb-node, fqdn=fb.example"
    assert r.json()["message"] == f"first boot from 10.96.1.22: cloud-init phone_home ({said})", r.text
    r = await c.get("/controlnode/nodes/10.96.1.22", headers=ADMIN)
    assert r.status_code == 200 and r.json()["bmc_ip"] == BMCS[1], r.text
    r = await c.post(f"/controlnode/job/{job}/phone-home?token={token}", data=form)  # once only
    assert r.status_code == 409, r.text

    # The published contract documents 401/404/409 with the one error model.
    doc = (await c.get("/openapi.json")).json()
    for path in (
        "/controlnode/job/{id}/step",
        "/controlnode/job/{id}/complete",
        "/controlnode/firstboot",
        "/controlnode/job/{id}/phone-home",
    ):
        responses = doc["paths"][path]["post"]["responses"]
        for code in ("401", "404", "409"):
            schema = responses[code]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, code, schema)
