"""Objects the NetBox contract tests create through the API (and delete again).

One device modelled the way docs/inventory.md says: oob_ip on a mgmt-only ``bmc`` interface,
two NICs with MACs, a primary IPv4, two disks and a GPU as role-tagged inventory items (with
the optional ``size_gb``/``pci_address`` custom fields), and a second device whose disk and GPU
are modules in module bays (module type profiles "Hard disk" and "GPU").
"""

from __future__ import annotations

import contextlib
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import pynetbox
from pynetbox.core.query import RequestError


def ensure(endpoint: Any, lookup: dict[str, Any], create: dict[str, Any]) -> tuple[Any, bool]:
    """Get-or-create (safe when another test run created it concurrently)."""
    found = endpoint.get(**lookup)
    if found is not None:
        return found, False
    try:
        return endpoint.create(create), True
    except RequestError:
        found = endpoint.get(**lookup)
        if found is None:
            raise
        return found, False


@dataclass
class LabDevice:
    name: str
    id: int
    bmc_ip: str
    macs: dict[str, str]  # interface name → MAC
    primary_ipv4: str = ""


@dataclass
class NetBoxLab:
    nb: pynetbox.api
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    created: list[Any] = field(default_factory=list)  # deleted in reverse order

    def _new(self, endpoint: Any, data: dict[str, Any]) -> Any:
        obj = endpoint.create(data)
        self.created.append(obj)
        return obj

    def _ensure(self, endpoint: Any, lookup: dict[str, Any], create: dict[str, Any]) -> Any:
        obj, _ = ensure(endpoint, lookup, create)
        return obj

    def shared(self) -> None:
        """Custom fields and roles every run uses (left in place: other runs may use them too)."""
        nb = self.nb
        self._ensure(
            nb.extras.custom_fields,
            {"name": "pxe_enabled"},
            {
                "name": "pxe_enabled",
                "type": "boolean",
                "object_types": ["dcim.device"],
                "label": "PXE enabled",
            },
        )
        self._ensure(
            nb.extras.custom_fields,
            {"name": "size_gb"},
            {"name": "size_gb", "type": "integer", "object_types": ["dcim.inventoryitem", "dcim.module"]},
        )
        self._ensure(
            nb.extras.custom_fields,
            {"name": "pci_address"},
            {"name": "pci_address", "type": "text", "object_types": ["dcim.inventoryitem", "dcim.module"]},
        )
        self.disk_role = self._ensure(
            nb.dcim.inventory_item_roles, {"slug": "disk"}, {"name": "Disk", "slug": "disk"}
        )
        self.gpu_role = self._ensure(
            nb.dcim.inventory_item_roles, {"slug": "gpu"}, {"name": "GPU", "slug": "gpu"}
        )

    def base(self) -> None:
        nb, s = self.nb, self.suffix
        self.site = self._new(nb.dcim.sites, {"name": f"kc-site-{s}", "slug": f"kc-site-{s}"})
        self.maker = self._new(nb.dcim.manufacturers, {"name": f"kc-maker-{s}", "slug": f"kc-maker-{s}"})
        self.role = self._new(nb.dcim.device_roles, {"name": f"kc-compute-{s}", "slug": f"kc-compute-{s}"})
        self.platform = self._new(nb.dcim.platforms, {"name": f"kc-alma-{s}", "slug": f"kc-alma-{s}"})
        self.dtype = self._new(
            nb.dcim.device_types,
            {"manufacturer": self.maker.id, "model": f"kc-r760-{s}", "slug": f"kc-r760-{s}"},
        )

    def _ip(self) -> str:
        return f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.{random.randint(2, 254)}"

    def device_with_items(self) -> LabDevice:
        """2 NICs with MACs + a BMC port, 2 disks and 1 GPU as inventory items."""
        nb, s = self.nb, self.suffix
        dev = self._new(
            nb.dcim.devices,
            {
                "name": f"kc-node-{s}",
                "device_type": self.dtype.id,
                "role": self.role.id,
                "site": self.site.id,
                "platform": self.platform.id,
            },
        )
        mac_prefix = f"02:{s[0:2]}:{s[2:4]}:{s[4:6]}:{s[6:8]}"
        bmc = self._new(
            nb.dcim.interfaces,
            {
                "device": dev.id,
                "name": "bmc",
                "type": "1000base-t",
                "mgmt_only": True,
                "mac_address": f"{mac_prefix}:00",
            },
        )
        eno1 = self._new(
            nb.dcim.interfaces,
            {"device": dev.id, "name": "eno1", "type": "25gbase-x-sfp28", "mac_address": f"{mac_prefix}:01"},
        )
        self._new(
            nb.dcim.interfaces,
            {
                "device": dev.id,
                "name": "eno2",
                "type": "25gbase-x-sfp28",
                "speed": 25_000_000,
                "mac_address": f"{mac_prefix}:02",
            },
        )
        bmc_ip = self._ip()
        oob = self._new(
            nb.ipam.ip_addresses,
            {
                "address": f"{bmc_ip}/24",
                "assigned_object_type": "dcim.interface",
                "assigned_object_id": bmc.id,
            },
        )
        os_ip = self._ip()
        prim = self._new(
            nb.ipam.ip_addresses,
            {
                "address": f"{os_ip}/24",
                "assigned_object_type": "dcim.interface",
                "assigned_object_id": eno1.id,
            },
        )
        dev.update({"oob_ip": oob.id, "primary_ip4": prim.id})
        for n, pci in ((0, "0000:41:00.0"), (1, "0000:42:00.0")):
            self._new(
                nb.dcim.inventory_items,
                {
                    "device": dev.id,
                    "name": f"nvme{n}",
                    "role": self.disk_role.id,
                    "manufacturer": self.maker.id,
                    "part_id": "PM9A3",
                    "serial": f"S64G{s}{n}",
                    "custom_fields": {"size_gb": 3840, "pci_address": pci},
                },
            )
        self._new(
            nb.dcim.inventory_items,
            {
                "device": dev.id,
                "name": "gpu0",
                "role": self.gpu_role.id,
                "manufacturer": self.maker.id,
                "part_id": "L40S",
                "serial": f"GPU{s}",
                "description": "48 GB, bus 0000:c1:00.0",
            },
        )
        self._new(
            nb.dcim.inventory_items, {"device": dev.id, "name": "psu0", "part_id": "PSU"}
        )  # no role: ignored
        return LabDevice(
            name=dev.name,
            id=dev.id,
            bmc_ip=bmc_ip,
            primary_ipv4=f"{os_ip}/24",
            macs={"bmc": f"{mac_prefix}:00", "eno1": f"{mac_prefix}:01", "eno2": f"{mac_prefix}:02"},
        )

    def device_with_modules(self) -> LabDevice:
        """A disk and a GPU as modules in module bays; BMC IP only on an interface (no oob_ip)."""
        nb, s = self.nb, self.suffix
        profiles = {p.name: p.id for p in nb.dcim.module_type_profiles.all()}
        disk_type = self._new(
            nb.dcim.module_types,
            {
                "manufacturer": self.maker.id,
                "model": f"kc-ssd-{s}",
                "profile": profiles["Hard disk"],
                "attributes": {"type": "SSD", "size": 960},
            },
        )
        gpu_type = self._new(
            nb.dcim.module_types,
            {
                "manufacturer": self.maker.id,
                "model": f"kc-h100-{s}",
                "profile": profiles["GPU"],
                "attributes": {"memory": 80, "gpu": "H100"},
            },
        )
        dev = self._new(
            nb.dcim.devices,
            {"name": f"kc-mod-{s}", "device_type": self.dtype.id, "role": self.role.id, "site": self.site.id},
        )
        bay_disk = self._new(nb.dcim.module_bays, {"device": dev.id, "name": "Drive bay 0"})
        bay_gpu = self._new(nb.dcim.module_bays, {"device": dev.id, "name": "PCIe slot 1"})
        self._new(
            nb.dcim.modules,
            {"device": dev.id, "module_bay": bay_disk.id, "module_type": disk_type.id, "serial": f"SSD{s}"},
        )
        self._new(
            nb.dcim.modules,
            {
                "device": dev.id,
                "module_bay": bay_gpu.id,
                "module_type": gpu_type.id,
                "serial": f"H100{s}",
                "custom_fields": {"pci_address": "0000:81:00.0"},
            },
        )
        mac = f"02:{s[0:2]}:{s[2:4]}:{s[4:6]}:ff:00"
        ipmi = self._new(
            nb.dcim.interfaces, {"device": dev.id, "name": "ipmi", "type": "1000base-t", "mac_address": mac}
        )
        bmc_ip = self._ip()
        self._new(
            nb.ipam.ip_addresses,
            {
                "address": f"{bmc_ip}/24",
                "assigned_object_type": "dcim.interface",
                "assigned_object_id": ipmi.id,
            },
        )
        return LabDevice(name=dev.name, id=dev.id, bmc_ip=bmc_ip, macs={"ipmi": mac})

    def read_only_token(self) -> str:
        admin = self.nb.users.users.get(username="admin")
        tok = self._new(
            self.nb.users.tokens,
            {"user": admin.id, "write_enabled": False, "description": f"kc read-only {self.suffix}"},
        )
        data = dict(tok)
        return f"nbt_{data['key']}.{data['token']}" if data.get("version") == 2 else str(data["token"])

    def cleanup(self) -> None:
        for obj in reversed(self.created):
            with contextlib.suppress(Exception):
                obj.delete()
        self.created.clear()
