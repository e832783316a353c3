"""NetBox JSON → Karios contracts. Pure: plain dicts in (as the REST API returns them), models out.

Kept apart from the pynetbox adapter so the rules (which MACs count, what is a disk, which NIC
carries the BMC) are readable and unit-testable on recorded JSON.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from karios.common.contracts.inventory import (
    BmcEndpointHint,
    BmcHardware,
    Disk,
    Gpu,
    Host,
    HostInterface,
    Nic,
)
from karios.common.netaddr import mac_or_none
from karios.inventory.context import network_from_context, users_from_context

Json = Mapping[str, Any]

_SPEED_IN_TYPE = re.compile(r"^(\d+(?:\.\d+)?)(g|m)?base", re.IGNORECASE)
_SIZE_IN_TEXT = re.compile(r"(\d+(?:\.\d+)?)\s*(TB|GB|TiB|GiB)\b", re.IGNORECASE)
_PCI_ADDRESS = re.compile(r"\b(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\b", re.IGNORECASE)


@dataclass(frozen=True)
class HardwareRules:
    """How disks and GPUs are recognised (inventory-item role slugs, module type profile names)."""

    disk_role: str = "disk"
    gpu_role: str = "gpu"
    disk_module_profile: str = "Hard disk"
    gpu_module_profile: str = "GPU"


def _get(obj: Json | None, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _str(value: Any) -> str:
    return "" if value is None else str(value)


def _safe_mac(value: Any) -> str | None:
    return mac_or_none(str(value)) if value else None


def interface_macs(iface: Json) -> tuple[list[str], str]:
    """All MACs of an interface (NetBox ≥ 4.2 ``mac_addresses``, older ``mac_address``), primary first."""
    primary = _safe_mac(_get(iface, "primary_mac_address", "mac_address")) or _safe_mac(
        iface.get("mac_address")
    )
    macs: list[str] = []
    for entry in iface.get("mac_addresses") or []:
        mac = _safe_mac(entry.get("mac_address") if isinstance(entry, Mapping) else entry)
        if mac and mac not in macs:
            macs.append(mac)
    if primary and primary not in macs:
        macs.insert(0, primary)
    elif primary:
        macs.remove(primary)
        macs.insert(0, primary)
    return macs, primary or (macs[0] if macs else "")


def speed_mbps(iface: Json) -> int | None:
    """NetBox stores ``speed`` in kbps; without it the speed is read from the type (``25gbase-x-sfp28``)."""
    speed = iface.get("speed")
    if isinstance(speed, int) and speed > 0:
        return speed // 1000
    m = _SPEED_IN_TYPE.match(_str(_get(iface, "type", "value")))
    if not m:
        return None
    value = float(m.group(1)) * (1000 if (m.group(2) or "").lower() == "g" else 1)
    return int(value)


def _host_ip(cidr: str) -> str:
    return cidr.split("/", 1)[0]


def addresses_by_interface(ip_addresses: Iterable[Json]) -> dict[int, list[str]]:
    """``ipam.ip-addresses`` of a device grouped by the interface id they are assigned to."""
    out: dict[int, list[str]] = {}
    for ip in ip_addresses:
        if ip.get("assigned_object_type") != "dcim.interface" or ip.get("assigned_object_id") is None:
            continue
        out.setdefault(int(ip["assigned_object_id"]), []).append(_str(ip.get("address")))
    return out


def host_interface(iface: Json, addresses: list[str]) -> HostInterface:
    macs, _primary = interface_macs(iface)
    v4 = [a for a in addresses if ":" not in a]
    v6 = [a for a in addresses if ":" in a]
    return HostInterface(
        name=_str(iface.get("name")),
        macs=macs,
        type=_str(_get(iface, "type", "value")),
        speed_mbps=speed_mbps(iface),
        mgmt_only=bool(iface.get("mgmt_only")),
        ipv4=v4,
        ipv6=v6,
    )


def pxe_enabled(custom_fields: Json | None, field: str = "pxe_enabled") -> bool:
    """Unset (null or absent) counts as true: only an explicit ``false`` stops PXE."""
    value = (custom_fields or {}).get(field)
    return value is not False


def host_from_netbox(
    device: Json,
    interfaces: Iterable[Json],
    ip_addresses: Iterable[Json] = (),
    *,
    pxe_field: str = "pxe_enabled",
) -> Host:
    by_iface = addresses_by_interface(ip_addresses)
    custom_fields = dict(device.get("custom_fields") or {})
    context = device.get("config_context") if isinstance(device.get("config_context"), Mapping) else {}
    primary_ipv4 = _str(_get(device, "primary_ip4", "address"))
    gateway, nameservers = network_from_context(context)
    return Host(
        id=device.get("id"),
        name=_str(device.get("name")),
        platform=_str(_get(device, "platform", "slug")),
        role=_str(_get(device, "role", "slug") or _get(device, "device_role", "slug")),
        site=_str(_get(device, "site", "slug")),
        rack=_str(_get(device, "rack", "name")),
        primary_ipv4=primary_ipv4,
        primary_ipv6=_str(_get(device, "primary_ip6", "address")),
        oob_ip=_host_ip(_str(_get(device, "oob_ip", "address"))),
        interfaces=[host_interface(i, by_iface.get(int(i.get("id") or 0), [])) for i in interfaces],
        pxe_enabled=pxe_enabled(custom_fields, pxe_field),
        custom_fields=custom_fields,
        users=users_from_context(context),
        ipv4_gateway=gateway,
        nameservers=nameservers,
    )


def size_gb_from_text(text: str) -> float | None:
    """``"Samsung PM9A3 3.84 TB"`` → 3840.0 (decimal units, as disk vendors count)."""
    m = _SIZE_IN_TEXT.search(text or "")
    if not m:
        return None
    value = float(m.group(1))
    unit = m.group(2).lower()
    factor = {"tb": 1000.0, "tib": 1099.511627776, "gb": 1.0, "gib": 1.073741824}[unit]
    return round(value * factor, 3)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _pci(*candidates: Any) -> str:
    for c in candidates:
        if c and _PCI_ADDRESS.fullmatch(str(c).strip()):
            return str(c).strip().lower()
    for c in candidates:
        m = _PCI_ADDRESS.search(_str(c))
        if m:
            return m.group(0).lower()
    return ""


def _item_kind(item: Json, rules: HardwareRules) -> str | None:
    role = _str(_get(item, "role", "slug")).lower()
    if role and role == rules.disk_role.lower():
        return "disk"
    if role and role == rules.gpu_role.lower():
        return "gpu"
    return None


def _module_kind(module_type: Json, rules: HardwareRules) -> str | None:
    profile = _str(_get(module_type, "profile", "name")).lower()
    if profile and profile == rules.disk_module_profile.lower():
        return "disk"
    if profile and profile == rules.gpu_module_profile.lower():
        return "gpu"
    return None


def _item_common(item: Json) -> dict[str, Any]:
    """Fields every inventory item (disk or GPU) maps the same way."""
    cf = item.get("custom_fields") or {}
    return {
        "name": _str(item.get("label") or item.get("name")),
        "model": _str(item.get("part_id")),
        "manufacturer": _str(_get(item, "manufacturer", "name")),
        "serial": _str(item.get("serial")),
        "pci_address": _pci(cf.get("pci_address"), item.get("description")),
        "source": "inventory-item",
    }


def _module_common(module: Json, module_type: Json) -> dict[str, Any]:
    """Fields every module (disk or GPU) maps the same way; ``model`` differs and is left out."""
    cf = module.get("custom_fields") or {}
    return {
        "name": _str(_get(module, "module_bay", "name") or module_type.get("model")),
        "manufacturer": _str(_get(module_type, "manufacturer", "name")),
        "serial": _str(module.get("serial")),
        "pci_address": _pci(cf.get("pci_address"), module.get("description")),
        "source": "module",
    }


def disk_from_item(item: Json) -> Disk:
    cf = item.get("custom_fields") or {}
    return Disk(
        **_item_common(item),
        size_gb=_number(cf.get("size_gb")) or size_gb_from_text(_str(item.get("description"))),
        bus=_str(cf.get("bus")).lower(),
    )


def gpu_from_item(item: Json) -> Gpu:
    cf = item.get("custom_fields") or {}
    return Gpu(
        **_item_common(item),
        memory_gb=_number(cf.get("memory_gb")) or size_gb_from_text(_str(item.get("description"))),
    )


def disk_from_module(module: Json, module_type: Json) -> Disk:
    attrs = module_type.get("attributes") or module_type.get("attribute_data") or {}
    cf = module.get("custom_fields") or {}
    return Disk(
        **_module_common(module, module_type),
        model=_str(module_type.get("model") or _get(module, "module_type", "model")),
        size_gb=_number(attrs.get("size")) or _number(cf.get("size_gb")),
        bus=_str(attrs.get("type")).lower(),
    )


def gpu_from_module(module: Json, module_type: Json) -> Gpu:
    attrs = module_type.get("attributes") or module_type.get("attribute_data") or {}
    cf = module.get("custom_fields") or {}
    return Gpu(
        **_module_common(module, module_type),
        model=_str(module_type.get("model") or attrs.get("gpu")),
        memory_gb=_number(attrs.get("memory")) or _number(cf.get("memory_gb")),
    )


def nic_from_netbox(iface: Json, addresses: list[str], bmc_ip: str) -> Nic:
    macs, primary = interface_macs(iface)
    hosts = {_host_ip(a) for a in addresses}
    return Nic(
        name=_str(iface.get("name")),
        macs=macs,
        primary_mac=primary,
        type=_str(_get(iface, "type", "value")),
        speed_mbps=speed_mbps(iface),
        mgmt_only=bool(iface.get("mgmt_only")),
        is_bmc=_same_ip(bmc_ip, hosts),
        enabled=iface.get("enabled") is not False,
        ipv4=[a for a in addresses if ":" not in a],
    )


def _same_ip(ip: str, candidates: set[str]) -> bool:
    try:
        target = ipaddress.ip_address(ip)
    except ValueError:
        return False
    for c in candidates:
        try:
            if ipaddress.ip_address(c) == target:
                return True
        except ValueError:
            continue
    return False


def bmc_hardware_from_netbox(
    device: Json,
    bmc_ip: str,
    interfaces: Iterable[Json],
    ip_addresses: Iterable[Json],
    inventory_items: Iterable[Json],
    modules: Iterable[Json],
    module_types: Mapping[int, Json],
    rules: HardwareRules,
) -> BmcHardware:
    """Disks/GPUs from role-tagged inventory items and profiled modules; NICs from the interfaces.

    The BMC NIC is the interface holding ``bmc_ip``; if none does, the only management-only
    interface is taken as the BMC's (the usual NetBox modelling of an ``oob_ip`` on a ``bmc`` port).
    """
    by_iface = addresses_by_interface(ip_addresses)
    nics = [nic_from_netbox(i, by_iface.get(int(i.get("id") or 0), []), bmc_ip) for i in interfaces]
    if not any(n.is_bmc for n in nics):
        mgmt = [n for n in nics if n.mgmt_only]
        if len(mgmt) == 1:
            mgmt[0].is_bmc = True
    disks: list[Disk] = []
    gpus: list[Gpu] = []
    for item in inventory_items:
        kind = _item_kind(item, rules)
        if kind == "disk":
            disks.append(disk_from_item(item))
        elif kind == "gpu":
            gpus.append(gpu_from_item(item))
    for module in modules:
        mt = module_types.get(int(_get(module, "module_type", "id") or 0)) or dict(
            module.get("module_type") or {}
        )
        kind = _module_kind(mt, rules)
        if kind == "disk":
            disks.append(disk_from_module(module, mt))
        elif kind == "gpu":
            gpus.append(gpu_from_module(module, mt))
    return BmcHardware(
        device_id=device.get("id"),
        device_name=_str(device.get("name")),
        bmc_ip=bmc_ip,
        serial=_str(device.get("serial")),
        disks=sorted(disks, key=lambda d: _natural(d.name)),
        gpus=sorted(gpus, key=lambda g: _natural(g.name)),
        nics=nics,
        endpoint=BmcEndpointHint.from_custom_fields(device.get("custom_fields")),
    )


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
