"""The NetBox write-back (issue 27 item 2) against the real NetBox 4.7.3 (tests/lab/netbox.sh), with
the real inventory on the real NATS and PostgreSQL.

- An inspection (the ``hardware.inspected`` event; the record from a stand-in provisioner on the
  bus) is written to the device whose out-of-band IP is the BMC's: a new interface with its MAC, a
  MAC on an interface of the same name, inventory items for the new disk and GPU, empty fields of
  the operator's disk filled; one journal entry. The next inspection (same hardware) leaves every
  object as it was and adds one journal entry ("No change"); the same inspection delivered again
  adds none. Nothing the operator created is deleted or renamed.
- Adoption of a discovered server through the gateway and the real provisioner creates the device
  in status ``planned`` (device type from its DMI make and model, created with its manufacturer
  when NetBox has none) with its interfaces and MACs, disks and ``pxe_enabled`` false:
  ``netbox_written`` true and the device id; adopting again finds the same device.
- With the setting off nothing is written: no consumer of the event exists, the adoption answers
  ``netbox_written`` false naming the setting, and NetBox holds no such device.

Objects are created through the API with a per-run suffix and deleted afterwards. Skipped with the
reason when the lab is unavailable; under CI=true that fails instead.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import pynetbox
import pytest
from nats.js.errors import NotFoundError
from pydantic import SecretStr

from karios.api_gateway.app import create_app as gateway_app
from karios.common.bus.runtime import Bus
from karios.common.contracts.discovery import DiscoveryRecorded, DiscoveryReport, RecordDiscovery
from karios.common.contracts.hardware import (
    Drive,
    HardwareInspected,
    HardwareQuery,
    HardwareRecord,
    NetworkInterface,
    PcieDevice,
    SystemInfo,
)
from karios.common.errors import NotFound
from karios.inventory.app import create_app as inventory_app
from karios.inventory.netbox_store import NetBoxStore
from karios.inventory.settings import InventorySettings
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.netbox import netbox_lab_env
from tests.fixtures.wait import wait_until
from tests.lab.netbox_lab import LabDevice, NetBoxLab

pytestmark = [pytest.mark.lab, pytest.mark.netbox, pytest.mark.timeout(2700)]
METRIC = re.compile(r'^karios_inventory_writeback_total\{kind="(\w+)",result="(\w+)"\} ([0-9.]+)$', re.M)


@pytest.fixture(scope="module")
def netbox_env() -> dict[str, str]:
    return netbox_lab_env()


@pytest.fixture(scope="module")
def nb_lab(netbox_env):
    lab = NetBoxLab(pynetbox.api(netbox_env["NETBOX_URL"], token=netbox_env["NETBOX_TOKEN"]))
    try:
        lab.shared()
        lab.base()
        yield lab
    finally:
        lab.cleanup()


@pytest.fixture
def nb_settings(settings, netbox_env):
    settings.netbox_url = netbox_env["NETBOX_URL"]
    settings.netbox_token = SecretStr(netbox_env["NETBOX_TOKEN"])
    return settings


def inv_settings(nb_lab: NetBoxLab, *, on: bool) -> InventorySettings:
    return InventorySettings(
        _env_file=None,  # type: ignore[call-arg]
        writeback=on,
        writeback_site=nb_lab.site.slug,
        writeback_role=nb_lab.role.slug,
        changelog_interval=0,
    )


class StandInProvisioner:
    """Answers ``q.provision.hardware`` from a table, and publishes ``hardware.inspected`` as the
    provisioner does after an inspection."""

    def __init__(self, bus: Bus) -> None:
        self.bus, self.records, self.asked = bus, {}, 0
        bus.query_responder(bus.subjects.query("provision", "hardware"), HardwareQuery, self.hardware)

    async def hardware(self, q: HardwareQuery) -> HardwareRecord:
        self.asked += 1
        if q.bmc_ip not in self.records:
            raise NotFound(f"bmc_ip: {q.bmc_ip} never inspected", field="bmc_ip")
        return self.records[q.bmc_ip]

    async def inspected(self, rec: HardwareRecord) -> None:
        self.records[rec.bmc_ip] = rec
        await self.bus.publish_event(
            HardwareInspected.of(rec), self.bus.subjects.evt("inventory", "hardware.inspected", rec.bmc_ip)
        )


@pytest.fixture
async def provisioner(nb_settings):
    bus = Bus.from_settings(nb_settings, "provisioner")
    stand_in = StandInProvisioner(bus)
    await bus.start()
    yield stand_in
    await bus.stop()


def record(node: LabDevice, suffix: str, at: str) -> HardwareRecord:
    """What a BMC reports of ``node``: eno1 (known MAC), eno2 with a second MAC (a port NetBox
    names but with another MAC), a new port, the BMC host link; the operator's disk nvme0, a new
    disk and a new GPU; the operator's GPU."""
    return HardwareRecord(
        bmc_ip=node.bmc_ip,
        inspected_at=at,
        driver="dell",
        system=SystemInfo(manufacturer="Dell Inc.", model="PowerEdge R760", serial=f"SRV{suffix}"),
        nics=[
            NetworkInterface(id="eno1", mac=node.macs["eno1"], speed_mbps=25000),
            NetworkInterface(id="eno2", mac=node.macs["eno2"][:-2] + "f2", speed_mbps=25000),
            NetworkInterface(id="NIC.Slot.3-1", mac=node.macs["eno1"][:-2] + "31", speed_mbps=100000),
            NetworkInterface(id="ToManager", mac="0a:8f:c3:a5:8a:71", host_interface=True),
        ],
        drives=[
            Drive(id="nvme0", name="nvme0", model="PM9A3", serial=f"S64G{suffix}0",
                  size_bytes=3_840_755_982_336, size_gb=3840.8, protocol="NVMe", media_type="SSD"),
            Drive(id="Disk.Bay.4", name="Disk 4", model="MZ7L3480", serial=f"NEWDISK{suffix}",
                  size_bytes=480_103_981_056, size_gb=480.1, protocol="SATA", media_type="SSD"),
        ],
        gpus=[
            PcieDevice(id="0000:c1:00.0", name="L40S", model="L40S", serial=f"GPU{suffix}", vendor_id="10de",
                       device_id="26b9", is_gpu=True),
            PcieDevice(id="0000:c2:00.0", name="H100", model="H100 PCIe", serial=f"NEWGPU{suffix}",
                       manufacturer="NVIDIA", vendor_id="10de", device_id="2331", is_gpu=True),
        ],
    )  # fmt: skip


def snapshot(nb: Any, device_id: int) -> dict[str, Any]:
    """Every object of the device the write-back may touch, by id."""
    ifaces = {}
    for i in map(dict, nb.dcim.interfaces.filter(device_id=device_id)):
        macs = sorted(m["mac_address"].lower() for m in i["mac_addresses"])
        primary = (i["primary_mac_address"] or {}).get("mac_address", "").lower()
        ifaces[i["id"]] = (i["name"], macs, primary)
    items = {}
    for i in map(dict, nb.dcim.inventory_items.filter(device_id=device_id)):
        role = (i["role"] or {}).get("slug")
        items[i["id"]] = (i["name"], i["serial"], role, i["part_id"], i["description"], i["discovered"])
    macs = sorted(m.id for m in nb.dcim.mac_addresses.filter(device_id=device_id))
    return {
        "interfaces": ifaces,
        "items": items,
        "macs": macs,
        "serial": nb.dcim.devices.get(device_id).serial,
    }


def journal(nb: Any, device_id: int) -> list[Any]:
    return list(
        nb.extras.journal_entries.filter(assigned_object_type="dcim.device", assigned_object_id=device_id)
    )


async def metric(client: httpx.AsyncClient, kind: str, result: str) -> float:
    text = (await client.get("/metrics")).text
    return next((float(v) for k, r, v in METRIC.findall(text) if (k, r) == (kind, result)), 0.0)


async def test_an_inspection_written_back_twice_gives_the_same_objects_and_a_journal_entry_each(
    nb_settings, serve, nb_lab, provisioner
):
    nb, s = nb_lab.nb, nb_lab.suffix
    node = await asyncio.to_thread(nb_lab.device_with_items)
    before = await asyncio.to_thread(snapshot, nb, node.id)
    inv = await serve(inventory_app(nb_settings, inventory_settings=inv_settings(nb_lab, on=True)))

    first = record(node, s, "2026-12-05T01:00:00+00:00")
    await provisioner.inspected(first)
    entries = await wait_until(
        lambda: asyncio.to_thread(journal, nb, node.id),
        timeout=60,
        interval=0.5,
        what="the first journal entry",
    )
    after_one = await asyncio.to_thread(snapshot, nb, node.id)

    # What the first inspection wrote.
    ifaces = {name: (macs, primary) for name, macs, primary in after_one["interfaces"].values()}
    slot_mac = node.macs["eno1"][:-2] + "31"
    eno2_new = node.macs["eno2"][:-2] + "f2"
    assert ifaces["NIC.Slot.3-1"] == ([slot_mac], slot_mac)  # a new interface, its MAC primary
    assert ifaces["eno2"] == (
        sorted([node.macs["eno2"], eno2_new]),
        node.macs["eno2"],
    )  # MAC added, primary kept
    assert ifaces["eno1"] == ([node.macs["eno1"]], node.macs["eno1"])
    assert "ToManager" not in ifaces and len(ifaces) == 4  # bmc, eno1, eno2 + the new one
    items = {
        serial: (name, role, part, desc, disc)
        for name, serial, role, part, desc, disc in after_one["items"].values()
    }
    assert items[f"NEWDISK{s}"] == ("Disk 4", "disk", "MZ7L3480", "480.1 GB, SATA, SSD", True)
    assert items[f"NEWGPU{s}"] == ("H100", "gpu", "H100 PCIe", "NVIDIA, PCI 0000:c2:00.0, id 10de:2331", True)
    # The operator's disk: its part number kept, its empty description filled; its GPU untouched.
    assert items[f"S64G{s}0"] == ("nvme0", "disk", "PM9A3", "3840.8 GB, NVMe, SSD", False)
    assert items[f"GPU{s}"][3] == "48 GB, bus 0000:c1:00.0"
    assert after_one["serial"] == f"SRV{s}"  # the device had none
    # Nothing the operator made is gone (nvme1 and psu0 were not reported: still there).
    assert set(before["interfaces"]) <= set(after_one["interfaces"]) and set(before["items"]) <= set(
        after_one["items"]
    )
    assert {n for n, *_ in after_one["items"].values()} >= {"nvme1", "psu0"}
    (entry,) = entries
    assert entry.kind.value == "info"
    assert f"karios:inspection:{node.bmc_ip}@{first.inspected_at}" in entry.comments
    assert (
        "interface NIC.Slot.3-1 created" in entry.comments
        and f"disk 'Disk 4' created (serial NEWDISK{s}" in entry.comments
    )

    # The inventory reads back what was written: the new disk's size, the new GPU, the new MAC.
    store = NetBoxStore(nb_settings.netbox_url, nb_settings.netbox_token.get_secret_value())
    try:
        hw = await store.bmc_hardware(node.bmc_ip)
        host = await store.host_by_mac(slot_mac)
    finally:
        await store.close()
    assert {(d.name, d.size_gb) for d in hw.disks} >= {("Disk 4", 480.0)}  # size_gb custom field: integer
    assert {g.name for g in hw.gpus} == {"gpu0", "H100"} and host is not None and host.name == node.name

    # Inspected again, same hardware: the same objects, one more journal entry saying so.
    async with httpx.AsyncClient(base_url=inv.url, timeout=10) as client:
        second = first.model_copy(update={"inspected_at": "2026-12-05T02:00:00+00:00"})
        await provisioner.inspected(second)
        entries = await wait_until(
            lambda: _journal_of(nb, node.id, 2), timeout=60, interval=0.5, what="the second journal entry"
        )
        assert await asyncio.to_thread(snapshot, nb, node.id) == after_one
        newest = max(entries, key=lambda e: e.id)
        assert second.inspected_at in newest.comments and "No change" in newest.comments

        # The same inspection delivered again (a redelivery): nothing written, no third entry.
        await wait_until(
            lambda: _above(client, "inspection", "unchanged", 0), what="the second write counted"
        )
        unchanged = await metric(client, "inspection", "unchanged")
        await provisioner.inspected(second)
        await wait_until(
            lambda: _above(client, "inspection", "unchanged", unchanged),
            timeout=60,
            what="the redelivery handled",
        )
    assert len(await asyncio.to_thread(journal, nb, node.id)) == 2
    assert await asyncio.to_thread(snapshot, nb, node.id) == after_one


async def _journal_of(nb: Any, device_id: int, n: int) -> list[Any] | None:
    entries = await asyncio.to_thread(journal, nb, device_id)
    return entries if len(entries) >= n else None


async def _above(client: httpx.AsyncClient, kind: str, result: str, value: float) -> bool:
    return await metric(client, kind, result) > value


# -- adoption -------------------------------------------------------------------------------------


def report(suffix: str, boot_mac: str, vendor: str, model: str) -> DiscoveryReport:
    return DiscoveryReport.model_validate(
        {
            "boot_mac": boot_mac,
            "dmi": {"sys_vendor": vendor, "product_name": model, "product_serial": f"ADOPT{suffix}"},
            "disks": [
                {"name": "nvme0n1", "size_bytes": 1_600_321_314_816, "model": "Dell Ent NVMe P5600",
                 "serial": f"PHAB{suffix}", "rotational": False, "transport": "nvme"},
            ],
            "nics": [
                {"name": "ens1f0np0", "mac": boot_mac, "link": "up", "speed_mbps": 25000, "physical": True},
                {"name": "eno8303", "mac": boot_mac[:-2] + "99", "link": "down", "physical": True},
            ],
        }
    )  # fmt: skip


@pytest.fixture
async def stack(nb_settings, serve, nb_lab):
    """``await stack(writeback)``: the inventory (write-back on or off), the real provisioner and
    the gateway; ``client.record_discovery(report)`` sends a discovery report as the gateway does
    after its token check."""
    opened: list[tuple[Bus, httpx.AsyncClient]] = []

    async def start(on: bool) -> httpx.AsyncClient:
        await serve(inventory_app(nb_settings, inventory_settings=inv_settings(nb_lab, on=on)))
        work = Path(tempfile.mkdtemp(prefix="kc-writeback-"))
        cfg = ProvisionerConfig(cache_dir=work / "cache", media_dir=work / "media")
        await serve(provisioner_app(nb_settings, cfg))
        gw = await serve(gateway_app(nb_settings))
        bus = Bus.from_settings(nb_settings, "test")
        await bus.start()

        async def record_discovery(rep: DiscoveryReport) -> str:
            done: DiscoveryRecorded = await bus.request(
                bus.subjects.request("provision", "record_discovery"),
                RecordDiscovery(boot_mac=rep.boot_mac, report=rep),
                reply=DiscoveryRecorded,
            )
            return done.id

        client = httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=60)
        client.record_discovery = record_discovery  # type: ignore[attr-defined]
        client.bus = bus  # type: ignore[attr-defined]
        opened.append((bus, client))
        return client

    yield start
    for bus, client in opened:
        await client.aclose()
        await bus.stop()


def _mac(suffix: str) -> str:
    return f"02:ad:{suffix[0:2]}:{suffix[2:4]}:{suffix[4:6]}:01"


def _delete_device(nb: Any, name: str) -> None:
    for dev in nb.dcim.devices.filter(name=name):
        dev.delete()


@pytest.mark.parametrize("known_type", [True, False], ids=["known-device-type", "new-device-type"])
async def test_adoption_creates_the_planned_device_with_its_interfaces(stack, nb_lab, known_type):
    nb, s = nb_lab.nb, uuid.uuid4().hex[:8]
    gw = await stack(True)
    if known_type:  # the lab's manufacturer and device type: found, nothing created
        vendor, model = nb_lab.maker.name, nb_lab.dtype.model
    else:  # a make NetBox does not know: its manufacturer and device type are created
        vendor, model = f"KC Vendor {s}", f"KC Model {s}"
    hostname = f"kc-adopt-{s}"
    boot_mac = _mac(s)
    try:
        server_id = await gw.record_discovery(report(s, boot_mac, vendor, model))
        r = await gw.post(f"/controlnode/discovered/{server_id}/adopt", json={"hostname": hostname})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["netbox_written"] is True and body["netbox_reason"] == "" and body["netbox_device_id"]
        assert not any("Create the NetBox device" in step for step in body["next_steps"])

        dev = dict(await asyncio.to_thread(nb.dcim.devices.get, body["netbox_device_id"]))
        assert (dev["name"], dev["status"]["value"], dev["serial"]) == (hostname, "planned", f"ADOPT{s}")
        assert (dev["site"]["id"], dev["role"]["id"]) == (nb_lab.site.id, nb_lab.role.id)
        dtype = dict(await asyncio.to_thread(nb.dcim.device_types.get, dev["device_type"]["id"]))
        assert (dtype["model"], dtype["manufacturer"]["name"]) == (model, vendor)
        if known_type:
            assert dtype["id"] == nb_lab.dtype.id
        assert dev["custom_fields"]["pxe_enabled"] is False
        ifaces = await asyncio.to_thread(
            lambda: list(map(dict, nb.dcim.interfaces.filter(device_id=dev["id"])))
        )
        assert {
            i["name"]: (i["type"]["value"], i["primary_mac_address"]["mac_address"].lower()) for i in ifaces
        } == {
            "ens1f0np0": ("25gbase-x-sfp28", boot_mac),
            "eno8303": ("other", boot_mac[:-2] + "99"),
        }
        items = await asyncio.to_thread(
            lambda: list(map(dict, nb.dcim.inventory_items.filter(device_id=dev["id"])))
        )
        assert [(i["name"], i["serial"], i["role"]["slug"]) for i in items] == [
            ("nvme0n1", f"PHAB{s}", "disk")
        ]
        (entry,) = await asyncio.to_thread(journal, nb, dev["id"])
        assert (
            f"karios:adoption:{server_id}" in entry.comments
            and "interface ens1f0np0 created" in entry.comments
        )

        # Adopting again finds the same device and writes nothing new.
        again = (
            await gw.post(f"/controlnode/discovered/{server_id}/adopt", json={"hostname": hostname})
        ).json()
        assert again["netbox_written"] is True and again["netbox_device_id"] == dev["id"]
        assert len(await asyncio.to_thread(journal, nb, dev["id"])) == 1
    finally:
        await asyncio.to_thread(_delete_device, nb, hostname)
        if not known_type:
            for t in await asyncio.to_thread(nb.dcim.device_types.filter, model=model):
                await asyncio.to_thread(t.delete)
            for m in await asyncio.to_thread(nb.dcim.manufacturers.filter, name=vendor):
                await asyncio.to_thread(m.delete)


async def test_with_the_setting_off_nothing_is_written(stack, nb_lab):
    nb, s = nb_lab.nb, uuid.uuid4().hex[:8]
    gw = await stack(False)
    hostname = f"kc-adopt-off-{s}"
    server_id = await gw.record_discovery(report(s, _mac(s), nb_lab.maker.name, nb_lab.dtype.model))
    r = await gw.post(f"/controlnode/discovered/{server_id}/adopt", json={"hostname": hostname})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["netbox_written"] is False and body["netbox_device_id"] is None
    assert "KARIOS_INVENTORY_WRITEBACK" in body["netbox_reason"]
    assert any("Create the NetBox device" in step for step in body["next_steps"])
    assert await asyncio.to_thread(lambda: list(nb.dcim.devices.filter(name=hostname))) == []
    assert await asyncio.to_thread(lambda: list(nb.dcim.devices.filter(serial=f"ADOPT{s}"))) == []
    # Inspections: nothing consumes hardware.inspected (the consumer exists only with it on).
    bus: Bus = gw.bus  # type: ignore[attr-defined]
    with pytest.raises(NotFoundError):
        await bus.js.consumer_info(bus.subjects.evt_stream, "inventory-writeback")
