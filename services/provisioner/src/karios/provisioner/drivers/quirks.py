"""Every vendor quirk in one table, with the firmware that shows it and the evidence.

``Quirks`` is the set of flags a driver reads; ``QUIRKS`` documents each one (vendor, flag,
firmware, evidence, fixture under ``tests/unit/provisioner/fixtures/redfish``; the inspection
rows' captures, in directories of the same names, are under ``tests/fixtures/redfish_inventory``).
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
    # Inspection (inspect/): what differs in the hardware a firmware reports.
    inventory_concurrency: int = 4  # Redfish GETs at once while inspecting one BMC
    firmware_skip_prefixes: tuple[str, ...] = ()  # FirmwareInventory ids that are not what runs
    host_interface_nics: frozenset[str] = frozenset()  # EthernetInterfaces that are the host→BMC link
    gpu_ids_from_oem: bool = False  # PCIe functions report 0x0000 ids; the vendor is in the Oem block
    pci_ids_decimal: bool = False  # PCIe VendorId/DeviceId are decimal strings ("4139" = 0x102b)
    # BIOS settings (bios/): what differs in the Bios resource.
    bios_names_suffixed: bool = False  # attribute names end in "_<4 hex digits>" (…Technology_3C6F)
    # Firmware updates (firmware/): how an image reaches the BMC.
    firmware_push: str = "simple_update"  # "simple_update" (the BMC fetches ImageURI) | "multipart"


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
        "dell",
        "firmware_skip_prefixes=(Current-, Previous-, Available-, Installable-)",
        "iDRAC9 6.00.30.00",
        "FirmwareInventory lists Installed-* (what runs: 21 components), Current-* (the same component "
        "and version again: 6), Previous-* (the rollback image: BIOS 1.2.4, iDRAC 4.40) and, when "
        "staged, Available-*/Installable-*; only Installed-* is kept",
        "dell/idrac9-6.00.30.00_poweredge-r750 (UpdateService__FirmwareInventory)",
    ),
    QuirkRow(
        "dell",
        "PCIeDevices linked from the System (array), not only under Chassis",
        "iDRAC9 6.00.30.00",
        "System.PCIeDevices is a list of links; the inspection follows it before Chassis/<id>/PCIeDevices",
        "dell/idrac9-6.00.30.00_poweredge-r750",
    ),
    QuirkRow(
        "hpe",
        "Drive @odata.id with trailing '/', PCIeDevices only under Chassis",
        "iLO 5 2.72",
        "Storage/DA*/Drives/DA*/ ids end in '/'; the System has no PCIeDevices link (Chassis/1/PCIeDevices)",
        "hpe/ilo5-2.72_proliant-dl385-gen10plus-v2",
    ),
    QuirkRow(
        "hpe",
        "pci_ids_decimal",
        "iLO 5 2.72",
        'PCIeFunctions report VendorId "4139" / DeviceId "1336" (decimal for 0x102b:0x0538, the '
        'embedded Matrox video), Mellanox as "5555" (0x15b3)',
        "hpe/ilo5-2.72_proliant-dl385-gen10plus-v2 (Chassis__1__PCIeDevices__222…)",
    ),
    QuirkRow(
        "lenovo",
        "host_interface_nics={ToManager}",
        "XCC TGBT42S 2.83",
        "Systems/1/EthernetInterfaces/ToManager is the host's USB/LAN-over-USB link to the XCC, not a port",
        "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2",
    ),
    QuirkRow(
        "supermicro",
        "gpu_ids_from_oem",
        "X13 BMC 11.01.01",
        "GPU PCIeFunctions report VendorId/DeviceId 0x0000; "
        "Oem.Supermicro.GPUDevice.GPUVendor names the maker",
        "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr",
    ),
    QuirkRow(
        "supermicro",
        "Storage drives under Chassis; SimpleStorage beside Storage",
        "X13 BMC 11.01.01",
        "Storage/NVMeSSD.Drives link to Chassis/NVMeSSD.*.StorageBackplane/Drives/*; "
        "SimpleStorage/1 lists the same disks inline (no serial)",
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
    QuirkRow(
        "supermicro",
        "bios_names_suffixed",
        "X13 BMC 11.01.01",
        "Bios Attributes are named <setup label>_<4 hex digits> (IntelVirtualizationTechnology_3C6F, "
        "SR_IOVSupport_0047); values Enable/Disable for VT-x/VT-d, Enabled/Disabled for others; the "
        "settings object is Bios/SD, no SupportedApplyTimes (applied at the next boot)",
        "supermicro/x13-bmc-11.01.01_sys-821ge-tnhr (Bios: tests/unit/provisioner/fixtures/bios)",
    ),
    QuirkRow(
        "dell",
        "BIOS settings apply time OnReset",
        "iDRAC9 6.00.30.00",
        "Bios @Redfish.Settings.SupportedApplyTimes [OnReset, AtMaintenanceWindowStart, …]; a PATCH of "
        "Bios/Settings with @Redfish.SettingsApplyTime OnReset is applied by the next reset",
        "dell/idrac9-6.00.30.00_poweredge-r750 (Bios: tests/unit/provisioner/fixtures/bios)",
    ),
    QuirkRow(
        "lenovo",
        "BIOS settings object is Bios/Pending",
        "XCC TGBT42S 2.83",
        "Bios @Redfish.Settings.SettingsObject → /redfish/v1/Systems/1/Bios/Pending, "
        "SupportedApplyTimes [OnReset]",
        "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2 (Bios: tests/unit/provisioner/fixtures/bios)",
    ),
    QuirkRow(
        "hpe",
        "BIOS settings object bios/settings/ (lower case), no SupportedApplyTimes",
        "iLO 5 2.72",
        "SettingsObject /redfish/v1/systems/1/bios/settings/; pending settings apply at the next reboot",
        "hpe/ilo5-2.72_proliant-dl385-gen10plus-v2 (Bios: tests/unit/provisioner/fixtures/bios)",
    ),
    QuirkRow(
        "lenovo",
        "firmware_push=multipart",
        "XCC TGBT42S 2.83",
        "UpdateService SimpleUpdate Targets@Redfish.AllowableValues lists only FirmwareInventory/BMC-Backup; "
        "MultipartHttpPushUri /mfwupdate takes the other components (UEFI, LXPM, adapters)",
        "lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2 (tests/fixtures/redfish_inventory: UpdateService)",
    ),
]
