"""Issue 27 item 2: ``GET /controlnode/bmc/{ip}/hardware/diff`` through the real gateway,
provisioner and inventory (the YAML file inventory) on the real NATS and PostgreSQL, against the
sushy-tools emulator (two drives, two NICs).

The inventory first lists one of the two drives and one of the two MACs plus a MAC the server does
not have: after an inspection the diff names the drive only the BMC reports and the MAC only the
inventory lists. Then the inventory is corrected (a new inventory service on the corrected file)
and the same record is in sync.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from karios.api_gateway.app import create_app as gateway_app
from karios.common.contracts.hardware import usable_dmi
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN, start_app
from tests.lab.redfish_lab import emulator_with_two_drives, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab]
BMC, NEVER = "10.96.1.1", "10.96.1.2"
DISK_BYTES = 899_527_000_000
MACS = ("52:54:00:ab:00:01", "52:54:00:ab:00:02")
STRANGER = "52:54:00:ab:00:99"


@pytest.fixture(scope="module")
def emulator():
    hw = fake_system("diff1", macs=MACS, power_state="On")
    never = fake_system("diff2")
    try:
        emu = emulator_with_two_drives([hw, never], hw, DISK_BYTES)
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


def write(path: Path, disks: list[str], macs: list[str], serial: str = "") -> Path:
    devices = [
        {
            "id": 1,
            "name": "node-diff-1",
            "oob_ip": BMC,
            "serial": serial,
            "disks": [{"name": d, "size_gb": 899.5, "bus": "sas"} for d in disks],
            "interfaces": [
                {"name": "bmc", "mgmt_only": True, "ipv4": [f"{BMC}/24"], "macs": ["52:54:00:ab:ff:ff"]}
            ]
            + [{"name": f"eth{n}", "macs": [m]} for n, m in enumerate(macs)],
        },
        {"id": 2, "name": "node-diff-2", "oob_ip": NEVER},
    ]
    path.write_text(yaml.safe_dump({"devices": devices}, sort_keys=False))
    return path


@pytest.fixture
async def stack(settings, serve, emulator, tmp_path):
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
            for ip, sid in zip((BMC, NEVER), emulator.system_ids, strict=True)
        },
    )
    await serve(provisioner_app(settings, cfg))
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=90) as client:
        yield client


async def test_diff_names_a_disk_only_the_bmc_has_and_a_mac_only_the_inventory_has(
    stack, settings, tmp_path
) -> None:
    path = tmp_path / "inventory.yaml"
    inv = await start_app(
        inventory_app(
            settings.model_copy(update={"inventory_file": write(path, ["sda"], [MACS[0], STRANGER])})
        )
    )
    try:
        never = await stack.get(f"/controlnode/bmc/{NEVER}/hardware/diff")
        assert never.status_code == 404 and never.json()["code"] == "HARDWARE_NOT_INSPECTED", never.text
        bad = await stack.get("/controlnode/bmc/not-an-ip/hardware/diff")
        assert bad.status_code == 422 and bad.json()["field"] == "bmc_ip"
        assert (
            await stack.get(f"/controlnode/bmc/{BMC}/hardware/diff", headers={"Authorization": ""})
        ).status_code == 401

        rec = await stack.post(f"/controlnode/bmc/{BMC}/inspect", json={})
        assert rec.status_code == 200, rec.text
        serial = usable_dmi(rec.json()["system"]["serial"])
        r = await stack.get(f"/controlnode/bmc/{BMC}/hardware/diff")
        assert r.status_code == 200, r.text
        diff = r.json()
        assert diff["bmc_ip"] == BMC and diff["device_name"] == "node-diff-1" and diff["in_sync"] is False
        assert diff["inspected_at"] == rec.json()["inspected_at"]
        assert [i["name"] for i in diff["disks"]["only_bmc"]] == ["D2"], diff["disks"]
        assert diff["disks"]["only_inventory"] == [] and diff["disks"]["matched"] == 1
        assert [i["key"] for i in diff["nics"]["only_inventory"]] == [STRANGER]
        assert [i["key"] for i in diff["nics"]["only_bmc"]] == [MACS[1]]
        assert diff["nics"]["matched"] == 1
        # PCIeDevices: the emulator offers none, so GPUs are not compared
        assert not diff["gpus"]["checked"] and any(u.startswith("gpus: PCIe") for u in diff["unchecked"])
        if serial:  # the inventory lists no serial: the BMC's is one more difference
            assert [i["key"] for i in diff["serial"]["only_bmc"]] == [serial] and diff["differences"] == 4
        else:  # sushy-tools reports none: not compared
            assert "serial: the BMC reported no usable system serial" in diff["unchecked"]
            assert diff["differences"] == 3
    finally:
        await inv.stop()

    # the inventory corrected: both drives, both MACs, the server's serial
    fixed = write(path, ["sda", "sdb"], list(MACS), serial)
    inv = await start_app(inventory_app(settings.model_copy(update={"inventory_file": fixed})))
    try:
        r = await stack.get(f"/controlnode/bmc/{BMC}/hardware/diff")
        assert r.status_code == 200, r.text
        diff = r.json()
        assert diff["in_sync"] is True and diff["differences"] == 0, diff
        assert (diff["disks"]["matched"], diff["nics"]["matched"]) == (2, 2)
    finally:
        await inv.stop()
