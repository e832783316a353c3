"""The refusal rule (issue 27 item 2): when a provision contradicts the stored hardware record, and
when the record cannot tell (a gap in what the BMC reported never refuses)."""

from __future__ import annotations

from karios.common.contracts.hardware import (
    Drive,
    HardwareRecord,
    NetworkInterface,
    PcieDevice,
    contradiction,
)

GPU = PcieDevice(id="GPU1", vendor_id="10de", device_id="2331", device_class="DisplayController", is_gpu=True)
NIC = PcieDevice(id="NIC1", vendor_id="15b3", device_id="101d", device_class="NetworkController")


def record(**fields) -> HardwareRecord:
    base = {
        "bmc_ip": "10.0.0.1",
        "inspected_at": "2026-12-04T10:00:00+00:00",
        "driver": "dell",
        "drives": [
            Drive(id="Disk.Bay.0", name="PM9A3 0", serial="S64ANA0R"),
            Drive(id="Disk.Bay.1", serial="S64ANA1R"),
        ],
        "nics": [
            NetworkInterface(id="NIC.1", mac="b0:7b:25:aa:00:01"),
            NetworkInterface(id="ToManager", mac="0a:00:00:00:00:01", host_interface=True),
        ],
        "pcie_devices": [NIC, GPU],
        "gpus": [GPU],
    }
    return HardwareRecord(**{**base, **fields})


def test_consistent_request_passes() -> None:
    rec = record()
    assert (
        contradiction(
            rec,
            selected_disks=["/dev/sda", "Disk.Bay.1"],
            disk_serials={"sda": "s64ana0r"},
            selected_nic_mac="B0-7B-25-AA-00-01",
            gpu_passthrough=True,
            gpu_ids=["10de:2331"],
        )
        is None
    )


def test_disk_whose_inventory_serial_the_bmc_did_not_report_is_named() -> None:
    field, why = contradiction(record(), selected_disks=["/dev/sdb"], disk_serials={"sdb": "WD-X"}) or (
        "",
        "",
    )
    assert field == "selected_disks" and why.startswith(
        "sdb (serial WD-X in the inventory) is not among the 2 disks"
    )


def test_disk_without_a_comparable_serial_is_accepted() -> None:
    assert contradiction(record(), selected_disks=["/dev/sdb"]) is None  # no serial in the inventory
    unserialled = record(drives=[Drive(id="D1"), Drive(id="D2", serial="X")])
    assert contradiction(unserialled, selected_disks=["/dev/sdb"], disk_serials={"sdb": "WD-X"}) is None


def test_mac_must_be_an_inspected_port_not_the_bmc_link() -> None:
    assert contradiction(record(), selected_nic_mac="0a:00:00:00:00:01") == (
        "selected_nic_mac",
        "0a:00:00:00:00:01 is not the MAC of any NIC the BMC reported (inspected 2026-12-04T10:00:00+00:00)",
    )


def test_gpu_passthrough_needs_a_gpu_and_the_listed_ids() -> None:
    no_gpu = record(pcie_devices=[NIC], gpus=[])
    assert (contradiction(no_gpu, gpu_passthrough=True) or ("",))[0] == "gpu_passthrough"
    assert contradiction(no_gpu, gpu_passthrough=False) is None
    wrong = contradiction(record(), gpu_passthrough=True, gpu_ids=["10de:20b5"])
    assert wrong is not None and "no GPU with id 10de:20b5" in wrong[1]


def test_a_gap_in_what_the_bmc_reported_never_refuses() -> None:
    gaps = record(
        pcie_devices=[],
        gpus=[],
        missing=[
            "Drive of CPU.1 Disk.Bay.2: HTTP 500",
            "EthernetInterfaces NIC.2: HTTP 404",
            "PCIeDevices: not offered by the BMC",
        ],
    )
    assert (
        contradiction(
            gaps,
            selected_disks=["/dev/sdb"],
            disk_serials={"sdb": "WD-X"},
            selected_nic_mac="52:54:00:ff:ff:ff",
            gpu_passthrough=True,
        )
        is None
    )
    assert (
        contradiction(
            record(drives=[], nics=[]), selected_disks=["/dev/sda"], selected_nic_mac="52:54:00:ff:ff:ff"
        )
        is None
    )
