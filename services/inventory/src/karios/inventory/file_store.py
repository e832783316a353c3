"""YAML-backed inventory: the embedded default when no NetBox is configured, and the demo data.

Format (see ``data/demo-inventory.yaml`` and docs/inventory.md)::

    static_pool: {cidr: 10.10.0.0/24, start: 10.10.0.100, gateway: 10.10.0.1}   # optional
    devices:
      - name: node-01
        platform: almalinux-9
        oob_ip: 10.20.0.11
        interfaces: [{name: eno1, macs: ["aa:bb:cc:00:01:01"], type: 25gbase-x-sfp28, speed_mbps: 25000}]
        disks: [{name: nvme0, model: PM9A3, size_gb: 3840, bus: nvme, pci_address: "0000:41:00.0"}]
        gpus: [{name: gpu0, model: L40S, memory_gb: 48, pci_address: "0000:c1:00.0"}]

A ``pxe_enabled`` write is kept in memory and, when the YAML is a file of the operator's
(``KARIOS_INVENTORY_FILE``), written back atomically. The packaged demo file is never written.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from karios.common.contracts.inventory import (
    BmcEndpointHint,
    BmcHardware,
    Disk,
    Gpu,
    Host,
    HostInterface,
    IpAllocation,
    Nic,
)
from karios.common.errors import Conflict, ValidationFailed
from karios.common.netaddr import normalize_ip, normalize_mac

DEMO_FILE = "demo-inventory.yaml"


class FileInterface(HostInterface):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True

    @field_validator("macs")
    @classmethod
    def _macs(cls, v: list[str]) -> list[str]:
        return [normalize_mac(m) for m in v]


class FileDevice(Host):
    """A device of the YAML file: the contract's :class:`Host` plus what only the file holds
    (disks, GPUs, disabled interfaces; ``pxe_enabled`` may be left unset)."""

    model_config = ConfigDict(extra="forbid")

    pxe_enabled: bool | None = None  # type: ignore[assignment]
    custom_fields: dict[str, Any] = Field(default_factory=dict)
    interfaces: list[FileInterface] = Field(default_factory=list)  # type: ignore[assignment]
    disks: list[Disk] = Field(default_factory=list)
    gpus: list[Gpu] = Field(default_factory=list)
    serial: str = Field("", max_length=128, description="The device serial (compared with the BMC's)")

    @field_validator("oob_ip")
    @classmethod
    def _oob(cls, v: str) -> str:
        return normalize_ip(v) if v else ""

    def host(self) -> Host:
        cf = dict(self.custom_fields)
        if self.pxe_enabled is not None:
            cf["pxe_enabled"] = self.pxe_enabled
        fields = self.model_dump(
            include=set(Host.model_fields), exclude={"pxe_enabled", "custom_fields", "interfaces"}
        )
        return Host(
            **fields,
            interfaces=[
                HostInterface.model_validate(i.model_dump(exclude={"enabled"})) for i in self.interfaces
            ],
            pxe_enabled=self.pxe_enabled is not False,
            custom_fields=cf,
        )

    def hardware(self, bmc_ip: str) -> BmcHardware:
        nics = [
            Nic(
                name=i.name,
                macs=i.macs,
                primary_mac=i.macs[0] if i.macs else "",
                type=i.type,
                speed_mbps=i.speed_mbps,
                mgmt_only=i.mgmt_only,
                enabled=i.enabled,
                ipv4=i.ipv4,
                is_bmc=any(a.split("/")[0] == bmc_ip for a in i.ipv4 + i.ipv6),
            )
            for i in self.interfaces
        ]
        if not any(n.is_bmc for n in nics):
            mgmt = [n for n in nics if n.mgmt_only]
            if len(mgmt) == 1:
                mgmt[0].is_bmc = True
        return BmcHardware(
            device_id=self.id,
            device_name=self.name,
            bmc_ip=bmc_ip,
            serial=self.serial,
            disks=[d.model_copy(update={"source": d.source or "file"}) for d in self.disks],
            gpus=[g.model_copy(update={"source": g.source or "file"}) for g in self.gpus],
            nics=nics,
            endpoint=BmcEndpointHint.from_custom_fields(self.custom_fields),
        )


class StaticPool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cidr: str
    start: str = ""
    gateway: str = ""


class InventoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    static_pool: StaticPool | None = None
    devices: list[FileDevice] = Field(default_factory=list)


def load_inventory(text: str, source: str = "inventory") -> InventoryFile:
    """Parse and validate the YAML; a bad file is a 422 naming the field, never a crash later."""
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValidationFailed(f"{source}: not valid YAML ({exc})") from None
    try:
        inv = InventoryFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ValidationFailed(f"{source}: {where}: {first.get('msg')}", field=where) from None
    names = [d.name for d in inv.devices]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValidationFailed(f"{source}: duplicate device names {dupes}", field="devices")
    for n, dev in enumerate(inv.devices, start=1):
        if dev.id is None:
            dev.id = n
    return inv


class FileStore:
    """An :class:`~karios.inventory.store.InventoryStore` over one YAML document, indexed in memory."""

    kind = "file"

    def __init__(
        self, inventory: InventoryFile, *, path: Path | None = None, pool: StaticPool | None = None
    ) -> None:
        self._inv = inventory
        self._path = path
        self._pool = pool or inventory.static_pool
        self._lock = asyncio.Lock()
        self._allocations: dict[str, str] = {}
        self._reindex()

    @classmethod
    def from_path(cls, path: Path | None, *, pool: StaticPool | None = None) -> FileStore:
        """``path`` None → the packaged demo inventory (read-only)."""
        if path is None:
            text = resources.files("karios.inventory").joinpath("data", DEMO_FILE).read_text()
            return cls(load_inventory(text, DEMO_FILE), pool=pool)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValidationFailed(
                f"inventory_file: cannot read {path}: {exc.strerror}", field="inventory_file"
            ) from None
        return cls(load_inventory(text, str(path)), path=Path(path), pool=pool)

    def _reindex(self) -> None:
        self._by_name = {d.name: d for d in self._inv.devices}
        self._by_mac = {m: d for d in self._inv.devices for i in d.interfaces for m in i.macs}
        self._by_bmc: dict[str, FileDevice] = {}
        for d in self._inv.devices:
            for i in d.interfaces:
                for a in i.ipv4 + i.ipv6:
                    self._by_bmc.setdefault(a.split("/")[0], d)
        for d in self._inv.devices:  # oob_ip wins over an interface address
            if d.oob_ip:
                self._by_bmc[d.oob_ip] = d

    @property
    def devices(self) -> list[FileDevice]:
        return list(self._inv.devices)

    async def host_by_mac(self, mac: str) -> Host | None:
        dev = self._by_mac.get(mac)
        return dev.host() if dev else None

    async def host_by_name(self, name: str) -> Host | None:
        dev = self._by_name.get(name)
        return dev.host() if dev else None

    async def bmc_hardware(self, bmc_ip: str) -> BmcHardware | None:
        dev = self._by_bmc.get(bmc_ip)
        return dev.hardware(bmc_ip) if dev else None

    async def set_pxe_enabled(self, name: str, enabled: bool) -> Host | None:
        async with self._lock:
            dev = self._by_name.get(name)
            if dev is None:
                return None
            dev.pxe_enabled = enabled
            if self._path is not None:
                await asyncio.to_thread(self._write_back)
            return dev.host()

    def _write_back(self) -> None:
        assert self._path is not None
        data = self._inv.model_dump(mode="json", exclude_defaults=True)
        fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=f".{self._path.name}.")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(data, f, sort_keys=False)
        os.replace(tmp, self._path)

    async def allocate_ip(self, name: str, prefix_id: int | None = None) -> IpAllocation | None:
        # The file inventory has one pool: prefix_id (a NetBox id) does not select among pools here.
        async with self._lock:
            dev = self._by_name.get(name)
            if dev is None:
                return None
            gateway = self._pool.gateway if self._pool else ""
            if dev.primary_ipv4:
                return IpAllocation(name=name, address=dev.primary_ipv4, gateway=gateway, created=False)
            if name in self._allocations:
                return IpAllocation(
                    name=name, address=self._allocations[name], gateway=gateway, created=False
                )
            address = allocate_from_pool(self._pool, self._used_addresses())
            self._allocations[name] = address
            return IpAllocation(name=name, address=address, gateway=gateway, created=True)

    def _used_addresses(self) -> set[str]:
        used = {a.split("/")[0] for a in self._allocations.values()}
        for d in self._inv.devices:
            for a in [d.primary_ipv4, d.oob_ip] + [x for i in d.interfaces for x in i.ipv4]:
                if a:
                    used.add(a.split("/")[0])
        return used

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def allocate_from_pool(pool: StaticPool | None, used: set[str]) -> str:
    """The lowest free address of the pool from ``start`` (default network + 10), in CIDR form."""
    if pool is None:
        raise ValidationFailed(
            "static_pool: no static IP pool configured "
            "(KARIOS_INVENTORY_STATIC_POOL or static_pool in the YAML)",
            field="static_pool",
        )
    net = ipaddress.IPv4Network(pool.cidr, strict=False)
    start = ipaddress.IPv4Address(pool.start) if pool.start else net.network_address + 10
    taken = used | ({pool.gateway} if pool.gateway else set())
    for host in net.hosts():
        if host >= start and str(host) not in taken:
            return f"{host}/{net.prefixlen}"
    raise Conflict(f"static_pool: {pool.cidr} has no free address left")
