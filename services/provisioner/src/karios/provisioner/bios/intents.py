"""Named BIOS intents → per-vendor attributes; the plan and the read-back verdict (pure).

``MAPS`` is the one table: per driver vendor and intent, the attribute(s) that express it and the
value wanted, each with its evidence. "capture:" evidence is a recorded ``Bios`` response (or the
vendor's attribute registry) in ``tests/unit/provisioner/fixtures/bios`` (NVIDIA/libredfish
mockups, MIT; see its ``SOURCES.tsv``); "docs:" is from vendor documentation only, not verified on
a recorded response; "sushy-tools:" is the emulator's source (2.2.0).

An intent with several rows is met by every row whose attribute this BIOS has (HPE ``iommu`` is
``IntelProcVtd`` on Intel and ``ProcAmdIoVt`` on AMD: a BIOS has one of them). An intent none of
whose attributes the BIOS has is *absent*: reported, never fatal. Firmware that suffixes attribute
names with a 4-hex-digit id (Supermicro ``IntelVirtualizationTechnology_3C6F``;
``Quirks.bios_names_suffixed``) is matched on the name without the suffix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

INTENTS = ("virtualization", "iommu", "sriov", "uefi_boot", "pxe_on_nic")
#: What ``gpu_passthrough`` needs of the BIOS (VT-x/AMD-V and VT-d/AMD-Vi).
GPU_PASSTHROUGH_INTENTS = ("virtualization", "iommu")


@dataclass(frozen=True)
class BiosAttr:
    """One BIOS attribute that expresses an intent: its name (the stem, for suffixed firmware),
    the value wanted and where the mapping comes from."""

    name: str
    value: Any
    evidence: str


_DELL = "capture: dell/idrac9-6.00.30.00_poweredge-r750 Bios + BiosRegistry"
_HPE = "capture: hpe/ilo5-2.72_proliant-dl385-gen10plus-v2 Bios (AMD EPYC)"
_LENOVO = "capture: lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2 Bios (Intel)"
_SMC = "capture: supermicro/x13-bmc-11.01.01_sys-821ge-tnhr Bios + BiosAttributeRegistry"
_SUSHY = "sushy-tools: 2.2.0 libvirt driver DEFAULT_BIOS_ATTRIBUTES"

MAPS: dict[str, dict[str, tuple[BiosAttr, ...]]] = {
    "dell": {
        "virtualization": (BiosAttr("ProcVirtualization", "Enabled", _DELL),),
        # iDRAC on Intel: "Virtualization Technology" turns on VT-x and VT-d together; the R750's
        # registry has no separate VT-d attribute.
        "iommu": (
            BiosAttr(
                "ProcVirtualization", "Enabled", _DELL + " (no separate VT-d attribute; docs: VT-d with it)"
            ),
        ),
        "sriov": (BiosAttr("SriovGlobalEnable", "Enabled", _DELL),),
        "uefi_boot": (BiosAttr("BootMode", "Uefi", _DELL),),
        "pxe_on_nic": (BiosAttr("PxeDev1EnDis", "Enabled", _DELL + " (PXE device 1)"),),
    },
    "hpe": {
        "virtualization": (
            BiosAttr(
                "ProcVirtualization",
                "Enabled",
                "docs: iLO 5 BIOS attributes (Intel only)",
            ),
        ),
        "iommu": (
            BiosAttr("IntelProcVtd", "Enabled", "docs: HPE iLO 5 BIOS attributes (Intel)"),
            BiosAttr("ProcAmdIoVt", "Enabled", _HPE),
        ),
        "sriov": (BiosAttr("Sriov", "Enabled", _HPE),),
        "uefi_boot": (BiosAttr("BootMode", "Uefi", _HPE),),
        # PXE is per NIC (<slot>NicBoot<n> = NetworkBoot): no one attribute; not mapped.
    },
    "lenovo": {
        "virtualization": (BiosAttr("Processors_IntelVirtualizationTechnology", "Enabled", _LENOVO),),
        "iommu": (BiosAttr("DevicesandIOPorts_IntelVTforDirectedIOVTd", "Enabled", _LENOVO),),
        "sriov": (BiosAttr("DevicesandIOPorts_SRIOV", "Enabled", _LENOVO),),
        "uefi_boot": (BiosAttr("BootModes_SystemBootMode", "UEFIMode", _LENOVO),),
        "pxe_on_nic": (BiosAttr("NetworkStackSettings_IPv4PXESupport", "Enabled", _LENOVO),),
    },
    "supermicro": {
        # Names are stems: the firmware appends "_<4 hex digits>" (Quirks.bios_names_suffixed).
        "virtualization": (BiosAttr("IntelVirtualizationTechnology", "Enable", _SMC),),
        "iommu": (BiosAttr("IntelVTforDirectedI_O_VT_d_", "Enable", _SMC),),
        "sriov": (BiosAttr("SR_IOVSupport", "Enabled", _SMC),),
        # X13 is UEFI only (no boot mode attribute in the capture); X11/X12 have BootModeSelect.
        "uefi_boot": (BiosAttr("BootModeSelect", "UEFI", "docs: Supermicro X11/X12 manual"),),
        "pxe_on_nic": (BiosAttr("IPv4PXESupport", "Enabled", _SMC),),
    },
    "generic": {
        # No standard names: DMTF-mockup / iLO-style names (what the test emulator exposes).
        "virtualization": (BiosAttr("ProcVirtualization", "Enabled", "docs: DMTF Bios mockup naming"),),
        "iommu": (
            BiosAttr("IntelProcVtd", "Enabled", "docs: iLO-style naming"),
            BiosAttr("ProcAmdIoVt", "Enabled", "docs: iLO-style naming"),
        ),
        "sriov": (BiosAttr("Sriov", "Enabled", "docs: iLO-style naming"),),
        "uefi_boot": (BiosAttr("BootMode", "Uefi", _SUSHY),),
        "pxe_on_nic": (BiosAttr("NicBoot1", "NetworkBoot", _SUSHY),),
    },
    # cisco: CIMC BIOS tokens are not mapped (no recorded Bios response; not verified).
}
MAPS["hp"] = MAPS["hpe"]

_SUFFIX = re.compile(r"_[0-9A-Fa-f]{4}$")


def intents_for(gpu_passthrough: bool, requested: list[str] | tuple[str, ...] = ()) -> tuple[str, ...]:
    """The intents a job applies: those requested, plus ``virtualization``+``iommu`` for a GPU
    passthrough; in :data:`INTENTS` order, each once. An unknown name is a ``ValueError``."""
    unknown = [i for i in requested if i not in INTENTS]
    if unknown:
        raise ValueError(f"unknown BIOS intent(s): {', '.join(unknown)} (known: {', '.join(INTENTS)})")
    wanted = set(requested) | (set(GPU_PASSTHROUGH_INTENTS) if gpu_passthrough else set())
    return tuple(i for i in INTENTS if i in wanted)


def find_attribute(attrs: dict[str, Any], name: str, *, suffixed: bool = False) -> str | None:
    """The attribute of this BIOS called ``name`` (or ``name_XXXX`` on suffixed firmware)."""
    if name in attrs:
        return name
    if suffixed:
        for key in attrs:
            if _SUFFIX.search(key) and key[:-5] == name:
                return key
    return None


def same(current: Any, wanted: Any) -> bool:
    """BIOS values compare case-insensitively as text ("Enabled" / "enabled"; 1 / "1")."""
    if isinstance(current, bool) or isinstance(wanted, bool):
        return current is wanted or str(current).lower() == str(wanted).lower()
    return str(current).strip().lower() == str(wanted).strip().lower()


@dataclass(frozen=True)
class Setting:
    intent: str
    attribute: str  # the BIOS's own name (with its suffix)
    value: Any  # wanted
    current: Any  # as read before the change


@dataclass
class BiosPlan:
    """What a job changes: ``changes`` (current value differs: PATCHed), ``already`` (as wanted),
    ``absent`` (intents this BIOS has no attribute for), ``unmapped`` (no table row for the
    vendor), ``required`` (the intents gpu_passthrough needs)."""

    vendor: str
    intents: tuple[str, ...]
    changes: list[Setting] = field(default_factory=list)
    already: list[Setting] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    required: frozenset[str] = frozenset()

    @property
    def attributes(self) -> dict[str, Any]:
        """The PATCH body's ``Attributes`` (each attribute once)."""
        return {s.attribute: s.value for s in self.changes}

    @property
    def required_missing(self) -> list[str]:
        return [i for i in (*self.absent, *self.unmapped) if i in self.required]

    @property
    def wanted(self) -> dict[str, Any]:
        """Every attribute the intents want, changed or not (what the read-back checks)."""
        return {s.attribute: s.value for s in (*self.already, *self.changes)}


def plan(
    vendor: str,
    intents: tuple[str, ...],
    attrs: dict[str, Any],
    *,
    suffixed: bool = False,
    required: tuple[str, ...] = (),
) -> BiosPlan:
    """Compare the intents' attributes with the BIOS's current ``Attributes``."""
    table = MAPS.get((vendor or "generic").lower())
    out = BiosPlan(vendor=vendor, intents=intents, required=frozenset(required))
    seen: set[str] = set()
    for intent in intents:
        rows = (table or {}).get(intent)
        if not rows:
            out.unmapped.append(intent)
            continue
        found = False
        for row in rows:
            name = find_attribute(attrs, row.name, suffixed=suffixed)
            if name is None:
                continue
            found = True
            if name in seen:
                continue
            seen.add(name)
            setting = Setting(intent, name, row.value, attrs[name])
            (out.already if same(attrs[name], row.value) else out.changes).append(setting)
        if not found:
            out.absent.append(intent)
    return out


@dataclass(frozen=True)
class Mismatch:
    attribute: str
    wanted: Any
    got: Any  # None: the BIOS no longer lists it
    pending: bool = False  # the settings object still holds the change (not applied yet)

    def text(self) -> str:
        got = "nothing" if self.got is None else str(self.got)
        pending = ", still pending" if self.pending else ""
        return f"{self.attribute} (wanted {self.wanted}, reads {got}{pending})"


def verify(p: BiosPlan, after: dict[str, Any], pending: dict[str, Any] | None = None) -> list[Mismatch]:
    """Attributes that do not read back as wanted after the reset."""
    out = []
    for name, value in p.wanted.items():
        got = after.get(name)
        if got is None or not same(got, value):
            still = pending is not None and name in pending and same(pending[name], value)
            out.append(Mismatch(name, value, got, still))
    return out


def _kv(settings: list[Setting]) -> str:
    return ", ".join(f"{s.attribute}={s.value}" for s in settings)


def warning(p: BiosPlan) -> str:
    """The clear warning when gpu_passthrough needs something this BIOS cannot be set to."""
    missing = p.required_missing
    if not missing:
        return ""
    return (
        f"WARNING: gpu_passthrough needs {', '.join(missing)} but this {p.vendor} BIOS has no "
        "attribute for it: check VT-d/AMD-Vi in the BIOS setup, passthrough may not work"
    )


def plan_message(p: BiosPlan, apply_time: str = "") -> str:
    """What the job sets before its reset (the job's message at the reset)."""
    parts = []
    when = f" (apply time {apply_time})" if apply_time else ""
    if p.changes:
        parts.append(f"set {_kv(p.changes)} on this reset{when}")
    if p.already:
        parts.append(f"already as wanted: {_kv(p.already)}")
    if p.absent:
        parts.append(f"not on this BIOS: {', '.join(p.absent)}")
    if p.unmapped:
        parts.append(f"no {p.vendor} mapping: {', '.join(p.unmapped)}")
    text = f"BIOS ({', '.join(p.intents)}): " + "; ".join(parts or ["nothing to do"])
    warn = warning(p)
    return f"{text}. {warn}" if warn else text


def readback_message(p: BiosPlan, mismatches: list[Mismatch]) -> str:
    """The verdict after the reset (the job's message once the BIOS was read back)."""
    head = (
        f"BIOS read back after the reset: set {_kv(p.changes)}"
        if p.changes
        else "BIOS read back after the reset"
    )
    if not mismatches:
        text = f"{head}; all {len(p.wanted)} attribute(s) as wanted"
    else:
        text = f"{head}; MISMATCH: {', '.join(m.text() for m in mismatches)}"
    warn = warning(p)
    return f"{text}. {warn}" if warn else text
