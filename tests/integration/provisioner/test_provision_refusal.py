"""Issue 27 item 2 (the refusal rule) through the real gateway, provisioner and inventory on the real
NATS and PostgreSQL: a provision whose ``selected_disks`` / ``selected_nic_mac`` /
``gpu_passthrough`` contradicts the BMC's stored hardware record answers 409 naming the field,
before any job exists; no record, or a request the record agrees with, is accepted (202).

The record comes from a real inspection of the sushy-tools emulator (its drives report serial
1234570, its NICs the MACs below; it offers no PCIeDevices, so ``gpu_passthrough`` is not judged
there) and, for the GPU rule, from a record stored as an inspection of a server with PCIe devices
and no GPU would store it (the emulator cannot show PCIe devices).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from karios.api_gateway.app import create_app as gateway_app
from karios.common.contracts.hardware import HardwareRecord, PcieDevice
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import retire_leftover_jobs
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]
INSPECTED, BARE, GPU_LESS = "10.95.0.1", "10.95.0.2", "10.95.0.3"
MACS = ("52:54:00:bb:00:01", "52:54:00:bb:00:02")
EMULATOR_SERIAL = "1234570"  # sushy-tools 2.2.0 drive.json: every drive has this serial


@pytest.fixture(scope="module")
def emulator():
    hw = fake_system("refuse1", macs=MACS, power_state="On")
    storage = {hw["uuid"]: [{"Id": "1", "Name": "Local Storage Controller", "Drives": ["D1", "D2"]}]}
    drives = {
        (hw["uuid"], "1"): [
            {"Id": "D1", "Name": "Drive 1", "CapacityBytes": 10**12, "Protocol": "SAS"},
            {"Id": "D2", "Name": "Drive 2", "CapacityBytes": 10**12, "Protocol": "SAS"},
        ]
    }
    try:
        emu = RedfishEmulator(
            [hw, fake_system("refuse2")],
            extra_config={"SUSHY_EMULATOR_STORAGE": storage, "SUSHY_EMULATOR_DRIVES": drives},
        ).start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


def _inventory(path: Path) -> Path:
    disks = [
        {"name": "sda", "serial": EMULATOR_SERIAL, "size_gb": 1000},
        {"name": "sdb", "serial": "WD-NOT-IN-THIS-SERVER", "size_gb": 1000},
        {"name": "sdc", "size_gb": 1000},  # no serial: cannot be compared
    ]
    devices = [
        {"id": n, "name": f"node-{ip.replace('.', '-')}", "oob_ip": ip, "disks": disks}
        for n, ip in enumerate((INSPECTED, BARE, GPU_LESS), 1)
    ]
    path.write_text(yaml.safe_dump({"devices": devices}, sort_keys=False))
    return path


@pytest.fixture
async def gateway(settings, serve, emulator, tmp_path):
    await retire_leftover_jobs(settings.database_url)
    await serve(
        inventory_app(settings.model_copy(update={"inventory_file": _inventory(tmp_path / "inv.yaml")}))
    )
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        bmc_retries=1,
        bmc_backoff=0.1,
        # An accepted provision stays queued (no slot for "generic"): the 202 is what is tested,
        # not the job's work (no medium is built).
        admission_vendors={"generic": 0},
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
    await serve(prov)
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=90) as client:
        client.provisioner = prov  # type: ignore[attr-defined]
        yield client
    await retire_leftover_jobs(settings.database_url)


def body(ip: str, **fields) -> dict:
    return {"bmc_IP": ip, "vendor": "generic", "hostname": "refusal", "selected_disks": ["sda"], **fields}


async def test_a_provision_contradicting_the_inspected_hardware_is_refused_naming_the_field(gateway) -> None:
    r = await gateway.post(f"/controlnode/bmc/{INSPECTED}/inspect", json={})
    assert r.status_code == 200, r.text
    rec = r.json()
    assert {d["serial"] for d in rec["drives"]} == {EMULATOR_SERIAL}
    assert sorted(n["mac"] for n in rec["nics"]) == sorted(MACS)

    disk = await gateway.post("/controlnode/provision", json=body(INSPECTED, selected_disks=["sdb"]))
    assert disk.status_code == 409, disk.text
    assert disk.json()["code"] == "HARDWARE_CONTRADICTION" and disk.json()["field"] == "selected_disks"
    assert "sdb (serial WD-NOT-IN-THIS-SERVER in the inventory)" in disk.json()["message"]

    nic = await gateway.post(
        "/controlnode/provision", json=body(INSPECTED, selected_nic_mac="52:54:00:ff:ff:ff")
    )
    assert nic.status_code == 409 and nic.json()["field"] == "selected_nic_mac", nic.text
    assert "52:54:00:ff:ff:ff is not the MAC of any NIC the BMC reported" in nic.json()["message"]

    # the emulator offers no PCIeDevices: the record cannot tell, so a GPU request is not judged
    assert "PCIeDevices" in {m.split(":")[0] for m in rec["missing"]}
    jobs = await gateway.get("/controlnode/jobs", params={"bmc_ip": INSPECTED})
    assert jobs.status_code == 200 and jobs.json()["total"] == 0, "a refused provision made a job"

    ok = await gateway.post(
        "/controlnode/provision",
        json=body(
            INSPECTED,
            selected_disks=["sda", "sdc"],
            pool_type="mirror",
            selected_nic_mac=MACS[1].upper(),
            gpu_passthrough=True,
        ),
    )
    assert ok.status_code == 202, ok.text  # consistent (sdc has no serial to compare)


async def test_no_hardware_record_means_no_refusal(gateway) -> None:
    assert (await gateway.get(f"/controlnode/bmc/{BARE}/hardware")).status_code == 404
    r = await gateway.post(
        "/controlnode/provision",
        json=body(BARE, selected_disks=["sdb"], selected_nic_mac="52:54:00:ff:ff:ff", gpu_passthrough=True),
    )
    assert r.status_code == 202, r.text


async def test_gpu_passthrough_on_a_server_whose_record_has_no_gpu_is_refused(gateway) -> None:
    nic = PcieDevice(id="NIC.Slot.1", device_class="NetworkController", vendor_id="15b3", device_id="101d")
    gpu = PcieDevice(
        id="GPU.Slot.2", device_class="DisplayController", vendor_id="10de", device_id="2331", is_gpu=True
    )
    store = gateway.provisioner.state.hardware.store
    record = HardwareRecord(bmc_ip=GPU_LESS, inspected_at="2026-12-04T10:00:00+00:00", driver="dell")
    await store.save(record.model_copy(update={"pcie_devices": [nic]}))

    r = await gateway.post("/controlnode/provision", json=body(GPU_LESS, gpu_passthrough=True))
    assert r.status_code == 409, r.text
    assert r.json()["field"] == "gpu_passthrough" and "reported no GPU" in r.json()["message"]

    await store.save(
        record.model_copy(
            update={"inspected_at": "2026-12-04T11:00:00+00:00", "pcie_devices": [nic, gpu], "gpus": [gpu]}
        )
    )
    wrong = await gateway.post("/controlnode/provision", json=body(GPU_LESS, gpu_passthrough=["10de:20b5"]))
    assert wrong.status_code == 409 and wrong.json()["field"] == "gpu_passthrough", wrong.text
    assert "no GPU with id 10de:20b5" in wrong.json()["message"]
    # not provisioned: GPU_LESS has no BMC endpoint, so the accepted case is the 404-free 202 below
    right = await gateway.post("/controlnode/provision", json=body(GPU_LESS, gpu_passthrough=["10de:2331"]))
    assert right.status_code == 202, right.text
