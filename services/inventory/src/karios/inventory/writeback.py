"""NetBox write-back, the pure core (issue 27 item 2): what a hardware record adds to or changes on
a NetBox device. No I/O: the adapter (``netbox_writer.py``) reads the device's objects into a
:class:`DeviceState`, :func:`plan_writeback` decides, the adapter carries the :class:`Plan` out,
and :func:`journal_comments` is the journal entry that says what was done.

The rules, so that writing one record twice is writing it once:

- **Interfaces**: a NIC whose MAC any interface of the device already holds is there. Else an
  interface of the NIC's name gets the MAC (primary if it has none). Else a new interface (the
  NIC's name, the type from its speed) is created with the MAC. A MAC held by another device's
  interface is left there and named in the journal.
- **Disks and GPUs**: inventory items (role slugs ``disk`` / ``gpu``), one per serial: an item (or
  a module) with that serial is the same part. Items Karios created (``discovered``) are kept in
  step (part number, description, custom fields); on an operator's item only empty fields are
  filled. A part without a serial is matched by name among the serial-less items of its role.
- **Never deleted**: a part not reported any more is named in the journal and left in NetBox.
- **Identity**: a record whose serial is not the device's (both real) writes nothing but a
  warning — the BMC address in NetBox points at another machine.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from karios.common.contracts.hardware import Drive, HardwareRecord, PcieDevice, usable_dmi
from karios.common.contracts.netbox_writeback import netbox_interface_type
from karios.common.netaddr import mac_or_none
from karios.inventory.mapping import _get, interface_macs

Json = Mapping[str, Any]
Kind = Literal["disk", "gpu"]

# NetBox 4.7 column lengths (dcim models): longer values are refused with a 400.
NAME_MAX, PART_ID_MAX, SERIAL_MAX, DESCRIPTION_MAX = 64, 50, 50, 200
_PCI_ADDRESS = re.compile(r"^(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", re.IGNORECASE)
_SLUG_UNSAFE = re.compile(r"[^a-z0-9]+")
# Collections whose absence (named in ``HardwareRecord.missing``) means "not read", not "none".
_DISK_SOURCES = ("Storage", "SimpleStorage", "Drive")
_GPU_SOURCES = ("PCIeDevice", "PCIeFunction", "Chassis")


# -- what NetBox holds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExistingInterface:
    id: int
    name: str
    macs: tuple[str, ...] = ()
    primary_mac: str = ""


@dataclass(frozen=True)
class ExistingItem:
    id: int
    name: str
    role: str = ""  # inventory-item role slug ('' none)
    serial: str = ""
    part_id: str = ""
    description: str = ""
    discovered: bool = False  # created from a discovery (Karios sets it on what it creates)
    custom_fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceState:
    """One NetBox device and the objects of it the write-back reads."""

    id: int
    name: str
    serial: str = ""
    interfaces: tuple[ExistingInterface, ...] = ()
    items: tuple[ExistingItem, ...] = ()
    module_serials: frozenset[str] = frozenset()  # lower-case serials of its modules
    macs_elsewhere: Mapping[str, str] = field(default_factory=dict)  # MAC → "<device> <interface>"
    item_fields: frozenset[str] = frozenset()  # custom fields NetBox defines on inventory items


def device_state(
    device: Json,
    interfaces: Iterable[Json] = (),
    items: Iterable[Json] = (),
    modules: Iterable[Json] = (),
    mac_holders: Iterable[Json] = (),
    item_fields: Iterable[str] = (),
) -> DeviceState:
    """The state from NetBox JSON: the device, its interfaces, inventory items and modules, the
    interfaces (of any device) holding one of the record's MACs, the inventory-item custom fields."""
    dev_id = int(device["id"])
    ifaces = []
    for i in interfaces:
        macs, primary = interface_macs(i)
        ifaces.append(ExistingInterface(int(i["id"]), str(i.get("name") or ""), tuple(macs), primary))
    elsewhere: dict[str, str] = {}
    for i in mac_holders:
        holder = i.get("device") or {}
        if not isinstance(holder, Mapping) or int(holder.get("id") or 0) == dev_id:
            continue
        where = f"{holder.get('name') or holder.get('id')} {i.get('name') or ''}".strip()
        for mac in interface_macs(i)[0]:
            elsewhere.setdefault(mac, where)
    return DeviceState(
        id=dev_id,
        name=str(device.get("name") or ""),
        serial=str(device.get("serial") or ""),
        interfaces=tuple(ifaces),
        items=tuple(
            ExistingItem(
                id=int(it["id"]),
                name=str(it.get("name") or ""),
                role=str(_get(it, "role", "slug") or ""),
                serial=str(it.get("serial") or ""),
                part_id=str(it.get("part_id") or ""),
                description=str(it.get("description") or ""),
                discovered=bool(it.get("discovered")),
                custom_fields=dict(it.get("custom_fields") or {}),
            )
            for it in items
        ),
        module_serials=frozenset(str(m.get("serial") or "").lower() for m in modules if m.get("serial")),
        macs_elsewhere=elsewhere,
        item_fields=frozenset(item_fields),
    )


# -- what the record says ------------------------------------------------------------------------


@dataclass(frozen=True)
class WantedNic:
    name: str
    mac: str
    type: str
    speed_kbps: int | None


@dataclass(frozen=True)
class WantedItem:
    kind: Kind
    name: str
    serial: str
    part_id: str
    description: str
    custom_fields: Mapping[str, Any] = field(default_factory=dict)


def interface_name(nic_id: str, nic_name: str) -> str:
    """The Redfish ``Id`` (``NIC.Integrated.1-1-1``, ``NIC1``; in band the kernel name ``eno1``)
    names the interface; a bare number (HPE, Supermicro: ``1``) becomes ``nic1``."""
    base = (nic_id or nic_name).strip()
    if base.isdigit():
        base = f"nic{base}"
    return base[:NAME_MAX]


def wanted_nics(rec: HardwareRecord) -> list[WantedNic]:
    """The server's ports with a MAC (the host's link to its own BMC is no port), one per MAC."""
    out: list[WantedNic] = []
    seen: set[str] = set()
    for nic in rec.nics:
        mac = mac_or_none(nic.permanent_mac or nic.mac or "") if not nic.host_interface else None
        if not mac or mac in seen:
            continue
        seen.add(mac)
        speed = nic.speed_mbps if nic.speed_mbps and nic.speed_mbps > 0 else None
        out.append(
            WantedNic(
                name=interface_name(nic.id, nic.name),
                mac=mac,
                type=netbox_interface_type(speed),
                speed_kbps=speed * 1000 if speed else None,
            )
        )
    return out


def _size_text(size_gb: float | None) -> str:
    if size_gb is None:
        return ""
    return f"{size_gb:g} GB"


def disk_item(drive: Drive) -> WantedItem:
    """A drive as an inventory item: the description carries the size the inventory reads back
    (``"1600.3 GB, NVMe, SSD"``); ``size_gb`` / ``bus`` custom fields when NetBox defines them."""
    parts = [_size_text(drive.size_gb), drive.protocol, drive.media_type]
    cf: dict[str, Any] = {}
    if drive.size_gb is not None:
        cf["size_gb"] = round(drive.size_gb)
    if drive.protocol:
        cf["bus"] = drive.protocol.lower()
    return WantedItem(
        kind="disk",
        name=(drive.name or drive.id).strip()[:NAME_MAX],
        serial=usable_dmi(drive.serial)[:SERIAL_MAX],
        part_id=" ".join(drive.model.split())[:PART_ID_MAX],
        description=", ".join(p for p in parts if p)[:DESCRIPTION_MAX],
        custom_fields=cf,
    )


def gpu_item(gpu: PcieDevice) -> WantedItem:
    """A GPU as an inventory item; its PCI address (when the record has one) goes to the description
    and the ``pci_address`` custom field, where the inventory reads it back."""
    pci = gpu.id.lower() if _PCI_ADDRESS.match(gpu.id or "") else ""
    parts = [gpu.manufacturer, f"PCI {pci}" if pci else "", f"id {gpu.pci_id}" if gpu.pci_id else ""]
    return WantedItem(
        kind="gpu",
        name=(gpu.name or gpu.id).strip()[:NAME_MAX],
        serial=usable_dmi(gpu.serial)[:SERIAL_MAX],
        part_id=(" ".join(gpu.model.split()) or gpu.pci_id)[:PART_ID_MAX],
        description=", ".join(p for p in parts if p)[:DESCRIPTION_MAX],
        custom_fields={"pci_address": pci} if pci else {},
    )


def _unique_names(items: list[WantedItem]) -> list[WantedItem]:
    """Parts sharing a name (``NVIDIA H100`` ×8) get their serial (else a number) appended."""
    counts: dict[str, int] = {}
    for it in items:
        counts[it.name] = counts.get(it.name, 0) + 1
    out, n = [], 0
    for it in items:
        if counts[it.name] > 1:
            n += 1
            tail = it.serial or str(n)
            it = dataclasses.replace(it, name=f"{it.name} {tail}"[:NAME_MAX])
        out.append(it)
    return out


def wanted_items(rec: HardwareRecord) -> list[WantedItem]:
    disks = _unique_names([disk_item(d) for d in rec.drives if d.name or d.id])
    gpus = _unique_names([gpu_item(g) for g in rec.gpus if g.name or g.id])
    return disks + gpus


def collection_read(rec: HardwareRecord, kind: Kind) -> bool:
    """Whether the record holds the whole collection (nothing of it named in ``missing``)."""
    sources = _DISK_SOURCES if kind == "disk" else _GPU_SOURCES
    return not any(m.split(":", 1)[0].strip().startswith(sources) for m in rec.missing)


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewInterface:
    name: str
    type: str
    mac: str
    speed_kbps: int | None = None


@dataclass(frozen=True)
class NewMac:
    interface_id: int
    interface_name: str
    mac: str
    primary: bool


@dataclass(frozen=True)
class NewItem:
    kind: Kind
    name: str
    serial: str
    part_id: str
    description: str
    custom_fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ItemUpdate:
    id: int
    kind: Kind
    name: str
    serial: str
    fields: Mapping[str, Any]  # NetBox field → new value (``role`` as a slug, ``custom_fields`` nested)
    was: Mapping[str, Any]  # the same fields before


@dataclass
class Plan:
    device_serial: str = ""  # the device had no serial: it gets this one
    interfaces: list[NewInterface] = field(default_factory=list)
    macs: list[NewMac] = field(default_factory=list)
    items: list[NewItem] = field(default_factory=list)
    updates: list[ItemUpdate] = field(default_factory=list)
    unchanged: dict[str, int] = field(default_factory=lambda: {"interfaces": 0, "disks": 0, "gpus": 0})
    notes: list[str] = field(default_factory=list)  # what was left alone, and why
    conflict: str = ""  # set: nothing is written (the record is not this device's)

    @property
    def empty(self) -> bool:
        return not (self.device_serial or self.interfaces or self.macs or self.items or self.updates)

    @property
    def new_macs(self) -> list[str]:
        return [i.mac for i in self.interfaces] + [m.mac for m in self.macs]

    def changes(self) -> list[str]:
        """One line per object created or updated."""
        out = []
        if self.device_serial:
            out.append(f"device serial set to {self.device_serial}")
        out += [f"interface {i.name} created ({i.type}, MAC {i.mac})" for i in self.interfaces]
        out += [
            f"MAC {m.mac} added to interface {m.interface_name}" + (" (primary)" if m.primary else "")
            for m in self.macs
        ]
        out += [
            f"{i.kind} {i.name!r} created (serial {i.serial or 'none'}"
            + (f", {i.part_id}" if i.part_id else "")
            + (f", {i.description}" if i.description and i.kind == "disk" else "")
            + ")"
            for i in self.items
        ]
        for u in self.updates:
            what = ", ".join(f"{k} {_show(u.was.get(k))} → {_show(v)}" for k, v in sorted(u.fields.items()))
            out.append(f"{u.kind} {u.name!r} (serial {u.serial or 'none'}) updated: {what}")
        return out


def _show(value: Any) -> str:
    if value in (None, ""):
        return "(empty)"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in sorted(value.items())) + "}"
    return repr(value) if isinstance(value, str) else str(value)


def identity_conflict(device_serial: str, record_serial: str) -> str:
    """Why the record is not this device's ('' when it may be): both serials real and different."""
    have, got = usable_dmi(device_serial), usable_dmi(record_serial)
    if have and got and have.lower() != got.lower():
        return (
            f"the server reports serial {got} but the NetBox device has serial {have}: nothing written "
            "(is the out-of-band IP in NetBox on the right device?)"
        )
    return ""


def _item_changes(ex: ExistingItem, want: WantedItem, role: str, fields: frozenset[str]) -> tuple[dict, dict]:
    """Fields to write on an existing item: all Karios owns on its own items, empty ones on others."""
    own = ex.discovered
    new: dict[str, Any] = {}
    was: dict[str, Any] = {}

    def offer(name: str, have: Any, value: Any) -> None:
        if value in (None, "") or have == value:
            return
        if own or have in (None, ""):
            new[name], was[name] = value, have

    offer("part_id", ex.part_id, want.part_id)
    offer("description", ex.description, want.description)
    if not ex.role:
        offer("role", ex.role, role)
    cf_new = {}
    for k, v in want.custom_fields.items():
        if k in fields and ex.custom_fields.get(k) != v and (own or ex.custom_fields.get(k) in (None, "")):
            cf_new[k] = v
    if cf_new:
        new["custom_fields"] = cf_new
        was["custom_fields"] = {k: ex.custom_fields.get(k) for k in cf_new}
    return new, was


def plan_writeback(
    rec: HardwareRecord, state: DeviceState, *, disk_role: str = "disk", gpu_role: str = "gpu"
) -> Plan:
    """What to create and update on the device so that NetBox holds what ``rec`` reports."""
    plan = Plan()
    plan.conflict = identity_conflict(state.serial, rec.system.serial)
    if plan.conflict:
        return plan
    serial = usable_dmi(rec.system.serial)[:SERIAL_MAX]
    if serial and not usable_dmi(state.serial):
        plan.device_serial = serial
    _plan_interfaces(rec, state, plan)
    _plan_items(rec, state, plan, {"disk": disk_role, "gpu": gpu_role})
    return plan


def _plan_interfaces(rec: HardwareRecord, state: DeviceState, plan: Plan) -> None:
    by_mac = {m: i for i in state.interfaces for m in i.macs}
    by_name = {i.name: i for i in state.interfaces}
    names = set(by_name)
    primary_given: set[int] = set()
    for nic in wanted_nics(rec):
        if nic.mac in by_mac:
            plan.unchanged["interfaces"] += 1
        elif nic.name in by_name:
            iface = by_name[nic.name]
            primary = not iface.primary_mac and iface.id not in primary_given
            primary_given.add(iface.id)
            plan.macs.append(NewMac(iface.id, iface.name, nic.mac, primary))
        elif nic.mac in state.macs_elsewhere:
            plan.notes.append(
                f"MAC {nic.mac} ({nic.name}) is on interface {state.macs_elsewhere[nic.mac]} of another "
                "device: left there"
            )
        else:
            name = nic.name
            n = 1
            while name in names:  # a name taken by an interface without this MAC (checked above)
                n += 1
                name = f"{nic.name}-{n}"[:NAME_MAX]
            names.add(name)
            plan.interfaces.append(NewInterface(name, nic.type, nic.mac, nic.speed_kbps))


def _plan_items(rec: HardwareRecord, state: DeviceState, plan: Plan, roles: Mapping[Kind, str]) -> None:
    by_serial = {i.serial.lower(): i for i in state.items if i.serial}
    names = {i.name for i in state.items}
    reported: set[str] = set()
    for want in wanted_items(rec):
        role = roles[want.kind]
        plural = f"{want.kind}s"
        if want.serial:
            key = want.serial.lower()
            reported.add(key)
            if key in state.module_serials:  # modelled as a module in a bay: that is the part
                plan.unchanged[plural] += 1
                continue
            ex = by_serial.get(key)
        else:
            ex = next(
                (i for i in state.items if not i.serial and i.role == role and i.name == want.name), None
            )
        if ex is not None:
            fields, was = _item_changes(ex, want, role, state.item_fields)
            if fields:
                plan.updates.append(ItemUpdate(ex.id, want.kind, ex.name, ex.serial, fields, was))
            else:
                plan.unchanged[plural] += 1
            continue
        name, n = want.name, 1
        while name in names:  # NetBox: one name per device (and parent)
            n += 1
            name = f"{want.name} ({want.serial or n})"[:NAME_MAX]
        names.add(name)
        cf = {k: v for k, v in want.custom_fields.items() if k in state.item_fields}
        plan.items.append(NewItem(want.kind, name, want.serial, want.part_id, want.description, cf))
    kinds: tuple[Kind, ...] = ("disk", "gpu")
    for kind in kinds:
        if not collection_read(rec, kind):
            plan.notes.append(f"the {kind}s were not (all) read: none is taken as gone")
            continue
        for item in state.items:
            gone = item.serial and item.serial.lower() not in reported
            if item.discovered and item.role == roles[kind] and gone:
                plan.notes.append(
                    f"{kind} {item.name!r} (serial {item.serial}) was not reported this time: left in NetBox"
                )


# -- the journal ---------------------------------------------------------------------------------


def inspection_marker(rec: HardwareRecord) -> str:
    """What identifies one inspection in the journal (a redelivered event finds it and adds none)."""
    return f"karios:inspection:{rec.bmc_ip}@{rec.inspected_at}"


def adoption_marker(source: str) -> str:
    return f"karios:adoption:{source}"


def journal_kind(plan: Plan) -> str:
    return "warning" if plan.conflict or plan.notes else "info"


def journal_comments(plan: Plan, *, title: str, marker: str, missing: Iterable[str] = ()) -> str:
    """The journal entry (Markdown): what was read, what changed, what was left alone."""
    lines = [f"**{title}**", "", f"`{marker}`", ""]
    if plan.conflict:
        lines.append(f"Not written: {plan.conflict}.")
        return "\n".join(lines)
    changes = plan.changes()
    if changes:
        lines.append("Changed:")
        lines += [f"- {c}" for c in changes]
    else:
        lines.append("No change: NetBox already holds what was read.")
    kept = ", ".join(f"{n} {what}" for what, n in plan.unchanged.items() if n)
    if kept:
        lines += ["", f"Already in NetBox: {kept}."]
    if plan.notes:
        lines += ["", "Left alone:"] + [f"- {n}" for n in plan.notes]
    gaps = list(missing)
    if gaps:
        lines += ["", "Not reported by the BMC:"] + [f"- {g}" for g in gaps[:20]]
    return "\n".join(lines)


# -- the device of an adopted server -------------------------------------------------------------

#: DMI vendor strings → the manufacturer names of the NetBox device-type library.
VENDOR_NAMES = {
    "dell inc.": "Dell",
    "dell": "Dell",
    "hpe": "HPE",
    "hewlett packard enterprise": "HPE",
    "hp": "HP",
    "hewlett-packard": "HP",
    "lenovo": "Lenovo",
    "supermicro": "Supermicro",
    "super micro computer, inc.": "Supermicro",
    "super micro computer inc": "Supermicro",
    "cisco systems inc": "Cisco",
    "cisco systems, inc.": "Cisco",
    "giga computing": "Gigabyte",
    "gigabyte technology co., ltd.": "Gigabyte",
    "asustek computer inc.": "ASUS",
    "quanta cloud technology inc.": "QCT",
    "fujitsu": "Fujitsu",
    "inspur": "Inspur",
}


def manufacturer_name(dmi_vendor: str) -> str:
    v = usable_dmi(dmi_vendor)
    return VENDOR_NAMES.get(v.lower(), v)[:100]


def slugify(text: str) -> str:
    """A NetBox slug (``[a-z0-9-]``, at most 100 characters)."""
    return _SLUG_UNSAFE.sub("-", text.lower()).strip("-")[:100].rstrip("-")


def pick_manufacturer(name: str, manufacturers: Iterable[Json]) -> Json | None:
    """The manufacturer NetBox already has under this name (any case) or its slug."""
    for m in manufacturers:
        if str(m.get("name") or "").lower() == name.lower() or m.get("slug") == slugify(name):
            return m
    return None


def device_type_slug(manufacturer: str, model: str) -> str:
    """The slug of a device type Karios creates (the library's form: ``dell-poweredge-r750``)."""
    return slugify(f"{manufacturer} {model}")


def pick_device_type(manufacturer: str, model: str, device_types: Iterable[Json]) -> Json | None:
    """The device type (of that manufacturer) for a DMI model: same model or part number (any
    case), else the slug Karios (or the library) would give it."""
    types = list(device_types)
    low = model.lower()
    for t in types:
        if low in (str(t.get("model") or "").lower(), str(t.get("part_number") or "").lower()):
            return t
    slugs = {slugify(model), device_type_slug(manufacturer, model)}
    return next((t for t in types if t.get("slug") in slugs), None)
