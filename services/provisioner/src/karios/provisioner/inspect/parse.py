"""Redfish documents → the hardware record's models (pure: no I/O, no clock).

Every function takes the JSON a BMC answered and the vendor's :class:`Quirks`; a property a
firmware leaves out (or sets to ``null``) becomes an empty value, never a guess.
"""

from __future__ import annotations

import re
from typing import Any

from karios.common.contracts.hardware import (
    BmcIdentity,
    Drive,
    FirmwareComponent,
    MemoryModule,
    NetworkInterface,
    PcieDevice,
    Processor,
    SystemInfo,
)
from karios.common.netaddr import mac_or_none
from karios.provisioner.drivers.quirks import Quirks

Doc = dict[str, Any]

#: Service-root ``Vendor`` / ``Oem`` key / System ``Manufacturer`` → driver name.
_VENDOR_WORDS = (
    ("dell", "dell"),
    ("hpe", "hpe"),
    ("hewlett", "hpe"),
    ("hp", "hpe"),
    ("lenovo", "lenovo"),
    ("supermicro", "supermicro"),
    ("cisco", "cisco"),
)
#: PCI vendor ids of GPU makers, for firmware that names the vendor instead (Supermicro OEM).
GPU_VENDOR_IDS = {"nvidia": "10de", "amd": "1002", "ati": "1002", "intel": "8086"}
_GPU_CLASSES = {"DisplayController", "ProcessingAccelerators"}
_BMC_VGA_VENDORS = {"1a03", "102b"}  # ASPEED, Matrox (G200eW3 on iDRAC / iLO)
_HEX = re.compile(r"^(?:0x)?([0-9a-fA-F]{1,4})$")


def text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def integer(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def link(doc: Doc, key: str) -> str:
    """``doc[key]["@odata.id"]`` or ''."""
    value = doc.get(key)
    return text(value.get("@odata.id")) if isinstance(value, dict) else ""


def links(doc: Doc, key: str) -> list[str]:
    """``@odata.id`` of every member of a list of links (``Members``, ``Drives``, …)."""
    value = doc.get(key)
    if not isinstance(value, list):
        return []
    return [text(m.get("@odata.id")) for m in value if isinstance(m, dict) and m.get("@odata.id")]


def last_segment(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def vendor_of(root: Doc, system: Doc | None = None) -> str:
    """The driver for a BMC from its service root (``Vendor``, else its ``Oem`` keys — an old
    Supermicro root has neither Vendor nor Product), else the System's Manufacturer; 'generic'."""
    candidates = [text(root.get("Vendor"))]
    candidates += list((root.get("Oem") or {}).keys()) if isinstance(root.get("Oem"), dict) else []
    if system:
        candidates.append(text(system.get("Manufacturer")))
    for cand in candidates:
        low = cand.lower()
        for word, vendor in _VENDOR_WORDS:
            if low == word or low.startswith(word + " ") or (len(word) > 3 and word in low):
                return vendor
    return "generic"


def health(doc: Doc) -> str:
    status = doc.get("Status")
    return text(status.get("Health") or status.get("HealthRollup")) if isinstance(status, dict) else ""


def absent(doc: Doc) -> bool:
    """A slot the BMC lists with nothing in it (``Status.State: Absent``)."""
    status = doc.get("Status")
    return isinstance(status, dict) and text(status.get("State")) == "Absent"


def system_info(doc: Doc) -> SystemInfo:
    return SystemInfo(
        manufacturer=text(doc.get("Manufacturer")),
        model=text(doc.get("Model")),
        serial=text(doc.get("SerialNumber")),
        sku=text(doc.get("SKU")),
        uuid=text(doc.get("UUID")),
        bios_version=text(doc.get("BiosVersion")),
        power_state=text(doc.get("PowerState")),
        health=health(doc),
        redfish_id=text(doc.get("@odata.id")),
    )


def processor_count(system: Doc) -> int | None:
    summary = system.get("ProcessorSummary")
    return integer(summary.get("Count")) if isinstance(summary, dict) else None


def memory_total_gib(system: Doc) -> float | None:
    summary = system.get("MemorySummary")
    if not isinstance(summary, dict) or summary.get("TotalSystemMemoryGiB") is None:
        return None
    try:
        return float(summary["TotalSystemMemoryGiB"])
    except (TypeError, ValueError):
        return None


def processor(doc: Doc) -> Processor | None:
    """A CPU socket (GPUs/FPGAs listed under Processors by some firmware are left to PCIe)."""
    kind = text(doc.get("ProcessorType"))
    if absent(doc) or (kind and kind != "CPU"):
        return None
    return Processor(
        socket=text(doc.get("Socket")) or text(doc.get("Id")),
        manufacturer=text(doc.get("Manufacturer")),
        model=text(doc.get("Model")),
        architecture=text(doc.get("ProcessorArchitecture")),
        cores=integer(doc.get("TotalCores")),
        threads=integer(doc.get("TotalThreads")),
        max_speed_mhz=integer(doc.get("MaxSpeedMHz")),
    )


def memory_module(doc: Doc) -> MemoryModule | None:
    size = integer(doc.get("CapacityMiB"))
    if absent(doc) or not size:
        return None  # an empty DIMM slot
    return MemoryModule(
        slot=text(doc.get("DeviceLocator")) or text(doc.get("Name")) or text(doc.get("Id")),
        size_mib=size,
        type=text(doc.get("MemoryDeviceType")),
        speed_mhz=integer(doc.get("OperatingSpeedMhz")),
        manufacturer=text(doc.get("Manufacturer")),
        part_number=text(doc.get("PartNumber")),
        serial=text(doc.get("SerialNumber")),
    )


def _gb(size: int | None) -> float | None:
    return round(size / 1e9, 1) if size else None


def drive(doc: Doc, controller: str) -> Drive | None:
    if absent(doc):
        return None
    size = integer(doc.get("CapacityBytes"))
    return Drive(
        id=text(doc.get("Id")) or last_segment(text(doc.get("@odata.id"))),
        name=text(doc.get("Name")),
        model=text(doc.get("Model")),
        manufacturer=text(doc.get("Manufacturer")),
        serial=text(doc.get("SerialNumber")),
        size_bytes=size,
        size_gb=_gb(size),
        media_type=text(doc.get("MediaType")),
        protocol=text(doc.get("Protocol")),
        controller=controller,
        firmware_version=text(doc.get("Revision")),
        source="Storage",
    )


def simple_storage_drives(doc: Doc) -> list[Drive]:
    """SimpleStorage: devices inline, no serial, no protocol (what older BMCs offer)."""
    out = []
    controller = text(doc.get("Id")) or last_segment(text(doc.get("@odata.id")))
    for i, dev in enumerate(doc.get("Devices") or []):
        if not isinstance(dev, dict) or absent(dev):
            continue
        size = integer(dev.get("CapacityBytes"))
        out.append(
            Drive(
                id=f"{controller}/{i}",
                name=text(dev.get("Name")),
                model=text(dev.get("Model")),
                manufacturer=text(dev.get("Manufacturer")),
                size_bytes=size,
                size_gb=_gb(size),
                controller=controller,
                source="SimpleStorage",
            )
        )
    return out


def nic(doc: Doc, quirks: Quirks) -> NetworkInterface | None:
    if absent(doc):
        return None
    ident = text(doc.get("Id")) or last_segment(text(doc.get("@odata.id")))
    mac = mac_or_none(text(doc.get("MACAddress"))) or ""
    permanent = mac_or_none(text(doc.get("PermanentMACAddress"))) or ""
    enabled = doc.get("InterfaceEnabled")
    return NetworkInterface(
        id=ident,
        name=text(doc.get("Name")),
        mac=mac or permanent,
        permanent_mac=permanent,
        link_status=text(doc.get("LinkStatus")),
        speed_mbps=integer(doc.get("SpeedMbps")),
        enabled=enabled if isinstance(enabled, bool) else None,
        host_interface=ident in quirks.host_interface_nics,
    )


def pci_hex(value: Any, decimal: bool = False) -> str:
    """``0x10DE`` / ``10de`` → ``10de``; ``0x0000``, ``0xFFFF`` and garbage → '' (not reported).
    ``decimal``: a firmware writing ids in decimal ("4139" → ``102b``; "0x…" stays hex)."""
    raw = text(value)
    if decimal and raw.isdigit() and int(raw) <= 0xFFFF:
        raw = f"{int(raw):04x}"
    m = _HEX.match(raw)
    if not m:
        return ""
    out = m.group(1).lower().rjust(4, "0")
    return "" if out in ("0000", "ffff") else out


def pcie_device(doc: Doc, functions: list[Doc], quirks: Quirks) -> PcieDevice:
    dec = quirks.pci_ids_decimal
    first = next((f for f in functions if pci_hex(f.get("VendorId"), dec)), functions[0] if functions else {})
    device_class = text(first.get("DeviceClass"))
    vendor_id, device_id = pci_hex(first.get("VendorId"), dec), pci_hex(first.get("DeviceId"), dec)
    manufacturer = text(doc.get("Manufacturer"))
    if quirks.gpu_ids_from_oem and not vendor_id:
        gpu = ((first.get("Oem") or {}).get("Supermicro") or {}).get("GPUDevice") or {}
        if gpu:
            manufacturer = manufacturer or text(gpu.get("GPUVendor"))
            vendor_id = GPU_VENDOR_IDS.get(text(gpu.get("GPUVendor")).lower(), "")
    # The server's own VGA (the BMC's ASPEED / Matrox chip) is a display controller, not a GPU.
    is_gpu = device_class in _GPU_CLASSES and vendor_id not in _BMC_VGA_VENDORS
    return PcieDevice(
        id=text(doc.get("Id")) or last_segment(text(doc.get("@odata.id"))),
        name=text(doc.get("Name")),
        manufacturer=manufacturer,
        model=text(doc.get("Model")),
        serial=text(doc.get("SerialNumber")),
        firmware_version=text(doc.get("FirmwareVersion")),
        device_class=device_class,
        vendor_id=vendor_id,
        device_id=device_id,
        is_gpu=is_gpu,
    )


def firmware(doc: Doc, quirks: Quirks) -> FirmwareComponent | None:
    ident = text(doc.get("Id")) or last_segment(text(doc.get("@odata.id")))
    if any(ident.startswith(p) for p in quirks.firmware_skip_prefixes):
        return None  # e.g. iDRAC's Previous-/Installable- entries: not what runs now
    version = text(doc.get("Version"))
    if not version:
        return None
    updateable = doc.get("Updateable")
    name = text(doc.get("Name"))
    return FirmwareComponent(
        id=ident,
        name=name,
        version=version,
        updateable=updateable if isinstance(updateable, bool) else None,
        kind=firmware_kind(ident, name),
        uri=text(doc.get("@odata.id")),
    )


def firmware_of_system(system: Doc, manager: Doc) -> list[FirmwareComponent]:
    """For a BMC without a FirmwareInventory (sushy-tools, older firmware): the System's
    ``BiosVersion`` and the Manager's ``FirmwareVersion`` as components, their URIs as targets."""
    out = []
    if text(system.get("BiosVersion")):
        ident = text(system.get("Id")) or last_segment(text(system.get("@odata.id")))
        out.append(
            FirmwareComponent(
                id=f"{ident}/BIOS",
                name="BIOS",
                version=text(system["BiosVersion"]),
                kind="bios",
                uri=text(system.get("@odata.id")).rstrip("/"),
            )
        )
    if text(manager.get("FirmwareVersion")):
        out.append(
            FirmwareComponent(
                id=text(manager.get("Id")) or last_segment(text(manager.get("@odata.id"))),
                name=text(manager.get("Name")) or "BMC",
                version=text(manager["FirmwareVersion"]),
                kind="bmc",
                uri=text(manager.get("@odata.id")).rstrip("/"),
            )
        )
    return out


#: (kind, word starts in a component's id or name), first match wins; words are matched at their
#: start ("psu" is not in "Capsule", "uefi" not in "BlueField") and the order settles overlaps:
#: lifecycle before bios (Dell's "uEFI Diagnostics"), bmc before gpu (HGX_FW_BMC_0).
_FIRMWARE_KINDS = (
    (
        "lifecycle",
        (
            "lifecycle",
            "lc embedded",
            "usc",
            "lxpm",
            "driverpack",
            "diagnostics",
            "servicemodule",
            "intelligent provisioning",
        ),
    ),
    ("bios", ("bios", "uefi", "system rom", "redundant system rom")),
    ("bmc", ("idrac", "integrated dell remote access", "ilo", "xcc", "bmc", "cimc")),
    ("cpld", ("cpld", "fpga", "programmable logic")),
    ("tpm", ("tpm",)),
    ("psu", ("psu", "power supply", "powersupply")),
    ("bmc", ("manager",)),
    ("gpu", ("gpu", "nvidia", "hgx", "nvswitch")),
    ("drive", ("disk", "drive", "nvme", "ssd")),
    ("storage", ("raid", "perc", "smart array", "backplane", "storage", "hba", "sas")),
    ("nic", ("nic", "smartnic", "eth", "infiniband", "network", "lom", "connectx", "broadcom", "mellanox")),
)
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")


def firmware_kind(ident: str, name: str) -> str:
    """What a FirmwareInventory member is, from its id and name (vendors agree on neither):
    lifecycle, bios, bmc, cpld, tpm, psu, gpu, drive, storage, nic, else other."""
    words = " " + " ".join(w for w in _WORD_SPLIT.split(f"{ident} {name}".lower()) if w)
    for kind, starts in _FIRMWARE_KINDS:
        if any(f" {s}" in words for s in starts):
            return kind
    return "other"


def bmc_identity(manager: Doc, root: Doc) -> BmcIdentity:
    return BmcIdentity(
        id=text(manager.get("Id")),
        model=text(manager.get("Model")),
        firmware_version=text(manager.get("FirmwareVersion")),
        manager_type=text(manager.get("ManagerType")),
        uuid=text(manager.get("UUID")),
        redfish_version=text(root.get("RedfishVersion")),
        vendor=text(root.get("Vendor")) or next(iter((root.get("Oem") or {}).keys()), ""),
    )
