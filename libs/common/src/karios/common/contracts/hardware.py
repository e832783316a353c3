"""Contracts of a server's hardware as its BMC reports it (issue 27): out-of-band inspection,
the stored hardware record, BMC credential rotation.

The provisioner owns the BMC drivers, so it answers these: the gateway's ``POST
/controlnode/bmc/{ip}/inspect`` sends ``req.provision.inspect_hardware`` (a bounded synchronous
request: a read of a few dozen Redfish resources, nothing to resume or undo), ``GET
/controlnode/bmc/{ip}/hardware`` asks ``q.provision.hardware``, ``POST
/controlnode/bmc/{ip}/rotate-credentials`` sends ``req.provision.rotate_bmc_credentials``.

Events: ``karios.evt.inventory.hardware.inspected.<bmc ip>`` (:class:`HardwareInspected`) and
``karios.evt.provision.bmc.credentials_rotated.<bmc ip>`` (:class:`BmcCredentialsRotated`). No
contract here ever carries a password.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from karios.common.contracts.base import Event, Query
from karios.common.errors import Conflict, KariosError, NotFound, register_error
from karios.common.limits import BoundedIP

# -- inspection -------------------------------------------------------------------------------


class InspectHardware(Query):
    """Read the server's hardware through its BMC now and store it as its hardware record."""

    TYPE = "karios.provision.inspect_hardware.v1"
    bmc_ip: BoundedIP
    vendor: str = Field(
        "",
        max_length=32,
        description="BMC driver to use (dell, hpe, lenovo, supermicro, cisco, generic); "
        "empty: the registry's vendor, else detected from the service root",
    )


class HardwareQuery(Query):
    """The stored hardware record of one BMC (404 ``HARDWARE_NOT_INSPECTED`` if never read)."""

    TYPE = "karios.provision.hardware_query.v1"
    bmc_ip: BoundedIP


class SystemInfo(BaseModel):
    manufacturer: str = ""
    model: str = ""
    serial: str = ""
    sku: str = ""
    uuid: str = ""
    bios_version: str = ""
    power_state: str = Field("", description="On | Off | PoweringOn | PoweringOff ('' unknown)")
    health: str = ""
    redfish_id: str = Field("", description="The Redfish system read (its @odata.id)")


#: What firmware puts in a DMI (or Redfish) serial/UUID field it was never given: no machine is
#: told apart by it, and none is written anywhere as a serial.
DMI_PLACEHOLDERS = frozenset(
    s.lower()
    for s in (
        "",
        "0",
        "00000000",
        "0123456789",
        "1234567890",
        "123456789",
        "Default string",
        "Default",
        "None",
        "N/A",
        "NA",
        "Not Applicable",
        "Not Available",
        "Not Specified",
        "Not Defined",
        "OEM",
        "O.E.M.",
        "System Serial Number",
        "Chassis Serial Number",
        "SerialNumber",
        "To Be Filled By O.E.M.",
        "To be filled by O.E.M.",
        "Unknown",
        "XXXXXXXXXX",
        "00000000-0000-0000-0000-000000000000",
        "03000200-0400-0500-0006-000700080009",  # the AMI default UUID
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
    )
)


def usable_dmi(value: str) -> str:
    """A DMI/Redfish identity value with its whitespace trimmed, or '' when it is a placeholder."""
    v = " ".join(value.split())
    return "" if v.lower() in DMI_PLACEHOLDERS else v


class Processor(BaseModel):
    socket: str = ""
    manufacturer: str = ""
    model: str = ""
    architecture: str = ""
    cores: int | None = None
    threads: int | None = None
    max_speed_mhz: int | None = None


class MemoryModule(BaseModel):
    slot: str = ""
    size_mib: int | None = None
    type: str = Field("", description="e.g. DDR4, DDR5")
    speed_mhz: int | None = None
    manufacturer: str = ""
    part_number: str = ""
    serial: str = ""


class Drive(BaseModel):
    id: str = ""
    name: str = ""
    model: str = ""
    manufacturer: str = ""
    serial: str = ""
    size_bytes: int | None = None
    size_gb: float | None = Field(None, description="Decimal GB (size_bytes / 10^9), one decimal")
    media_type: str = Field("", description="HDD | SSD | SMR ('' not reported)")
    protocol: str = Field("", description="NVMe | SATA | SAS | … ('' not reported)")
    controller: str = Field("", description="The Storage (or SimpleStorage) resource holding it")
    firmware_version: str = ""
    source: str = Field("Storage", description="Storage | SimpleStorage (no serial, no protocol there)")


class NetworkInterface(BaseModel):
    id: str = ""
    name: str = ""
    mac: str = Field("", description="Lower-case aa:bb:cc:dd:ee:ff ('' not reported)")
    permanent_mac: str = ""
    link_status: str = Field("", description="LinkUp | LinkDown | NoLink ('' not reported)")
    speed_mbps: int | None = None
    enabled: bool | None = None
    host_interface: bool = Field(
        False, description="The host's internal link to its own BMC (e.g. Lenovo ToManager), not a port"
    )


class PcieDevice(BaseModel):
    id: str = ""
    name: str = ""
    manufacturer: str = ""
    model: str = ""
    serial: str = ""
    firmware_version: str = ""
    device_class: str = Field("", description="PCI class of its first function, e.g. DisplayController")
    vendor_id: str = Field("", description="PCI vendor id, lower-case 4 hex digits ('' unknown)")
    device_id: str = Field("", description="PCI device id, lower-case 4 hex digits ('' unknown)")
    is_gpu: bool = False

    @property
    def pci_id(self) -> str:
        return f"{self.vendor_id}:{self.device_id}" if self.vendor_id and self.device_id else ""


class FirmwareComponent(BaseModel):
    id: str = Field("", description="FirmwareInventory member id (e.g. Installed-159-1.8.2__BIOS.Setup.1-1)")
    name: str = ""
    version: str = ""
    updateable: bool | None = Field(None, description="The BMC can update it (null: not reported)")
    kind: str = Field(
        "other",
        description="What the component is, from its id and name: bios, bmc, cpld, nic, storage, drive, "
        "psu, gpu, tpm, lifecycle, other",
    )
    uri: str = Field("", description="Its FirmwareInventory resource: a `targets` entry of a firmware update")


class BmcIdentity(BaseModel):
    id: str = ""
    model: str = ""
    firmware_version: str = ""
    manager_type: str = ""
    uuid: str = ""
    redfish_version: str = ""
    vendor: str = Field("", description="The vendor the service root names (Vendor, else its Oem key)")


class HardwareRecord(BaseModel):
    """What the BMC reported, as read at ``inspected_at``. ``missing`` names every collection the
    BMC did not offer or could not be read (a partial record says so instead of guessing)."""

    bmc_ip: str
    inspected_at: str = Field(description="When the BMC was read (ISO 8601, UTC)")
    driver: str = Field(description="The BMC driver used (vendor quirks), e.g. dell, generic")
    duration_ms: int = 0
    system: SystemInfo = Field(default_factory=SystemInfo)
    processors: list[Processor] = Field(default_factory=list)
    processor_count: int | None = Field(None, description="Sockets (the list, else ProcessorSummary)")
    memory_total_gib: float | None = None
    memory: list[MemoryModule] = Field(default_factory=list)
    drives: list[Drive] = Field(default_factory=list)
    nics: list[NetworkInterface] = Field(default_factory=list)
    pcie_devices: list[PcieDevice] = Field(default_factory=list)
    gpus: list[PcieDevice] = Field(default_factory=list, description="The PCIe devices that are GPUs")
    firmware: list[FirmwareComponent] = Field(default_factory=list)
    bmc: BmcIdentity = Field(default_factory=BmcIdentity)
    missing: list[str] = Field(default_factory=list, description="'<collection>: <why>' per gap")


class HardwareInspected(Event):
    """A BMC was inspected and its hardware record replaced. A summary: the record is read with
    ``GET /controlnode/bmc/{ip}/hardware``. Never carries a credential."""

    TYPE = "karios.inventory.hardware_inspected.v1"

    bmc_ip: str
    inspected_at: str
    driver: str
    manufacturer: str = ""
    model: str = ""
    serial: str = ""
    power_state: str = ""
    processor_count: int | None = None
    memory_total_gib: float | None = None
    drive_count: int = 0
    nic_count: int = 0
    gpu_count: int = 0
    firmware_count: int = 0
    missing: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, rec: HardwareRecord) -> HardwareInspected:
        return cls(
            bmc_ip=rec.bmc_ip,
            inspected_at=rec.inspected_at,
            driver=rec.driver,
            manufacturer=rec.system.manufacturer,
            model=rec.system.model,
            serial=rec.system.serial,
            power_state=rec.system.power_state,
            processor_count=rec.processor_count,
            memory_total_gib=rec.memory_total_gib,
            drive_count=len(rec.drives),
            nic_count=len([n for n in rec.nics if not n.host_interface]),
            gpu_count=len(rec.gpus),
            firmware_count=len(rec.firmware),
            missing=rec.missing,
        )


@register_error
class HardwareNotInspected(NotFound):
    """No hardware record for this BMC: ``POST /controlnode/bmc/{ip}/inspect`` first."""

    code = "HARDWARE_NOT_INSPECTED"
    http_status = 404


# -- power-state sync ----------------------------------------------------------------------------


class PowerStateChanged(Event):
    """A server's power state changed while no Karios job was working on it (someone pressed the
    button, another tool, a power failure): seen by the periodic power sync."""

    TYPE = "karios.provision.power_state_changed.v1"

    bmc_ip: str
    previous: str = Field(description="Power state at the previous read (On, Off, …)")
    current: str = Field(description="Power state now ('' the BMC did not say)")
    change: str = Field(description="powered_off | powered_on | other")
    health: str = ""
    observed_at: str = Field(description="When the change was read (ISO 8601, UTC)")
    previous_read_at: str = Field(description="When the previous state was read: the change is in between")


# -- BMC credential rotation --------------------------------------------------------------------


class RotateBmcCredentials(Query):
    """Give the BMC account Karios uses a new random password (AccountService), check a login
    with it, store it encrypted in the registry; the old password is put back if any step fails."""

    TYPE = "karios.provision.rotate_bmc_credentials.v1"
    bmc_ip: BoundedIP
    requested_by: str = Field("", max_length=128, description="Who asked (audit), never a secret")


class BmcCredentialsRotation(BaseModel):
    """The outcome (never the password)."""

    bmc_ip: str
    username: str = Field(description="The BMC account whose password was changed")
    account_uri: str = Field(description="Its AccountService resource")
    rotated_at: str = Field(description="ISO 8601, UTC")
    verified_by: str = Field(description="How the new password was checked: session | basic")
    stored_in: str = Field(description="Where the encrypted password is kept: registry")


class BmcCredentialsRotated(Event):
    """A BMC account got a new password (verified, stored encrypted). Never carries it."""

    TYPE = "karios.provision.bmc_credentials_rotated.v1"

    bmc_ip: str
    username: str
    rotated_at: str
    verified_by: str
    requested_by: str = ""


@register_error
class BmcRotationRefused(Conflict):
    """Rotation cannot run now or here (a job uses the BMC; its credentials live in settings)."""

    code = "BMC_ROTATION_REFUSED"
    http_status = 409


@register_error
class BmcRotationFailed(KariosError):
    """The BMC did not take the new password, or it did not work: the old one was put back
    (``details.rolled_back``) — or, if even that failed, ``details.rolled_back`` is false and the
    BMC needs an operator."""

    code = "BMC_ROTATION_FAILED"
    http_status = 502


# -- a provision against the hardware record (issue 27 item 2) -----------------------------------


@register_error
class HardwareContradiction(Conflict):
    """A provision asks for hardware the server's stored hardware record says it does not have
    (``field`` names which: ``selected_disks``, ``selected_nic_mac`` or ``gpu_passthrough``)."""

    code = "HARDWARE_CONTRADICTION"
    http_status = 409


def _norm_mac(mac: str) -> str:
    return "".join(c for c in mac.lower() if c in "0123456789abcdef")


def contradiction(
    rec: HardwareRecord,
    *,
    selected_disks: Sequence[str] = (),
    disk_serials: dict[str, str] | None = None,
    selected_nic_mac: str = "",
    gpu_passthrough: bool = False,
    gpu_ids: Sequence[str] = (),
) -> tuple[str, str] | None:
    """``(field, why)`` when a provision contradicts the record, else None (pure).

    Only what the record can tell is checked: a collection the BMC did not report (empty, or it or
    one of its members named in ``missing``) never refuses. A selected disk matches a reported
    drive by id, name or serial; a Linux name (``sdb``) is matched through its serial in the
    inventory (``disk_serials``), and only when every reported drive has a serial. The MAC must be
    one of the inspected NICs' (the host's link to its own BMC excluded). ``gpu_passthrough``
    needs a GPU among the PCIe devices (and each listed ``vendor:device`` id, when the GPUs report
    ids)."""
    gaps = [m.split(":", 1)[0].strip() for m in rec.missing]

    def unread(*prefixes: str) -> bool:  # the BMC did not give the whole collection
        return any(g.startswith(prefixes) for g in gaps)

    when = f"(inspected {rec.inspected_at})"
    serials = disk_serials or {}
    drives = rec.drives if not unread("Storage", "SimpleStorage", "Drive") else []
    if selected_disks and drives:
        known = {v.lower() for d in drives for v in (d.id, d.name, d.serial) if v}
        every_serial = all(d.serial for d in drives)
        reported = {d.serial.lower() for d in drives if d.serial}
        for disk in selected_disks:
            name = disk.removeprefix("/dev/")
            if name.lower() in known or disk.lower() in known:
                continue
            serial = serials.get(name, "")
            if serial and every_serial and serial.lower() not in reported:
                return (
                    "selected_disks",
                    f"{name} (serial {serial} in the inventory) is not among the {len(drives)} disks "
                    f"the BMC reported {when}",
                )
    nics = [n for n in rec.nics if not n.host_interface] if not unread("EthernetInterfaces") else []
    if selected_nic_mac and nics:
        macs = {_norm_mac(m) for n in nics for m in (n.mac, n.permanent_mac) if m}
        if macs and _norm_mac(selected_nic_mac) not in macs:
            return (
                "selected_nic_mac",
                f"{selected_nic_mac} is not the MAC of any NIC the BMC reported {when}",
            )
    if gpu_passthrough and not unread("PCIeDevice", "PCIeFunction", "Chassis"):
        if not rec.gpus:
            return ("gpu_passthrough", f"the BMC reported no GPU among the PCIe devices {when}")
        have = {g.pci_id for g in rec.gpus}
        if gpu_ids and all(have):
            absent = [i for i in gpu_ids if i.lower() not in have]
            if absent:
                return (
                    "gpu_passthrough",
                    f"no GPU with id {', '.join(absent)} among those the BMC reported {when}",
                )
    return None
