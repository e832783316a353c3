"""The BMC's hardware record against the inventory's (issue 27 item 2, the diff).

The BMC side is the recorded Dell R750 (``tests/fixtures/redfish_inventory``) inspected by the real
driver and collector; the inventory side is NetBox-shaped JSON (the golden NetBox 4.7 records of
``tests/unit/inventory``, its disks, NICs and GPU rewritten to describe that server) mapped by the
inventory's own ``bmc_hardware_from_netbox``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from karios.common.contracts.hardware import Drive, HardwareRecord, SystemInfo
from karios.common.contracts.inventory import Disk
from karios.common.hardware_diff import hardware_diff
from karios.inventory.mapping import HardwareRules, bmc_hardware_from_netbox
from tests.unit.provisioner.test_inspect import FULL, _inspect

GOLDEN = json.loads((Path(__file__).parents[1] / "inventory/golden/netbox_4.7.3.json").read_text())
R750 = FULL / "dell/idrac9-6.00.30.00_poweredge-r750"
SERIAL = "CNIVC0014M0388"
# the R750's drives (serial → GB) and its five NIC MACs, as the capture reports them
DRIVES = {"61P0A06CTCD8": 1920.4, "61M0A08ZTCD8": 1920.4, "61X0A002TCD8": 1920.4}
MACS = [
    "70:b5:e8:f0:52:dc",
    "e4:3d:1a:13:27:f1",
    "e4:3d:1a:13:27:f0",
    "70:b5:e8:f0:52:dd",
    "b8:3f:d2:90:97:c4",
]


@pytest.fixture(scope="module")
async def record() -> HardwareRecord:
    rec, _ = await _inspect(R750, "dell")
    return rec


def netbox(serial: str, disks: dict[str, float], macs: list[str], gpus: list[str]):  # type: ignore[no-untyped-def]
    """The NetBox records of the server: the golden device with these disks (serial → GB), host
    NICs (their MACs; the golden BMC interface is kept) and GPUs (part ids)."""
    device = {**GOLDEN["device"], "serial": serial}
    bmc_iface, template = GOLDEN["interfaces"][0], GOLDEN["interfaces"][1]
    assert bmc_iface["name"] == "bmc" and bmc_iface["mgmt_only"]
    ifaces = [bmc_iface]
    for n, mac in enumerate(macs):
        i = copy.deepcopy(template)
        i.update(id=100 + n, name=f"eth{n}", mac_address=mac.upper(), speed=None)
        i["primary_mac_address"] = {"mac_address": mac.upper()}
        i["mac_addresses"] = [{"mac_address": mac.upper()}]
        ifaces.append(i)
    disk_t = next(i for i in GOLDEN["inventory_items"] if i["role"]["slug"] == "disk")
    gpu_t = next(i for i in GOLDEN["inventory_items"] if i["role"]["slug"] == "gpu")
    items = []
    for n, (sn, gb) in enumerate(disks.items()):
        d = copy.deepcopy(disk_t)
        d.update(id=200 + n, name=f"nvme{n}", part_id="Dell Ent NVMe CM6 RI 1.92TB", serial=sn)
        d["custom_fields"] = {"pci_address": None, "size_gb": gb}
        items.append(d)
    for n, part in enumerate(gpus):
        g = copy.deepcopy(gpu_t)
        g.update(id=300 + n, name=f"gpu{n}", part_id=part, serial="")
        items.append(g)
    return bmc_hardware_from_netbox(
        device, GOLDEN["bmc_ip"], ifaces, GOLDEN["ip_addresses"], items, [], {}, HardwareRules()
    )


async def test_a_matching_inventory_is_in_sync(record: HardwareRecord) -> None:
    inv = netbox(SERIAL, {sn: 1920 for sn in DRIVES}, list(reversed(MACS)), ["H100 PCIe"])
    assert [n.name for n in inv.nics if n.is_bmc] == ["bmc"]  # the BMC port is not compared
    diff = hardware_diff(record, inv)
    assert diff.in_sync and diff.differences == 0, diff.model_dump_json(indent=1)
    assert (diff.serial.matched, diff.disks.matched, diff.nics.matched, diff.gpus.matched) == (1, 3, 5, 1)
    assert diff.unchecked == [] and diff.device_name == inv.device_name


async def test_each_category_names_what_is_on_one_side_only_and_what_differs(record: HardwareRecord) -> None:
    disks = {"61P0A06CTCD8": 1920.0, "61M0A08ZTCD8": 3840.0, "S64G0A1B2C3D0": 3840.0}  # no 61X…, one 2x
    macs = [*MACS[:4], "02:0a:1b:2c:3d:01"]  # the slot NIC missing, an unknown one listed
    diff = hardware_diff(record, netbox("CNIVC0014M9999", disks, macs, []))
    assert not diff.in_sync and diff.differences == 7
    assert [(d.field, d.bmc, d.inventory) for p in diff.serial.differ for d in p.differences] == [
        ("serial", SERIAL, "CNIVC0014M9999")
    ]
    assert [i.key for i in diff.disks.only_bmc] == ["61X0A002TCD8"]
    assert diff.disks.only_bmc[0].name == "Disk.Bay.0:Enclosure.Internal.0-1"
    assert "1920.4 GB" in diff.disks.only_bmc[0].summary
    assert [(i.key, i.name) for i in diff.disks.only_inventory] == [("S64G0A1B2C3D0", "nvme2")]
    (pair,) = diff.disks.differ
    assert (pair.key, pair.inventory_name) == ("61M0A08ZTCD8", "nvme1")
    assert [(d.field, d.bmc, d.inventory) for d in pair.differences] == [("size_gb", "1920.4", "3840")]
    assert diff.disks.matched == 1
    assert [(i.key, i.name) for i in diff.nics.only_bmc] == [("b8:3f:d2:90:97:c4", "NIC.Slot.5-1")]
    assert [(i.key, i.name) for i in diff.nics.only_inventory] == [("02:0a:1b:2c:3d:01", "eth4")]
    assert diff.nics.matched == 4
    assert [i.key for i in diff.gpus.only_bmc] == ["10de:2331"]  # the inventory lists no GPU


async def test_a_collection_the_bmc_did_not_report_is_unchecked_not_absent(record: HardwareRecord) -> None:
    partial = record.model_copy(update={"missing": ["EthernetInterfaces: 404 Not Found"], "drives": []})
    diff = hardware_diff(partial, netbox(SERIAL, {"X1": 100.0}, ["02:0a:1b:2c:3d:01"], ["H100 PCIe"]))
    assert diff.in_sync and diff.differences == 0
    assert not diff.nics.checked and not diff.disks.checked and diff.nics.only_inventory == []
    assert diff.unchecked == [
        "disks: the BMC reported none",
        "nics: EthernetInterfaces: 404 Not Found",
    ]


async def test_disks_without_serials_pair_by_name_then_size_and_placeholders_are_no_serial(
    record: HardwareRecord,
) -> None:
    rec = record.model_copy(
        update={
            "system": SystemInfo(serial="To Be Filled By O.E.M."),
            "drives": [
                Drive(id="sda", size_bytes=480_103_981_056, model="SAMSUNG MZ7L3480"),
                Drive(id="D2", size_bytes=960_197_124_096, model="SAMSUNG MZ7L3960"),
            ],
        }
    )
    inv = netbox("", {}, MACS, ["H100 PCIe"])
    inv.disks = [
        Disk(name="sda", size_gb=480, model="Micron 5400"),
        Disk(name="sdb", size_gb=960, model="samsung  mz7l3960"),
    ]
    diff = hardware_diff(rec, inv)
    assert not diff.serial.checked and diff.unchecked == ["serial: the BMC reported no usable system serial"]
    (pair,) = diff.disks.differ  # sda by name: its model differs; D2 by size: same model
    assert (pair.key, [d.field for d in pair.differences]) == ("sda", ["model"])
    assert diff.disks.matched == 1 and diff.disks.only_bmc == diff.disks.only_inventory == []
