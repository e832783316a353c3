"""BMC credential rotation (issue 27 item 8) through the real gateway, provisioner and inventory
on the real NATS and PostgreSQL, against a recorded BMC.

sushy-tools 2.2.0 has no AccountService (no route for it in its ``main.py``, no SessionService
either), so the BMC is the Dell R750 capture (``tests/fixtures/redfish_inventory``) served by
``RecordedBmc``: it enforces HTTP basic auth and takes a ``Password`` PATCH on the account in use.
Where that stops: the recorded BMC has no sessions (the driver falls back to basic auth, so the
check is ``verified_by: basic``), no password policy beyond the 400 it is told to give, and no
lockout; a real iDRAC/iLO/XCC's policy and session behaviour are not exercised here.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.common.contracts.inventory import BmcAccess, BmcAccessQuery
from karios.common.crypto import SecretBox
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import retire_leftover_jobs, write_inventory
from tests.fixtures.redfish_mockup import RecordedBmc
from tests.fixtures.sse import open_sse

pytestmark = [pytest.mark.integration]
RECORDED = Path(__file__).parents[2] / "fixtures/redfish_inventory/dell/idrac9-6.00.30.00_poweredge-r750"

ROTATED = "10.96.0.3"
OLD = "calvin-Old-1"


@pytest.fixture
async def rotation(settings, serve, tmp_path):
    """Gateway + inventory + provisioner; the provisioner's BMC at ROTATED is the recorded iDRAC."""
    await retire_leftover_jobs(settings.database_url)  # another test's running job on ROTATED
    inventory = write_inventory(tmp_path / "inventory.yaml", [ROTATED])
    inv = inventory_app(settings.model_copy(update={"inventory_file": inventory}))
    await serve(inv)
    bmc = RecordedBmc(RECORDED, username="root", password=OLD, accounts=True)
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        bmc_retries=0,
        bmc_endpoints={ROTATED: {"url": "http://recorded-bmc.test"}},  # address only: creds from the registry
    )
    prov = provisioner_app(settings, cfg)

    def factory(cls, ep):  # type: ignore[no-untyped-def]
        return cls(ep, transport=bmc.transport())

    prov.state.rotation.driver_factory = factory
    await serve(prov)
    gw = await serve(gateway_app(settings))
    box = SecretBox.from_settings(settings)
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=90) as client:
        reg = await client.post(
            "/controlnode/register",
            json={"bmc_ip": ROTATED, "bmc_username": "root", "bmc_password": OLD, "vendor": "dell"},
        )
        assert reg.status_code in (200, 201), reg.text
        yield client, bmc, box, prov


async def _stored_password(prov, box: SecretBox) -> str:  # type: ignore[no-untyped-def]
    bus = prov.state.jobs.bus
    access = await bus.request(
        bus.subjects.query("inventory", "bmc_access"), BmcAccessQuery(bmc_ip=ROTATED), reply=BmcAccess
    )
    return box.decrypt(access.password_enc, context=f"bmc:{ROTATED}")


async def test_rotation_sets_verifies_and_stores_a_new_password_never_shown(rotation) -> None:
    client, bmc, box, prov = rotation
    async with open_sse(client, f"/controlnode/events?channel=node:{ROTATED}") as sse:
        r = await client.post(f"/controlnode/bmc/{ROTATED}/rotate-credentials")
        assert r.status_code == 200, r.text
        events = await sse.collect(until=lambda evs: any(e.event == "bmc_credentials_rotated" for e in evs))
    body = r.json()
    new = bmc.password
    assert new != OLD and len(new) == 16
    assert body["username"] == "root" and body["verified_by"] == "basic" and body["stored_in"] == "registry"
    assert body["account_uri"] == "/redfish/v1/AccountService/Accounts/2"
    assert await _stored_password(prov, box) == new  # the registry has it, encrypted
    assert new not in r.text and OLD not in r.text
    event = next(e for e in events if e.event == "bmc_credentials_rotated")
    assert new not in json.dumps(event.json()) and event.json()["data"]["username"] == "root"
    assert bmc.logins[-1] == ("root", True)  # the check logged in with the new password
    assert [p for _, p in bmc.patches] == [{"Password": "***"}]

    # the provisioner now reaches the BMC with the rotated password (an inspection, say)
    again = await client.post(f"/controlnode/bmc/{ROTATED}/rotate-credentials")
    assert again.status_code == 200 and bmc.password not in (new, OLD)


async def test_a_password_the_bmc_refuses_changes_nothing(rotation) -> None:
    client, bmc, box, prov = rotation
    bmc.reject_password = True
    r = await client.post(f"/controlnode/bmc/{ROTATED}/rotate-credentials")
    assert r.status_code == 502 and r.json()["code"] == "BMC_ROTATION_FAILED", r.text
    assert r.json()["details"] == {"rolled_back": True, "step": "patch"}
    assert bmc.password == OLD and await _stored_password(prov, box) == OLD


async def test_a_bmc_that_ignores_the_patch_fails_the_check_and_keeps_the_old_password(rotation) -> None:
    client, bmc, box, prov = rotation
    bmc.ignore_patch = True  # answers 204 and keeps the old password
    r = await client.post(f"/controlnode/bmc/{ROTATED}/rotate-credentials")
    assert r.status_code == 502 and r.json()["details"] == {"rolled_back": True, "step": "verify"}, r.text
    assert bmc.password == OLD and await _stored_password(prov, box) == OLD
    assert len(bmc.patches) == 2  # the new password, then the old one put back


async def test_a_bmc_missing_from_the_registry_is_not_rotated(rotation) -> None:
    client, bmc, *_ = rotation
    unknown = await client.post("/controlnode/bmc/10.96.9.9/rotate-credentials")
    assert unknown.status_code == 404 and unknown.json()["field"] == "bmc_ip", unknown.text
    assert bmc.patches == []


async def test_a_bmc_with_a_running_job_is_not_rotated(rotation) -> None:
    client, bmc, box, prov = rotation
    from karios.provisioner.jobs.repository import now

    row = {"id": "job-on-rotated", "bmc_ip": ROTATED, "state": "mounting", "spec": {}}
    await prov.state.jobs.repo.insert({**row, "created_at": now(), "updated_at": now()})
    r = await client.post(f"/controlnode/bmc/{ROTATED}/rotate-credentials")
    assert r.status_code == 409 and r.json()["code"] == "BMC_ROTATION_REFUSED", r.text
    assert r.json()["details"] == {"job_id": "job-on-rotated"} and bmc.patches == []
    assert await _stored_password(prov, box) == OLD


async def test_the_rotated_password_is_in_no_log_event_or_answer(rotation, caplog) -> None:
    caplog.set_level("DEBUG")
    client, bmc, *_ = rotation
    bmc.ignore_patch = True  # a failed rotation (and its rollback) logs the most
    assert (await client.post(f"/controlnode/bmc/{ROTATED}/rotate-credentials")).status_code == 502
    bmc.ignore_patch = False
    r = await client.post(f"/controlnode/bmc/{ROTATED}/rotate-credentials")
    assert r.status_code == 200
    logs = caplog.text + "".join(str(r.msg) for r in caplog.records)
    assert "BMC password rotated" in logs  # the logs were captured
    for pw in (OLD, bmc.password):
        assert pw not in logs and pw not in r.text
