"""NetBox JSON (recorded from a real NetBox 4.7.3) → Host and BmcHardware contracts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from karios.inventory.mapping import (
    HardwareRules,
    bmc_hardware_from_netbox,
    host_from_netbox,
    interface_macs,
    pxe_enabled,
    size_gb_from_text,
    speed_mbps,
)

REC = json.loads((Path(__file__).parent / "golden" / "netbox_4.7.3.json").read_text())


def hardware(rules: HardwareRules | None = None):  # type: ignore[no-untyped-def]
    return bmc_hardware_from_netbox(
        REC["device"],
        REC["bmc_ip"],
        REC["interfaces"],
        REC["ip_addresses"],
        REC["inventory_items"],
        [],
        {},
        rules or HardwareRules(),
    )


def test_host_carries_platform_role_site_ips_interfaces_and_pxe():
    host = host_from_netbox(REC["device"], REC["interfaces"], REC["ip_addresses"])
    assert host.name == "kc-node-0a1b2c3d" and host.id == REC["device"]["id"]
    assert host.platform == "kc-alma-0a1b2c3d" and host.role == "kc-compute-0a1b2c3d"
    assert host.site == "kc-site-0a1b2c3d"
    assert host.primary_ipv4 == REC["device"]["primary_ip4"]["address"]
    assert host.oob_ip == REC["bmc_ip"]
    ifaces = {i.name: i for i in host.interfaces}
    assert ifaces["eno1"].macs == ["02:0a:1b:2c:3d:01"]
    assert ifaces["eno1"].ipv4 == [host.primary_ipv4]
    assert ifaces["bmc"].mgmt_only and ifaces["bmc"].ipv4 == [f"{REC['bmc_ip']}/24"]
    assert ifaces["eno1"].speed_mbps == 25000  # from the type: speed is null
    assert ifaces["eno2"].speed_mbps == 25000  # from speed (kbps)
    assert host.pxe_enabled is True  # custom field exists but is unset
    assert host.custom_fields == {"pxe_enabled": None}


def test_bmc_hardware_has_two_disks_one_gpu_and_the_bmc_nic_marked():
    hw = hardware()
    assert hw.device_name == "kc-node-0a1b2c3d" and hw.bmc_ip == REC["bmc_ip"]
    assert [(d.name, d.model, d.size_gb, d.pci_address, d.source) for d in hw.disks] == [
        ("nvme0", "PM9A3", 3840.0, "0000:41:00.0", "inventory-item"),
        ("nvme1", "PM9A3", 3840.0, "0000:42:00.0", "inventory-item"),
    ]
    assert hw.disks[0].serial == "S64G0a1b2c3d0" and hw.disks[0].manufacturer == "kc-maker-0a1b2c3d"
    assert [(g.name, g.model, g.memory_gb, g.pci_address) for g in hw.gpus] == [
        ("gpu0", "L40S", 48.0, "0000:c1:00.0")
    ]
    nics = {n.name: n for n in hw.nics}
    assert set(nics) == {"bmc", "eno1", "eno2"}
    assert [n.name for n in hw.nics if n.is_bmc] == ["bmc"]
    assert nics["eno1"].primary_mac == "02:0a:1b:2c:3d:01" and nics["eno1"].type == "25gbase-x-sfp28"


def test_role_slugs_are_configurable():
    hw = hardware(HardwareRules(disk_role="ssd", gpu_role="accelerator"))
    assert hw.disks == [] and hw.gpus == []


def test_modules_in_bays_count_by_their_type_profile():
    types = {t["id"]: t for t in REC["module_types"]}
    hw = bmc_hardware_from_netbox(
        REC["mod_device"],
        REC["mod_bmc_ip"],
        REC["mod_interfaces"],
        REC["mod_ip_addresses"],
        [],
        REC["modules"],
        types,
        HardwareRules(),
    )
    assert [(d.name, d.size_gb, d.bus, d.serial, d.source) for d in hw.disks] == [
        ("Drive bay 0", 960.0, "ssd", "SSD0a1b2c3d", "module")
    ]
    assert [(g.name, g.memory_gb, g.pci_address) for g in hw.gpus] == [("PCIe slot 1", 80.0, "0000:81:00.0")]
    assert [n.name for n in hw.nics if n.is_bmc] == ["ipmi"]  # the interface holding the BMC IP


def test_all_assigned_macs_count_primary_first():
    iface = {
        "mac_address": "AA:00:00:00:00:02",
        "primary_mac_address": {"mac_address": "AA:00:00:00:00:02"},
        "mac_addresses": [{"mac_address": "AA:00:00:00:00:01"}, {"mac_address": "AA:00:00:00:00:02"}],
    }
    assert interface_macs(iface) == (["aa:00:00:00:00:02", "aa:00:00:00:00:01"], "aa:00:00:00:00:02")
    assert interface_macs({"mac_address": None, "mac_addresses": []}) == ([], "")
    assert interface_macs({"mac_address": "00-11-22-33-44-55"}) == (
        ["00:11:22:33:44:55"],
        "00:11:22:33:44:55",
    )


@pytest.mark.parametrize(
    ("iface", "mbps"),
    [
        ({"speed": 10_000_000}, 10_000),
        ({"speed": None, "type": {"value": "1000base-t"}}, 1000),
        ({"type": {"value": "100gbase-x-qsfp28"}}, 100_000),
        ({"type": {"value": "2.5gbase-t"}}, 2500),
        ({"type": {"value": "virtual"}}, None),
    ],
)
def test_speed(iface, mbps):
    assert speed_mbps(iface) == mbps


@pytest.mark.parametrize(
    ("cf", "expected"),
    [
        ({}, True),
        ({"pxe_enabled": None}, True),
        ({"pxe_enabled": True}, True),
        ({"pxe_enabled": False}, False),
    ],
)
def test_pxe_enabled_unset_counts_as_true(cf, expected):
    assert pxe_enabled(cf) is expected


def test_size_from_description():
    assert size_gb_from_text("Samsung PM9A3 3.84 TB U.2") == 3840.0
    assert size_gb_from_text("960GB SATA") == 960.0
    assert size_gb_from_text("no size") is None
