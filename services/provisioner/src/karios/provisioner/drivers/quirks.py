"""Every vendor quirk in one table, with the firmware that shows it and the evidence.

``Quirks`` is the set of flags a driver reads; ``QUIRKS`` documents each one (vendor, flag,
firmware, evidence, fixture under ``tests/unit/provisioner/fixtures/redfish``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quirks:
    vm_prefer: str = "system"  # which VirtualMedia link to follow first: "system" | "manager"
    insert_omit: frozenset[str] = frozenset()  # InsertMedia parameters this firmware rejects
    eject_when_empty_errors: bool = False  # never eject a slot that reports nothing inserted
    retry_on_409: bool = False  # HTTP 409 = "busy, try again" on this firmware
    strip_trailing_slash: bool = True  # compare/follow @odata.id with or without a trailing "/"
    boot_enabled: str = "Once"
    read_back_insert: bool = False  # a 200/204 to InsertMedia does not mean inserted: read back
    max_concurrent_mounts: int = 1


@dataclass(frozen=True)
class QuirkRow:
    vendor: str
    flag: str
    firmware: str
    evidence: str
    fixture: str


QUIRKS: list[QuirkRow] = [
    QuirkRow(
        "dell",
        "vm_prefer=system",
        "iDRAC9 6.00.30.00, 7.10.30.00",
        "Manager carries VirtualMedia@Redfish.Deprecated pointing at Systems/System.Embedded.1/VirtualMedia",
        "dell/idrac9-6.00.30.00_poweredge-r750, dell/idrac9-7.10.30.00_poweredge-r750",
    ),
    QuirkRow(
        "dell",
        "vm under Manager only (follow links)",
        "iDRAC9 3.x/4.x",
        "System has no VirtualMedia link; the Manager has one",
        "dell/idrac9-3.x-4.x_poweredge-r640_sushy-oem-samples (not mountable: no member files)",
    ),
    QuirkRow(
        "dell",
        "retry_on_409",
        "iDRAC9 (all)",
        "error bodies IDRAC.2.8.RAC0679 'job already running' / LC068 'pending configuration job' "
        "(sushy-oem-idrac returns them as 400; we also retry 409 as a busy signal)",
        "dell/idrac9-3.x-4.x_poweredge-r640_sushy-oem-samples/error--*.json",
    ),
    QuirkRow(
        "dell",
        "error MessageArgs is a string",
        "iDRAC9 3.x",
        '"MessageArgs": "[]" in error bodies; the error parser accepts any type',
        "dell/idrac9-3.x-4.x_poweredge-r640_sushy-oem-samples/error--*.json",
    ),
    QuirkRow(
        "hpe",
        "vm_prefer=manager",
        "iLO 5 1.1x–2.72",
        "System has no VirtualMedia link; media only under Managers/1/VirtualMedia",
        "hpe/ilo5-2.72_proliant-dl385-gen10plus-v2, hpe/ilo5-2.46_…, hpe/ilo5-2.55_…",
    ),
    QuirkRow(
        "hpe",
        "OEM InsertVirtualMedia when no standard action",
        "iLO 5 1.1x",
        "members are VirtualMedia.v1_0_0 with only Oem.Hpe HpeiLOVirtualMedia actions",
        "hpe/ilo5-1.1x_proliantutils-samples (source only; not in the mount contract run)",
    ),
    QuirkRow(
        "hpe",
        "strip_trailing_slash",
        "iLO 5 2.70, 1.1x",
        "every @odata.id and action target ends in '/'",
        "hpe/ilo5-2.70_proliant-xl675d-gen10plus",
    ),
    QuirkRow(
        "hpe",
        'empty Image is ""',
        "iLO 5 2.72",
        'Image "" instead of null when nothing is inserted',
        "hpe/ilo5-2.72_proliant-dl385-gen10plus-v2",
    ),
    QuirkRow(
        "lenovo",
        "insert by PATCH Image/Inserted",
        "XCC TGBT42S 2.83, XCC 2020",
        "no member has an Actions block (no InsertMedia/EjectMedia target)",
        "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2, lenovo/xcc-2020_gofish-952c91b",
    ),
    QuirkRow(
        "lenovo",
        "boot_enabled=Once (no Continuous)",
        "XCC TGBT42S 2.83",
        "BootSourceOverrideEnabled@Redfish.AllowableValues is [Once, Disabled]",
        "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2/redfish__v1__Systems__1.json",
    ),
    QuirkRow(
        "supermicro",
        "eject_when_empty_errors",
        "X13 BMC 11.01.01",
        "no EjectMedia action advertised while nothing is inserted",
        "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr",
    ),
    QuirkRow(
        "supermicro",
        "InsertMedia parameters from ActionInfo",
        "X13 BMC 11.01.01",
        "InsertMediaActionInfo lists the accepted parameters; only Image is required",
        "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr/…InsertMediaActionInfo.json",
    ),
    QuirkRow(
        "supermicro",
        "System VirtualMedia link points at the Manager",
        "X13 BMC 11.01.01",
        "Systems/1 VirtualMedia → /redfish/v1/Managers/1/VirtualMedia",
        "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr",
    ),
    QuirkRow(
        "cisco",
        "vm_prefer=manager; insert_omit={Inserted, WriteProtected}",
        "CIMC 4.x (documented)",
        "Cisco UCS C-Series Redfish API guide: virtual media under Managers/CIMC/VirtualMedia; "
        "InsertMedia documented with Image/TransferProtocolType only. Hand-written fixture, not a capture",
        "cisco/cimc-4.x_documented (authored)",
    ),
]
