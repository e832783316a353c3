"""Issue 27 through the real gateway, provisioner and inventory on the real NATS and PostgreSQL.

Inspection: against the real sushy-tools emulator (its fake driver, with the lab's FAKE_HARDWARE
prelude so it reports CPUs, memory size and BIOS version, and static Storage/Drives): ``GET
…/hardware`` is 404 HARDWARE_NOT_INSPECTED first, ``POST …/inspect`` answers the record (disks,
NICs, CPUs, memory from the emulator; what the emulator does not offer — Memory modules,
PCIeDevices, FirmwareInventory — named in ``missing``), ``GET`` returns the stored record and the
event reaches SSE.

Power-state sync: a sweep over the emulated BMCs records their states, a power change made on the
emulator by "someone else" is announced (SSE ``power_changed``, metric), one made while a job
runs is recorded silently. Rotation: ``test_bmc_rotation.py`` (the emulator has no AccountService).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import retire_leftover_jobs, write_inventory
from tests.fixtures.sse import open_sse
from tests.lab.redfish_lab import RedfishEmulator, emulator_with_two_drives, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]
INSPECTED, BARE = "10.96.0.1", "10.96.0.2"
DISK_BYTES = 899_527_000_000
MACS = ("52:54:00:aa:00:01", "52:54:00:aa:00:02")
PROCESSORS = [
    {"id": "CPU1", "Id": "CPU1", "socket": "CPU 1", "vendor": "Intel(R) Corporation",
     "model": "Intel(R) Xeon(R) Gold 6354", "cores": 18, "threads": 36},
    {"id": "CPU2", "Id": "CPU2", "socket": "CPU 2", "vendor": "Intel(R) Corporation",
     "model": "Intel(R) Xeon(R) Gold 6354", "cores": 18, "threads": 36},
]  # fmt: skip
RECORDED = Path(__file__).parents[2] / "fixtures/redfish_inventory/dell/idrac9-6.00.30.00_poweredge-r750"


@pytest.fixture(scope="module")
def emulator():
    hw = fake_system(
        "hw1",
        macs=MACS,
        power_state="On",
        processors=PROCESSORS,
        total_cpus=2,
        total_memory_gb=256,
        bios_version="2.4.1",
    )
    bare = fake_system("bare1")
    controllers = [{"MemberId": "0", "Name": "Contoso Integrated RAID", "SpeedGbps": 12}]
    try:
        emu = emulator_with_two_drives([hw, bare], hw, DISK_BYTES, StorageControllers=controllers)
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


@pytest.fixture
async def gateway(settings, serve, emulator, tmp_path):
    inventory = write_inventory(tmp_path / "inventory.yaml", [INSPECTED, BARE])
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_endpoints={
            ip: {
                "url": emulator.url,
                "system_id": sid,
                "username": emulator.username,
                "password": emulator.password,
            }
            for ip, sid in zip((INSPECTED, BARE), emulator.system_ids, strict=True)
        },
    )
    prov = provisioner_app(settings, cfg)
    running = await serve(prov)
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=90) as client:
        client.provisioner = prov  # type: ignore[attr-defined]
        client.provisioner_url = running.url  # type: ignore[attr-defined]
        yield client


async def test_inspect_reads_the_emulated_server_and_get_returns_the_stored_record(gateway, emulator) -> None:
    never = await gateway.get(f"/controlnode/bmc/{INSPECTED}/hardware")
    assert never.status_code == 404 and never.json()["code"] == "HARDWARE_NOT_INSPECTED", never.text

    async with open_sse(gateway, f"/controlnode/events?channel=node:{INSPECTED}") as sse:
        r = await gateway.post(f"/controlnode/bmc/{INSPECTED}/inspect", json={})
        assert r.status_code == 200, r.text
        events = await sse.collect(until=lambda evs: any(e.event == "hardware_inspected" for e in evs))
    rec = r.json()
    assert rec["bmc_ip"] == INSPECTED and rec["driver"] == "generic"  # "Sushy Emulator": no vendor
    assert rec["system"]["power_state"] == "On" and rec["system"]["bios_version"] == "2.4.1"
    assert rec["system"]["uuid"] == emulator.systems[0]["uuid"]
    assert rec["processor_count"] == 2 and [p["cores"] for p in rec["processors"]] == [18, 18]
    assert rec["processors"][0]["model"] == "Intel(R) Xeon(R) Gold 6354"
    assert rec["memory_total_gib"] == 256
    assert [(d["id"], d["size_bytes"], d["protocol"], d["media_type"]) for d in rec["drives"]] == [
        ("D1", DISK_BYTES, "SAS", "HDD"),
        ("D2", DISK_BYTES, "SATA", "HDD"),
    ]
    assert sorted(n["mac"] for n in rec["nics"]) == sorted(MACS)
    assert rec["bmc"]["firmware_version"] == "1.00"
    gaps = {m.split(":")[0] for m in rec["missing"]}
    assert {"Memory", "PCIeDevices", "FirmwareInventory"} <= gaps, rec["missing"]
    assert emulator.password not in r.text

    stored = await gateway.get(f"/controlnode/bmc/{INSPECTED}/hardware")
    assert stored.status_code == 200 and stored.json() == rec
    event = next(e for e in events if e.event == "hardware_inspected").json()
    assert event["data"]["drive_count"] == 2 and event["data"]["nic_count"] == 2
    assert event["data"]["processor_count"] == 2
    assert emulator.password not in json.dumps(event)


async def test_inspect_bad_input(gateway) -> None:
    assert (await gateway.post("/controlnode/bmc/not-an-ip/inspect")).json()["field"] == "bmc_ip"
    bad = await gateway.post(f"/controlnode/bmc/{INSPECTED}/inspect", json={"vendor": "acme"})
    assert bad.status_code == 422 and bad.json()["field"] == "vendor"
    anon = await gateway.post(f"/controlnode/bmc/{INSPECTED}/inspect", headers={"Authorization": ""})
    assert anon.status_code == 401


async def test_credentials_set_in_settings_are_not_rotated(gateway) -> None:
    r = await gateway.post(f"/controlnode/bmc/{INSPECTED}/rotate-credentials")
    assert r.status_code == 409 and r.json()["code"] == "BMC_ROTATION_REFUSED", r.text


# -- power-state sync -------------------------------------------------------------------------


def _power(emulator: RedfishEmulator, index: int, kind: str) -> None:
    sid = emulator.system_ids[index]
    status, _ = emulator.request(
        "POST", f"/redfish/v1/Systems/{sid}/Actions/ComputerSystem.Reset", {"ResetType": kind}
    )
    assert status in (200, 204), status
    assert emulator.get(f"/redfish/v1/Systems/{sid}")["PowerState"] == ("Off" if kind == "ForceOff" else "On")


async def test_power_sync_announces_a_change_no_job_made_and_not_one_a_job_made(
    gateway, emulator, settings
) -> None:
    from karios.provisioner.bmc import powersync

    sync = gateway.provisioner.state.power_sync
    sync.bmcs.cfg.power_sync_rate = 50.0
    await retire_leftover_jobs(settings.database_url)
    assert await sync.sweep() == []  # the first read of each BMC only records it
    before = powersync.CHANGES.labels("powered_off", "false")._value.get()

    _power(emulator, 0, "ForceOff")  # someone else powers INSPECTED off
    async with open_sse(gateway, f"/controlnode/events?channel=node:{INSPECTED}") as sse:
        (change,) = await sync.sweep()
        events = await sse.collect(until=lambda evs: any(e.event == "power_changed" for e in evs))
    assert (change.bmc_ip, change.previous, change.current, change.change) == (
        INSPECTED,
        "On",
        "Off",
        "powered_off",
    )
    data = next(e for e in events if e.event == "power_changed").json()["data"]
    assert data["change"] == "powered_off" and data["previous_read_at"] < data["observed_at"]
    assert powersync.CHANGES.labels("powered_off", "false")._value.get() == before + 1
    assert powersync.IN_STATE.labels("Off")._value.get() == 2  # INSPECTED and BARE
    assert await sync.sweep() == []  # no change, no event

    from karios.provisioner.jobs.repository import now

    row = {"id": "job-powering", "bmc_ip": INSPECTED, "state": "booting", "spec": {}}
    await gateway.provisioner.state.jobs.repo.insert({**row, "created_at": now(), "updated_at": now()})
    _power(emulator, 0, "On")  # a job's own reset: recorded, not announced
    during = powersync.CHANGES.labels("powered_on", "true")._value.get()
    assert await sync.sweep() == []
    assert powersync.CHANGES.labels("powered_on", "true")._value.get() == during + 1
    await retire_leftover_jobs(settings.database_url)
    async with httpx.AsyncClient() as c:
        exposed = (await c.get(f"{gateway.provisioner_url}/metrics")).text
    assert 'karios_bmc_power_changes_total{change="powered_off",during_job="false"}' in exposed
    assert 'karios_bmc_power_state{state="Off"}' in exposed and "karios_bmc_power_reads_total" in exposed
