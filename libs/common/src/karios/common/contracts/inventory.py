"""Contracts owned by the inventory service (node registry, NetBox lookups)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, Field

from karios.common.contracts.base import Command, Event, Query
from karios.common.limits import BoundedIP, Ciphertext, HostName, Int32Id, Name, OptBoundedIP, Vendor
from karios.common.netaddr import IPStr, OptMacStr


class RegisterNode(Command):
    """Upsert a node in the registry (``bmc_infos``). Passwords arrive already encrypted."""

    TYPE = "karios.inventory.register_node.v1"

    bmc_ip: BoundedIP
    bmc_username: Name | None = None
    bmc_password_enc: Ciphertext | None = None
    os_hostname: HostName | None = None
    fqdn: HostName | None = None
    os_ip: OptBoundedIP = None
    os_username: Name | None = None
    os_password_enc: Ciphertext | None = None
    primary_mac: OptMacStr = None
    serial_number: Name | None = None
    vendor: Vendor | None = None
    atlas_device_id: Int32Id | None = None
    atlas_location_id: Int32Id | None = None
    atlas_rack_id: Int32Id | None = None
    atlas_site_id: Int32Id | None = None
    is_control_node: bool = True


class RegisterNodeResult(BaseModel):
    created: bool
    hostname: str
    node_ip: str
    bmc_ip: str


class NodeRegistered(Event):
    """A node was created or updated in the registry. Never carries credentials."""

    TYPE = "karios.inventory.node_registered.v1"

    bmc_ip: str
    created: bool
    hostname: str = ""
    node_ip: str = ""
    vendor: str = ""
    is_control_node: bool = True


class NodeQuery(Query):
    TYPE = "karios.inventory.node_query.v1"
    bmc_ip: str | None = None
    node_ip: str | None = None


class NodeSummary(BaseModel):
    """A registry row without secrets (what any caller may see)."""

    bmc_ip: str
    hostname: str = ""
    fqdn: str = ""
    node_ip: str = ""
    os_username: str = ""
    vendor: str = ""
    primary_mac: str = ""
    serial_number: str = ""
    is_control_node: bool = False
    has_bmc_credentials: bool = False
    has_os_credentials: bool = False
    labels: dict[str, str] = Field(default_factory=dict)


class HostInterface(BaseModel):
    name: str
    macs: list[str] = Field(default_factory=list)
    type: str = ""
    speed_mbps: int | None = None
    mgmt_only: bool = False
    ipv4: list[str] = Field(default_factory=list)
    ipv6: list[str] = Field(default_factory=list)


class HostUser(BaseModel):
    """An OS account the installer creates (NetBox config context ``karios.users``, or
    ``users:`` of a device in the YAML inventory). A user named ``root`` sets root's keys/password
    instead of creating an account. ``password_hash`` is a crypt(3) hash (``$6$…``): secret-ish,
    never logged (``repr=False``), only rendered into the install config."""

    name: str = Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    ssh_authorized_keys: list[Annotated[str, Field(pattern=r'^[^"\r\n]+$')]] = Field(default_factory=list)
    sudo: bool = False  # wheel/sudo group; passwordless sudo when there is no password_hash
    password_hash: str = Field("", repr=False, pattern=r"^[^\s\"'\\]*$")
    shell: str = Field("", pattern=r"^[^\s\"'\\]*$")


class Host(BaseModel):
    """A device as bootapi and the provisioner need it (from NetBox or the file inventory)."""

    id: int | None = None
    name: str
    platform: str = ""  # platform slug, e.g. "almalinux-9", "debian-12"
    role: str = ""  # device role slug
    site: str = ""
    rack: str = ""
    primary_ipv4: str = ""  # CIDR form, e.g. "10.0.0.5/24"
    primary_ipv6: str = ""
    oob_ip: str = ""
    interfaces: list[HostInterface] = Field(default_factory=list)
    pxe_enabled: bool = True  # unset custom field counts as true
    custom_fields: dict[str, object] = Field(default_factory=dict)
    # From the NetBox config context key ``karios`` (docs/inventory.md); empty = none given.
    users: list[HostUser] = Field(default_factory=list)
    ipv4_gateway: str = ""  # gateway of primary_ipv4 (context ``karios.network.gateway``)
    nameservers: list[str] = Field(default_factory=list)  # context ``karios.network.nameservers``


class HostQuery(Query):
    """Look a host up by MAC (any notation) or by device name."""

    TYPE = "karios.inventory.host_query.v1"
    mac: str | None = None
    name: str | None = None


class SetPxeEnabled(Query):
    TYPE = "karios.inventory.set_pxe_enabled.v1"
    ident: str  # MAC or device name
    enabled: bool


class DeviceChanged(Event):
    """NetBox (or the file inventory) changed a device: caches drop what they hold for it.

    An event with no ``device_id``, ``name`` or ``macs`` stands for a change any device may
    depend on (a config context, a module type, a platform): caches drop every entry."""

    TYPE = "karios.inventory.device_changed.v1"
    device_id: int | None = None
    name: str = ""
    macs: list[str] = Field(default_factory=list)


# -- BMC hardware (what the UI chooses disks, GPUs and the boot NIC from) -----------------------


class BmcHardwareQuery(Query):
    """Hardware of the device whose out-of-band (BMC) IP is ``bmc_ip``."""

    TYPE = "karios.inventory.bmc_hardware_query.v1"
    bmc_ip: IPStr


class Disk(BaseModel):
    name: str
    model: str = ""
    manufacturer: str = ""
    serial: str = ""
    size_gb: float | None = None
    bus: str = ""  # e.g. "nvme", "sata", "sas", or the module profile's disk type ("SSD", "NVME")
    pci_address: str = ""
    source: str = ""  # "inventory-item" | "module" | "file"


class Gpu(BaseModel):
    name: str
    model: str = ""
    manufacturer: str = ""
    serial: str = ""
    memory_gb: float | None = None
    pci_address: str = ""
    source: str = ""


class Nic(BaseModel):
    name: str
    macs: list[str] = Field(default_factory=list)
    primary_mac: str = ""
    type: str = ""
    speed_mbps: int | None = None
    mgmt_only: bool = False
    is_bmc: bool = False  # the NIC that carries the BMC (out-of-band) address
    enabled: bool = True
    ipv4: list[str] = Field(default_factory=list)


class BmcEndpointHint(BaseModel):
    """How to reach a device's BMC beyond its address, from the inventory record's custom fields
    ``bmc_scheme`` (http | https), ``bmc_port`` and ``redfish_system_id`` (NetBox custom fields on
    the device, or ``custom_fields`` in the YAML inventory). Empty = the provisioner's defaults."""

    scheme: str = ""
    port: int | None = None
    system_id: str = ""

    @classmethod
    def from_custom_fields(cls, cf: Mapping[str, Any] | None) -> BmcEndpointHint:
        cf = cf or {}
        scheme = str(cf.get("bmc_scheme") or "").strip().lower()
        port = cf.get("bmc_port")
        try:
            port_n = int(port) if port not in (None, "") else None  # type: ignore[arg-type]
        except (TypeError, ValueError):
            port_n = None
        return cls(
            scheme=scheme if scheme in ("http", "https") else "",
            port=port_n if port_n is not None and 0 < port_n < 65536 else None,
            system_id=str(cf.get("redfish_system_id") or "").strip(),
        )

    def url(self, bmc_ip: str, default_scheme: str) -> str:
        host = f"[{bmc_ip}]" if ":" in bmc_ip else bmc_ip
        return f"{self.scheme or default_scheme}://{host}{f':{self.port}' if self.port else ''}"


class BmcHardware(BaseModel):
    device_id: int | None = None
    device_name: str
    bmc_ip: str
    serial: str = Field("", description="The device's serial number in the inventory ('' none recorded)")
    disks: list[Disk] = Field(default_factory=list)
    gpus: list[Gpu] = Field(default_factory=list)
    nics: list[Nic] = Field(default_factory=list)
    endpoint: BmcEndpointHint = Field(default_factory=BmcEndpointHint)


# -- Node registry: what the fabric worker and the provisioner need ------------------------------


class NodeAccessQuery(Query):
    """Registered nodes with their OS address and SSH details (password as ciphertext only).

    ``bmc_ip`` or ``node_ip`` narrows to one node (404 if unknown); ``compute_only`` leaves the
    control node(s) out. Nodes without an OS IP are never listed (nothing to SSH to).
    """

    TYPE = "karios.inventory.node_access_query.v1"
    bmc_ip: str | None = None
    node_ip: str | None = None
    compute_only: bool = False


class NodeAccess(BaseModel):
    """SSH access to a node. ``os_password_enc`` is SecretBox ciphertext (context ``os:<bmc_ip>``)."""

    bmc_ip: str
    hostname: str = ""
    fqdn: str = ""
    node_ip: str
    os_username: str = "root"
    os_password_enc: str | None = None
    ssh_host_key: str | None = None
    vendor: str = ""
    is_control_node: bool = False
    # Compute nodes (karios.common.contracts.nodes): adopted / firstboot rows carry their own
    # port and private key, their secrets under the node contexts; "registry" = os:<bmc_ip>.
    source: str = "registry"
    ssh_port: int = 22
    ssh_private_key_enc: str | None = None


class BmcAccessQuery(Query):
    TYPE = "karios.inventory.bmc_access_query.v1"
    bmc_ip: IPStr


class BmcAccess(BaseModel):
    """How to reach a BMC. ``password_enc`` is SecretBox ciphertext (context ``bmc:<bmc_ip>``)."""

    bmc_ip: str
    vendor: str = ""
    username: str | None = None
    password_enc: str | None = None
    serial_number: str = ""
    hostname: str = ""


# -- Static addresses for the provisioner ---------------------------------------------------------


class AllocateIp(Query):
    """Give device ``name`` a static IPv4 from the configured pool (idempotent per name)."""

    TYPE = "karios.inventory.allocate_ip.v1"
    name: str
    # NetBox prefix to allocate from (the seed's ``prefix_id``); None = the configured static pool.
    prefix_id: int | None = None


class IpAllocation(BaseModel):
    name: str
    address: str  # CIDR form, e.g. "10.10.0.100/24"
    gateway: str = ""
    created: bool = False
