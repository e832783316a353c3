"""What the BMC says against what the inventory says (issue 27 item 2): a pure diff of a server's
inspected hardware record (:class:`HardwareRecord`) and its inventory record (NetBox or the YAML
file, :class:`BmcHardware`), shown by ``GET /controlnode/bmc/{ip}/hardware/diff``, ``karios server
show IP --hardware`` and the console's servers view.

Per category, the items only the BMC reported, the ones only the inventory lists, and the pairs
whose details differ:

- ``serial``: the system serial (a DMI placeholder counts as none).
- ``disks``: paired by serial (when both sides have one), else by name (the BMC's drive id or name
  equal to the inventory's disk name), else by size (within 1 %, only when one side has no serial:
  two different serials are two different disks). A pair differs in ``size_gb`` (beyond 1 %) or
  ``model``.
- ``nics``: by MAC (any of the inventory interface's MACs against the BMC NIC's MAC or permanent
  MAC). The host's link to its own BMC and the inventory's BMC interface are left out (the host's
  EthernetInterfaces never list the BMC port), and so are inventory interfaces without a MAC.
  A pair differs in ``speed_mbps``.
- ``gpus``: by serial, else by PCI ``vendor:device`` id (written as the inventory GPU's model),
  else by model; a GPU the BMC gives no model nor serial for pairs with any inventory GPU left
  (the count is still compared). A pair differs in ``model``.

A category the BMC did not report (empty, or named in the record's ``missing``) is not compared:
it is listed in ``unchecked`` instead of claiming every inventory item is absent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel, Field

from karios.common.contracts.hardware import Drive, HardwareRecord, NetworkInterface, PcieDevice, usable_dmi
from karios.common.contracts.inventory import BmcHardware, Disk, Gpu, Nic

CATEGORIES = ("serial", "disks", "nics", "gpus")
SIZE_TOLERANCE = 0.01  # 1 %: vendors round capacities (899.5 GB reported, "900 GB" recorded)


class DiffItem(BaseModel):
    """One item on one side only."""

    key: str = Field(description="What identifies it: serial, MAC, PCI id, or name")
    name: str = Field("", description="Its name on that side (BMC resource id, inventory name)")
    summary: str = Field("", description="Model, size, speed as far as known")


class FieldDifference(BaseModel):
    field: str = Field(description="serial | size_gb | model | speed_mbps")
    bmc: str
    inventory: str


class DiffPair(BaseModel):
    """An item both sides list whose details differ."""

    key: str = Field(description="What paired them: the serial, the MAC, the PCI id, name or size")
    bmc_name: str = ""
    inventory_name: str = ""
    differences: list[FieldDifference]


class CategoryDiff(BaseModel):
    checked: bool = Field(True, description="False: the BMC did not report this category (see `unchecked`)")
    matched: int = Field(0, description="Items both sides list")
    only_bmc: list[DiffItem] = Field(
        default_factory=list, description="Reported by the BMC, not in the inventory"
    )
    only_inventory: list[DiffItem] = Field(default_factory=list, description="In the inventory, not reported")
    differ: list[DiffPair] = Field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.only_bmc) + len(self.only_inventory) + len(self.differ)


class HardwareDiff(BaseModel):
    """The BMC's hardware record against the inventory's record of the same server."""

    bmc_ip: str
    device_name: str = Field(description="The inventory device")
    inspected_at: str = Field(description="When the BMC was read (the record compared)")
    in_sync: bool = Field(description="No difference in any category that could be compared")
    differences: int = Field(description="Items only on one side plus pairs that differ")
    serial: CategoryDiff
    disks: CategoryDiff
    nics: CategoryDiff
    gpus: CategoryDiff
    unchecked: list[str] = Field(
        default_factory=list, description="'<category>: <why>' per category the BMC did not report"
    )


def _norm(s: str) -> str:
    return " ".join(s.split()).lower()


def _mac(mac: str) -> str:
    hexdigits = "".join(c for c in mac.lower() if c in "0123456789abcdef")
    return ":".join(hexdigits[i : i + 2] for i in range(0, len(hexdigits), 2)) if len(hexdigits) == 12 else ""


def _gb(drive: Drive) -> float | None:
    if drive.size_gb is not None:
        return drive.size_gb
    return round(drive.size_bytes / 1e9, 1) if drive.size_bytes else None


def _close(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= max(a, b) * SIZE_TOLERANCE


def _fmt_gb(v: float | None) -> str:
    return "" if v is None else f"{v:g} GB"


def _summary(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


B = TypeVar("B")
I = TypeVar("I")  # noqa: E741


def _pair(
    bmc: Sequence[B], inv: Sequence[I], rules: Sequence[Callable[[B, I], str]]
) -> tuple[list[tuple[str, B, I]], list[B], list[I]]:
    """Greedy pairing, rule by rule (the first rule pairs first): each rule answers the key that
    pairs the two items, or '' when they are not the same item by that rule."""
    left, right = list(bmc), list(inv)
    pairs: list[tuple[str, B, I]] = []
    for rule in rules:
        for b in list(left):
            for i in right:
                key = rule(b, i)
                if key:
                    pairs.append((key, b, i))
                    left.remove(b)
                    right.remove(i)
                    break
    return pairs, left, right


def _gaps(rec: HardwareRecord, *prefixes: str) -> str:
    return next((m for m in rec.missing if m.split(":", 1)[0].strip().startswith(prefixes)), "")


# -- categories ----------------------------------------------------------------------------------


def _serial(rec: HardwareRecord, inv: BmcHardware) -> CategoryDiff:
    bmc, mine = usable_dmi(rec.system.serial), usable_dmi(inv.serial)
    out = CategoryDiff(checked=bool(bmc))
    if not bmc:
        return out
    if not mine:
        out.only_bmc.append(DiffItem(key=bmc, name="system", summary=_summary(rec.system.model)))
    elif _norm(bmc) != _norm(mine):
        diff = FieldDifference(field="serial", bmc=bmc, inventory=mine)
        out.differ.append(
            DiffPair(key="system", bmc_name="system", inventory_name=inv.device_name, differences=[diff])
        )
    else:
        out.matched = 1
    return out


def _disk_rules() -> list[Callable[[Drive, Disk], str]]:
    def by_serial(d: Drive, k: Disk) -> str:
        return d.serial if d.serial and k.serial and _norm(d.serial) == _norm(k.serial) else ""

    def by_name(d: Drive, k: Disk) -> str:
        if d.serial and k.serial:
            return ""
        name = _norm(k.name.removeprefix("/dev/"))
        return k.name if name and name in {_norm(d.id), _norm(d.name)} else ""

    def by_size(d: Drive, k: Disk) -> str:
        if d.serial and k.serial:
            return ""
        return f"size {_fmt_gb(_gb(d))}" if _close(_gb(d), k.size_gb) else ""

    return [by_serial, by_name, by_size]


def _disks(rec: HardwareRecord, inv: BmcHardware) -> CategoryDiff:
    pairs, only_b, only_i = _pair(rec.drives, inv.disks, _disk_rules())
    out = CategoryDiff(matched=len(pairs))
    for key, d, k in pairs:
        diffs = []
        size = _gb(d)
        if size is not None and k.size_gb is not None and not _close(size, k.size_gb):
            diffs.append(FieldDifference(field="size_gb", bmc=f"{size:g}", inventory=f"{k.size_gb:g}"))
        if d.model and k.model and _norm(d.model) != _norm(k.model):
            diffs.append(FieldDifference(field="model", bmc=d.model, inventory=k.model))
        if diffs:
            out.differ.append(
                DiffPair(key=key, bmc_name=d.id or d.name, inventory_name=k.name, differences=diffs)
            )
    out.only_bmc = [
        DiffItem(
            key=d.serial or d.id or d.name,
            name=d.id or d.name,
            summary=_summary(d.model, _fmt_gb(_gb(d)), d.protocol),
        )
        for d in only_b
    ]
    out.only_inventory = [
        DiffItem(key=k.serial or k.name, name=k.name, summary=_summary(k.model, _fmt_gb(k.size_gb), k.bus))
        for k in only_i
    ]
    out.matched -= len(out.differ)
    return out


def _nic_macs(n: NetworkInterface) -> set[str]:
    return {m for m in (_mac(n.mac), _mac(n.permanent_mac)) if m}


def _nics(rec: HardwareRecord, inv: BmcHardware) -> CategoryDiff:
    bmc = [n for n in rec.nics if not n.host_interface and _nic_macs(n)]
    mine = [n for n in inv.nics if not n.is_bmc and any(_mac(m) for m in n.macs)]

    def by_mac(b: NetworkInterface, n: Nic) -> str:
        common = _nic_macs(b) & {_mac(m) for m in n.macs}
        return min(common) if common else ""

    pairs, only_b, only_i = _pair(bmc, mine, [by_mac])
    out = CategoryDiff(matched=len(pairs))
    for key, b, n in pairs:
        if b.speed_mbps and n.speed_mbps and b.speed_mbps != n.speed_mbps:
            diff = FieldDifference(field="speed_mbps", bmc=str(b.speed_mbps), inventory=str(n.speed_mbps))
            out.differ.append(
                DiffPair(key=key, bmc_name=b.id or b.name, inventory_name=n.name, differences=[diff])
            )
    speed = lambda v: f"{v} Mb/s" if v else ""  # noqa: E731
    out.only_bmc = [
        DiffItem(
            key=min(_nic_macs(b)), name=b.id or b.name, summary=_summary(speed(b.speed_mbps), b.link_status)
        )
        for b in only_b
    ]
    out.only_inventory = [
        DiffItem(
            key=_mac(n.primary_mac) or min(_mac(m) for m in n.macs if _mac(m)),
            name=n.name,
            summary=_summary(n.type, speed(n.speed_mbps)),
        )
        for n in only_i
    ]
    out.matched -= len(out.differ)
    return out


def _gpu_rules() -> list[Callable[[PcieDevice, Gpu], str]]:
    def by_serial(g: PcieDevice, k: Gpu) -> str:
        return g.serial if g.serial and k.serial and _norm(g.serial) == _norm(k.serial) else ""

    def by_pci_id(g: PcieDevice, k: Gpu) -> str:
        if g.serial and k.serial:
            return ""
        return g.pci_id if g.pci_id and _norm(k.model) == g.pci_id else ""

    def by_model(g: PcieDevice, k: Gpu) -> str:
        if g.serial and k.serial:
            return ""
        a, b = _norm(g.model or g.name), _norm(k.model)
        return k.model if a and b and (a in b or b in a) else ""

    def unidentified(g: PcieDevice, k: Gpu) -> str:  # the BMC names no model (e.g. only the maker)
        return (g.pci_id or g.id or "gpu") if not g.model and not g.serial else ""

    return [by_serial, by_pci_id, by_model, unidentified]


def _gpus(rec: HardwareRecord, inv: BmcHardware) -> CategoryDiff:
    pairs, only_b, only_i = _pair(rec.gpus, inv.gpus, _gpu_rules())
    out = CategoryDiff(matched=len(pairs))
    for key, g, k in pairs:
        a, b = _norm(g.model), _norm(k.model)
        if a and b and a not in b and b not in a and b != g.pci_id:
            diff = FieldDifference(field="model", bmc=g.model, inventory=k.model)
            out.differ.append(
                DiffPair(key=key, bmc_name=g.id or g.name, inventory_name=k.name, differences=[diff])
            )
    out.only_bmc = [
        DiffItem(
            key=g.serial or g.pci_id or g.id, name=g.id or g.name, summary=_summary(g.manufacturer, g.model)
        )
        for g in only_b
    ]
    out.only_inventory = [
        DiffItem(key=k.serial or k.model or k.name, name=k.name, summary=_summary(k.manufacturer, k.model))
        for k in only_i
    ]
    out.matched -= len(out.differ)
    return out


def hardware_diff(rec: HardwareRecord, inv: BmcHardware) -> HardwareDiff:
    """The diff of the BMC's record against the inventory's (pure; see the module's docstring)."""
    unchecked: list[str] = []
    serial = _serial(rec, inv)
    if not serial.checked:
        unchecked.append("serial: the BMC reported no usable system serial")

    def category(
        name: str, compare: Callable[[HardwareRecord, BmcHardware], CategoryDiff], empty: bool, gap: str
    ) -> CategoryDiff:
        if gap or empty:
            unchecked.append(f"{name}: {gap or 'the BMC reported none'}")
            return CategoryDiff(checked=False)
        return compare(rec, inv)

    disks = category("disks", _disks, not rec.drives, _gaps(rec, "Storage", "SimpleStorage", "Drive"))
    nics = category(
        "nics",
        _nics,
        not any(not n.host_interface for n in rec.nics),
        _gaps(rec, "EthernetInterfaces"),
    )
    gpus = category("gpus", _gpus, not rec.pcie_devices, _gaps(rec, "PCIeDevice", "PCIeFunction", "Chassis"))
    count = serial.count + disks.count + nics.count + gpus.count
    return HardwareDiff(
        bmc_ip=rec.bmc_ip,
        device_name=inv.device_name,
        inspected_at=rec.inspected_at,
        in_sync=count == 0,
        differences=count,
        serial=serial,
        disks=disks,
        nics=nics,
        gpus=gpus,
        unchecked=unchecked,
    )
