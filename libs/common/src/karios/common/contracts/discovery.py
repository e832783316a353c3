"""Contracts of the discovery of unknown servers (issue 27 item 3).

A MAC no host owns PXE-boots; with discovery on (``BOOTAPI_DISCOVERY_ENABLED``) bootapi boots it
into the live environment in discovery mode, which reads the machine's hardware in band (DMI, disks,
NICs, PCI) and posts it — :class:`DiscoveryReport` — to the gateway's ``POST
/controlnode/discovery/report`` with the discovery token of its boot
(:mod:`karios.common.discovery_token`), then powers off. The gateway checks the token and the
report and sends ``req.provision.record_discovery`` (:class:`RecordDiscovery`); the provisioner,
which keeps the hardware records, stores one *discovered server* per machine (the same MAC or
the same serial updates it) and announces it: ``karios.evt.inventory.server.discovered.<mac>``
(:class:`ServerDiscovered`).

An operator lists them (``GET /controlnode/discovered``: ``q.provision.discovered``) and adopts
one (``POST /controlnode/discovered/{id}/adopt``: ``req.provision.adopt_discovered``): the record
is marked adopted and the answer says what to add to the inventory (:class:`Adoption`);
``karios.evt.inventory.server.adopted.<mac>`` (:class:`ServerAdopted`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints, field_validator

from karios.common.contracts.base import Event, Query
from karios.common.contracts.hardware import Drive, NetworkInterface, PcieDevice, SystemInfo
from karios.common.errors import NotFound, register_error
from karios.common.netaddr import MacStr

# -- what the live environment reports --------------------------------------------------------------

_Text = Annotated[str, StringConstraints(max_length=256)]
_Short = Annotated[str, StringConstraints(max_length=64)]
_Hex4 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{4}$")]
DISKS_MAX, NICS_MAX, PCI_MAX = 256, 256, 1024  # a report stays far below the 1 MiB body and bus limits


class DmiInfo(BaseModel):
    """``/sys/class/dmi/id`` as read (each file's first line; '' when absent or unreadable)."""

    sys_vendor: _Text = ""
    product_name: _Text = ""
    product_version: _Text = ""
    product_serial: _Text = ""
    product_uuid: _Text = ""
    board_vendor: _Text = ""
    board_name: _Text = ""
    board_serial: _Text = ""
    chassis_serial: _Text = ""
    bios_vendor: _Text = ""
    bios_version: _Text = ""
    bios_date: _Text = ""


class ReportedDisk(BaseModel):
    """One block device of ``/sys/block`` (loop, ram, zram, md, dm, sr and nbd devices left out)."""

    name: str = Field(pattern=r"^[A-Za-z0-9._:+-]{1,64}$", description="Kernel name, e.g. sda, nvme0n1")
    size_bytes: int = Field(ge=0, le=2**63 - 1)
    model: _Text = ""
    serial: _Text = ""
    wwn: _Text = ""
    rotational: bool | None = None
    removable: bool | None = None
    transport: Literal["", "nvme", "sata", "sas", "scsi", "usb", "virtio", "mmc"] = ""


class ReportedNic(BaseModel):
    """One interface of ``/sys/class/net`` (lo left out)."""

    name: str = Field(pattern=r"^[A-Za-z0-9._:@+-]{1,32}$")
    mac: MacStr
    link: Literal["up", "down", "unknown"] = Field("unknown", description="carrier: up, down, or unknown")
    speed_mbps: int | None = Field(None, ge=0, le=10_000_000, description="null: not reported")
    driver: _Short = ""
    physical: bool = Field(True, description="false: a virtual interface (no device behind it)")


class ReportedPciDevice(BaseModel):
    """One function of ``/sys/bus/pci/devices``."""

    address: str = Field(
        pattern=r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", description="e.g. 0000:3b:00.0"
    )
    vendor_id: _Hex4
    device_id: _Hex4
    class_code: str = Field(pattern=r"^[0-9a-f]{6}$", description="PCI class, subclass, prog-if: 030000")
    subsystem_vendor_id: Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{4})?$")] = ""
    subsystem_device_id: Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{4})?$")] = ""
    driver: _Short = ""


class DiscoveryReport(BaseModel):
    """The body of ``POST /controlnode/discovery/report``: what the live environment read."""

    agent: _Short = Field("", description="The script that read it, e.g. karios-discovery/1")
    boot_mac: MacStr | None = Field(None, description="The NIC the live environment brought up")
    ip: _Short = Field("", description="Its address then ('' none)")
    kernel: _Short = ""
    dmi: DmiInfo = Field(default_factory=DmiInfo)
    cpu_model: _Text = ""
    cpu_threads: int | None = Field(None, ge=0, le=1_000_000)
    memory_mib: int | None = Field(None, ge=0, le=2**40)
    disks: list[ReportedDisk] = Field(default_factory=list, max_length=DISKS_MAX)
    nics: list[ReportedNic] = Field(default_factory=list, max_length=NICS_MAX)
    pci: list[ReportedPciDevice] = Field(default_factory=list, max_length=PCI_MAX)

    @field_validator("disks", "nics")
    @classmethod
    def _unique_names(cls, items: list[ReportedDisk] | list[ReportedNic]) -> list:  # type: ignore[type-arg]
        seen: set[str] = set()
        for item in items:
            if item.name in seen:
                raise ValueError(f"{item.name!r} is reported twice")
            seen.add(item.name)
        return items


# -- the discovered server ---------------------------------------------------------------------------


class DiscoveredServer(BaseModel):
    """A machine Karios did not know that reported its hardware; the hardware in the shapes of the
    out-of-band hardware record (:mod:`karios.common.contracts.hardware`)."""

    id: str
    status: Literal["discovered", "adopted"]
    boot_mac: str = Field(description="The MAC it PXE-booted from (lower-case aa:bb:…)")
    serial: str = Field("", description="Its serial number ('' when DMI had none or a placeholder)")
    system: SystemInfo = Field(default_factory=SystemInfo)
    processor_model: str = ""
    processor_threads: int | None = None
    memory_mib: int | None = None
    drives: list[Drive] = Field(default_factory=list)
    nics: list[NetworkInterface] = Field(default_factory=list)
    pcie_devices: list[PcieDevice] = Field(default_factory=list)
    gpus: list[PcieDevice] = Field(default_factory=list, description="The PCIe devices that are GPUs")
    ip: str = Field("", description="The address the live environment had")
    first_seen: str = Field(description="First report (ISO 8601, UTC)")
    last_seen: str = Field(description="Latest report (ISO 8601, UTC)")
    report_count: int = 1
    hostname: str = Field("", description="Set at adoption")
    adopted_at: str = ""
    adopted_by: str = ""


class RecordDiscovery(Query):
    """Store a discovery report (the gateway has checked its token: ``boot_mac`` comes from it)."""

    TYPE = "karios.provision.record_discovery.v1"
    boot_mac: MacStr
    report: DiscoveryReport
    source_ip: _Short = ""


class DiscoveryRecorded(BaseModel):
    """The answer to a report: which record it is; ``created`` false when the machine was known
    (same MAC or serial), ``changed`` false when the report said nothing new."""

    id: str
    status: Literal["discovered", "adopted"]
    created: bool
    changed: bool


class DiscoveredQuery(Query):
    """The discovered servers, newest report first (``status``: only those; ``id``: that one;
    ``offset``/``limit``: one page, ``limit`` 0 = the provisioner's cap of 1,000)."""

    TYPE = "karios.provision.discovered_query.v1"
    status: Literal["", "discovered", "adopted"] = ""
    id: _Short = ""
    offset: int = Field(0, ge=0, le=2_147_483_647)
    limit: int = Field(0, ge=0, le=1000)


class DiscoveredList(BaseModel):
    servers: list[DiscoveredServer] = Field(default_factory=list)


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"^$|^{_LABEL}(?:\.{_LABEL})*$"


class AdoptDiscovered(Query):
    """Turn a discovered server into a known one: mark it adopted; the answer says what to add."""

    TYPE = "karios.provision.adopt_discovered.v1"
    id: _Short
    hostname: str = Field(
        "",
        max_length=253,
        pattern=_HOSTNAME,
        description="The device name it gets ('' a name from its serial/MAC)",
    )
    requested_by: _Short = ""


class NetboxInterface(BaseModel):
    """One ``dcim/interfaces`` object to create on the device (MAC through ``dcim/mac-addresses``
    on NetBox 4.2+)."""

    name: str
    type: str = Field(description="NetBox interface type, e.g. 25gbase-x-sfp28, 1000base-t, other")
    mac_address: str
    mgmt_only: bool = False


class NetboxDevice(BaseModel):
    """The ``dcim/devices`` object for the adopted server. With the inventory's write-back on
    (``KARIOS_INVENTORY_WRITEBACK``) it is created with the site and role the write-back settings
    name and the device type of ``manufacturer``/``model`` (or ``KARIOS_INVENTORY_WRITEBACK_DEVICE_TYPE``);
    otherwise they are the operator's choice."""

    name: str
    status: Literal["planned"] = "planned"
    serial: str = ""
    manufacturer: str = Field("", description="The manufacturer DMI names (for the device type)")
    model: str = Field("", description="The product DMI names (for the device type)")
    interfaces: list[NetboxInterface] = Field(default_factory=list)
    custom_fields: dict[str, str | bool] = Field(default_factory=dict)


class Adoption(BaseModel):
    """An adopted server and what the operator adds to the inventory to make it a known host."""

    server: DiscoveredServer
    netbox_device: NetboxDevice
    netbox_written: bool = Field(
        False,
        description="true: the device is in NetBox (created in status planned, or found by name or "
        "serial) with the reported interfaces, disks and GPUs; false: add it yourself",
    )
    netbox_device_id: int | None = Field(None, description="The NetBox device's id (when written)")
    netbox_reason: str = Field(
        "",
        description="Why it was not written: write-back off, no site/role set, NetBox refused… ('' written)",
    )
    next_steps: list[str] = Field(default_factory=list)


# -- events ------------------------------------------------------------------------------------------


class ServerDiscovered(Event):
    """An unknown machine reported its hardware: a new discovered server (``created``) or a known
    one with a changed report. A summary; the record: ``GET /controlnode/discovered``."""

    TYPE = "karios.inventory.server_discovered.v1"

    id: str
    boot_mac: str
    created: bool
    serial: str = ""
    manufacturer: str = ""
    model: str = ""
    processor_threads: int | None = None
    memory_mib: int | None = None
    drive_count: int = 0
    nic_count: int = 0
    gpu_count: int = 0
    ip: str = ""

    @classmethod
    def of(cls, server: DiscoveredServer, *, created: bool) -> ServerDiscovered:
        return cls(
            id=server.id,
            boot_mac=server.boot_mac,
            created=created,
            serial=server.serial,
            manufacturer=server.system.manufacturer,
            model=server.system.model,
            processor_threads=server.processor_threads,
            memory_mib=server.memory_mib,
            drive_count=len(server.drives),
            nic_count=len(server.nics),
            gpu_count=len(server.gpus),
            ip=server.ip,
        )


class ServerAdopted(Event):
    """An operator adopted a discovered server (``POST /controlnode/discovered/{id}/adopt``)."""

    TYPE = "karios.inventory.server_adopted.v1"

    id: str
    boot_mac: str
    serial: str = ""
    hostname: str
    adopted_by: str = ""
    netbox_written: bool = False


@register_error
class DiscoveredServerNotFound(NotFound):
    """No discovered server with this id."""

    code = "DISCOVERED_SERVER_NOT_FOUND"
    http_status = 404
