"""Discovery of unknown servers (issue 27 item 3), the pure core: a report from the live
environment → the discovered server in the hardware record's shapes; what adoption asks the
operator to add to the inventory. No I/O, no clock (times are passed in).

The live environment's report is validated by its contract (:class:`DiscoveryReport`, a 422 naming
the field at the gateway); here it is only read. One machine is one record: the MAC it booted from,
or its serial when DMI has a real one (a machine PXE-booting from another NIC is the same machine).
"""

from __future__ import annotations

import hashlib
import json
import re

from karios.common.contracts.discovery import (
    DiscoveredServer,
    DiscoveryReport,
    NetboxDevice,
    NetboxInterface,
    ReportedDisk,
    ReportedNic,
    ReportedPciDevice,
)
from karios.common.contracts.hardware import (
    Drive,
    HardwareRecord,
    NetworkInterface,
    PcieDevice,
    SystemInfo,
    usable_dmi,
)
from karios.common.contracts.netbox_writeback import netbox_interface_type
from karios.provisioner.inspect.parse import _BMC_VGA_VENDORS, _GPU_CLASSES

#: PCI class (first byte) → the Redfish ``DeviceClass`` name the hardware record uses.
PCI_CLASSES = {
    "00": "UnclassifiedDevice",
    "01": "MassStorageController",
    "02": "NetworkController",
    "03": "DisplayController",
    "04": "MultimediaController",
    "05": "MemoryController",
    "06": "Bridge",
    "07": "CommunicationController",
    "08": "GenericSystemPeripheral",
    "09": "InputDeviceController",
    "0b": "Processor",
    "0c": "SerialBusController",
    "0d": "WirelessController",
    "10": "EncryptionController",
    "11": "SignalProcessingController",
    "12": "ProcessingAccelerators",
}
#: The PCI vendor ids a server usually holds (the rest keep the id only).
PCI_VENDORS = {
    "8086": "Intel",
    "10de": "NVIDIA",
    "1002": "AMD",
    "1022": "AMD",
    "15b3": "Mellanox",
    "14e4": "Broadcom",
    "1000": "Broadcom / LSI",
    "9005": "Microchip",
    "1077": "QLogic",
    "19a2": "Emulex",
    "1924": "Solarflare",
    "1af4": "Red Hat (virtio)",
    "1b36": "Red Hat (QEMU)",
    "1a03": "ASPEED",
    "102b": "Matrox",
    "144d": "Samsung",
    "1344": "Micron",
    "1c5c": "SK hynix",
    "8088": "Wangxun",
}
_PROTOCOLS = {
    "nvme": "NVMe",
    "sata": "SATA",
    "sas": "SAS",
    "scsi": "SCSI",
    "usb": "USB",
    "virtio": "virtio",
    "mmc": "MMC",
}
_NAME_UNSAFE = re.compile(r"[^a-z0-9-]+")


def usable(value: str) -> str:
    """A DMI value with its whitespace trimmed, or '' when it is a firmware placeholder."""
    return usable_dmi(value)


def machine_serial(report: DiscoveryReport) -> str:
    """The serial that tells this machine apart: the system's, else the chassis', else the board's."""
    dmi = report.dmi
    return next((s for s in map(usable, (dmi.product_serial, dmi.chassis_serial, dmi.board_serial)) if s), "")


def system_of(report: DiscoveryReport) -> SystemInfo:
    dmi = report.dmi
    return SystemInfo(
        manufacturer=usable(dmi.sys_vendor) or usable(dmi.board_vendor),
        model=usable(dmi.product_name) or usable(dmi.board_name),
        serial=machine_serial(report),
        uuid=usable(dmi.product_uuid).lower(),
        bios_version=usable(dmi.bios_version),
        power_state="Off",  # the live environment powers it off after the report
    )


def drive_of(disk: ReportedDisk) -> Drive:
    media = "" if disk.rotational is None else ("HDD" if disk.rotational else "SSD")
    return Drive(
        id=disk.name,
        name=disk.name,
        model=" ".join(disk.model.split()),
        serial=disk.serial.strip(),
        size_bytes=disk.size_bytes,
        size_gb=round(disk.size_bytes / 1e9, 1),
        media_type=media,
        protocol=_PROTOCOLS.get(disk.transport, ""),
        source="in-band",
    )


def nic_of(nic: ReportedNic) -> NetworkInterface:
    return NetworkInterface(
        id=nic.name,
        name=nic.name,
        mac=nic.mac,
        permanent_mac=nic.mac,
        link_status={"up": "LinkUp", "down": "LinkDown"}.get(nic.link, ""),
        speed_mbps=nic.speed_mbps,
    )


def pcie_of(dev: ReportedPciDevice) -> PcieDevice:
    device_class = PCI_CLASSES.get(dev.class_code[:2], "OtherDevice")
    return PcieDevice(
        id=dev.address,
        name=dev.address,
        manufacturer=PCI_VENDORS.get(dev.vendor_id, ""),
        device_class=device_class,
        vendor_id=dev.vendor_id,
        device_id=dev.device_id,
        # The server's own VGA (the BMC's ASPEED / Matrox chip) is a display controller, not a GPU.
        is_gpu=device_class in _GPU_CLASSES and dev.vendor_id not in _BMC_VGA_VENDORS,
    )


def hardware_digest(report: DiscoveryReport) -> str:
    """What makes two reports of one machine the same: its hardware, not its address of the day."""
    hw = report.model_dump(mode="json", exclude={"agent", "ip", "kernel", "boot_mac"})
    for nic in hw["nics"]:
        nic.pop("link", None)  # a cable plugged in is not new hardware
        nic.pop("speed_mbps", None)
    return hashlib.sha256(json.dumps(hw, sort_keys=True).encode()).hexdigest()


def discovered_server(
    id: str,
    boot_mac: str,
    report: DiscoveryReport,
    *,
    first_seen: str,
    last_seen: str,
    report_count: int = 1,
) -> DiscoveredServer:
    """The discovered server a report describes (status ``discovered``)."""
    pcie = [pcie_of(d) for d in report.pci]
    return DiscoveredServer(
        id=id,
        status="discovered",
        boot_mac=boot_mac,
        serial=machine_serial(report),
        system=system_of(report),
        processor_model=" ".join(report.cpu_model.split()),
        processor_threads=report.cpu_threads,
        memory_mib=report.memory_mib,
        drives=[drive_of(d) for d in report.disks],
        nics=[nic_of(n) for n in report.nics if n.physical],
        pcie_devices=pcie,
        gpus=[d for d in pcie if d.is_gpu],
        ip=report.ip,
        first_seen=first_seen,
        last_seen=last_seen,
        report_count=report_count,
    )


# -- adoption ----------------------------------------------------------------------------------------


def default_hostname(server: DiscoveredServer) -> str:
    """``srv-<serial>`` (else ``srv-<boot MAC hex>``), lower case, a valid DNS label."""
    tail = _NAME_UNSAFE.sub("-", (server.serial or server.boot_mac.replace(":", "")).lower()).strip("-")
    return f"srv-{tail}"[:63].rstrip("-")


def netbox_type(speed_mbps: int | None) -> str:
    return netbox_interface_type(speed_mbps)


def netbox_device(server: DiscoveredServer, hostname: str) -> NetboxDevice:
    """The NetBox device (status ``planned``) for an adopted server: its serial, DMI make and
    model, one interface per physical NIC with its MAC; ``pxe_enabled`` off so that its next PXE
    boot does not install anything before the operator means it to."""
    return NetboxDevice(
        name=hostname,
        serial=server.serial,
        manufacturer=server.system.manufacturer,
        model=server.system.model,
        interfaces=[
            NetboxInterface(name=n.name, type=netbox_type(n.speed_mbps), mac_address=n.mac)
            for n in server.nics
        ],
        custom_fields={"pxe_enabled": False},
    )


def hardware_of(server: DiscoveredServer) -> HardwareRecord:
    """The discovered server's hardware in the record's shape, for the NetBox write-back (no BMC:
    read in band, at its latest report)."""
    return HardwareRecord(
        bmc_ip="",
        inspected_at=server.last_seen,
        driver="in-band",
        system=server.system,
        drives=server.drives,
        nics=server.nics,
        pcie_devices=server.pcie_devices,
        gpus=server.gpus,
    )


def next_steps(server: DiscoveredServer, device: NetboxDevice, *, written: bool) -> list[str]:
    """What the operator does to make the adopted server a known, provisionable host."""
    steps = []
    if not written:
        steps.append(
            f"Create the NetBox device {device.name!r} (status planned, "
            f"serial {device.serial or 'unknown'!r}) "
            "with a device type for "
            f"{device.manufacturer or 'its manufacturer'} {device.model or ''}".rstrip()
            + ", a role and a site of your choice, and the interfaces listed in netbox_device.interfaces "
            f"(the boot NIC has MAC {server.boot_mac})."
        )
    steps.append(
        "Register its BMC (POST /controlnode/register with bmc_ip, vendor, primary_mac "
        f"{server.boot_mac}): the in-band report cannot see the BMC's address."
    )
    steps.append(
        "Set pxe_enabled on the NetBox device when it should install on its next PXE boot; until "
        "then bootapi boots it from its local disk."
    )
    return steps
