"""BIOS intents (issue 27 item 4): the per-vendor table against recorded ``Bios`` responses of real
BMCs (tests/unit/provisioner/fixtures/bios, NVIDIA/libredfish captures), the plan (only what
differs), the read-back verdict and the job's messages; the PATCH and read-back through the driver
on a recorded BMC that keeps pending settings until a reset."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from karios.common.contracts.provision import ProvisionSpec, StartProvision
from karios.provisioner.bios import apply as rf
from karios.provisioner.bios import step
from karios.provisioner.bios.intents import (
    INTENTS,
    MAPS,
    find_attribute,
    intents_for,
    plan,
    plan_message,
    readback_message,
    verify,
)
from karios.provisioner.drivers import DRIVERS, BmcEndpoint

FIXTURES = Path(__file__).parent / "fixtures/bios"
CAPTURES = {
    "dell": ("dell/idrac9-6.00.30.00_poweredge-r750", "redfish/v1/Systems/System.Embedded.1/Bios"),
    "hpe": ("hpe/ilo5-2.72_proliant-dl385-gen10plus-v2", "redfish/v1/Systems/1/Bios"),
    "lenovo": ("lenovo/xcc-tgbt42s-2.83_thinksystem-sr670-v2", "redfish/v1/Systems/1/Bios"),
    "supermicro": ("supermicro/x13-bmc-11.01.01_sys-821ge-tnhr", "redfish/v1/Systems/1/Bios"),
}


def recorded(vendor: str, suffix: str = "") -> dict[str, Any]:
    directory, path = CAPTURES[vendor]
    name = (path + suffix).replace("/", "__") + ".json"
    return json.loads((FIXTURES / directory / name).read_text())


def attrs(vendor: str) -> dict[str, Any]:
    return dict(recorded(vendor)["Attributes"])


def suffixed(vendor: str) -> bool:
    return DRIVERS[vendor].quirks.bios_names_suffixed


def kv(settings: list) -> dict[str, Any]:
    return {s.attribute: s.value for s in settings}


# -- the table against the captures ------------------------------------------------------------


@pytest.mark.parametrize("vendor", sorted(CAPTURES))
def test_every_row_citing_a_capture_finds_its_attribute_and_value_there(vendor: str) -> None:
    a = attrs(vendor)
    directory = CAPTURES[vendor][0]
    cited = [
        (intent, row)
        for intent, rows in MAPS[vendor].items()
        for row in rows
        if row.evidence.startswith("capture:") and directory in row.evidence
    ]
    assert cited, f"no row of {vendor} cites its capture"
    for intent, row in cited:
        name = find_attribute(a, row.name, suffixed=suffixed(vendor))
        assert name is not None, f"{vendor} {intent}: {row.name} not in {directory}"
        # the capture's current value is the wanted one (these servers run with them on) or,
        # for PXE (Dell, Lenovo have it off), the value's spelling is the capture's vocabulary
        assert str(a[name]).lower() in (str(row.value).lower(), "disabled", "disable"), (intent, a[name])


def test_every_vendor_row_names_an_intent_and_evidence() -> None:
    for vendor, table in MAPS.items():
        assert set(table) <= set(INTENTS), vendor
        for rows in table.values():
            for row in rows:
                assert row.evidence.split(":")[0] in ("capture", "docs", "sushy-tools"), row


def test_dell_r750_only_pxe_differs() -> None:
    p = plan("dell", INTENTS, attrs("dell"))
    assert kv(p.changes) == {"PxeDev1EnDis": "Enabled"}
    assert kv(p.already) == {
        "ProcVirtualization": "Enabled",
        "SriovGlobalEnable": "Enabled",
        "BootMode": "Uefi",
    }
    assert p.absent == [] and p.unmapped == []
    assert p.attributes == {"PxeDev1EnDis": "Enabled"}


def test_hpe_amd_has_amd_vi_but_no_intel_names_and_no_pxe_mapping() -> None:
    p = plan("hpe", INTENTS, attrs("hpe"), required=("virtualization", "iommu"))
    assert kv(p.already) == {"ProcAmdIoVt": "Enabled", "Sriov": "Enabled", "BootMode": "Uefi"}
    assert p.changes == []
    assert p.absent == ["virtualization"]  # ProcVirtualization is an Intel iLO attribute
    assert p.unmapped == ["pxe_on_nic"]
    assert p.required_missing == ["virtualization"]
    msg = plan_message(p)
    assert (
        "not on this BIOS: virtualization" in msg and "WARNING: gpu_passthrough needs virtualization" in msg
    )


def test_lenovo_xcc_pxe_is_off_the_rest_on() -> None:
    p = plan("lenovo", INTENTS, attrs("lenovo"))
    assert kv(p.changes) == {"NetworkStackSettings_IPv4PXESupport": "Enabled"}
    assert set(kv(p.already)) == {
        "Processors_IntelVirtualizationTechnology",
        "DevicesandIOPorts_IntelVTforDirectedIOVTd",
        "DevicesandIOPorts_SRIOV",
        "BootModes_SystemBootMode",
    }


def test_supermicro_suffixed_names_are_matched_and_patched_with_their_suffix() -> None:
    a = attrs("supermicro")
    a["IntelVTforDirectedI_O_VT_d__1E32"] = "Disable"
    a["IntelVirtualizationTechnology_3C6F"] = "Disable"
    p = plan(
        "supermicro", ("virtualization", "iommu"), a, suffixed=True, required=("virtualization", "iommu")
    )
    assert p.attributes == {
        "IntelVirtualizationTechnology_3C6F": "Enable",
        "IntelVTforDirectedI_O_VT_d__1E32": "Enable",
    }
    assert p.required_missing == []
    # without the quirk the stems find nothing: both intents absent, and the warning says so
    bare = plan("supermicro", ("virtualization", "iommu"), a, required=("virtualization", "iommu"))
    assert bare.absent == ["virtualization", "iommu"] and "WARNING" in plan_message(bare)


def test_supermicro_x13_has_no_boot_mode_attribute() -> None:
    p = plan("supermicro", ("uefi_boot",), attrs("supermicro"), suffixed=True)
    assert p.absent == ["uefi_boot"] and p.changes == []


def test_gpu_passthrough_implies_virtualization_and_iommu() -> None:
    assert intents_for(True) == ("virtualization", "iommu")
    assert intents_for(False) == ()
    assert intents_for(True, ["sriov", "virtualization"]) == ("virtualization", "iommu", "sriov")
    with pytest.raises(ValueError, match="unknown BIOS intent"):
        intents_for(False, ["turbo"])


def test_values_compare_case_insensitively_and_unknown_vendor_is_unmapped() -> None:
    p = plan("dell", ("virtualization",), {"ProcVirtualization": "enabled"})
    assert p.changes == [] and len(p.already) == 1
    assert plan("cisco", ("virtualization",), {"ProcVirtualization": "Disabled"}).unmapped == [
        "virtualization"
    ]


def test_read_back_verdict_names_mismatches_and_pending() -> None:
    a = attrs("dell")
    a["ProcVirtualization"] = "Disabled"
    p = plan("dell", ("virtualization", "iommu", "sriov"), a, required=("virtualization", "iommu"))
    assert p.attributes == {"ProcVirtualization": "Enabled"}
    after = dict(a)
    assert [m.attribute for m in verify(p, after)] == ["ProcVirtualization"]
    mm = verify(p, after, pending={"ProcVirtualization": "Enabled"})
    assert mm[0].pending
    msg = readback_message(p, mm)
    assert msg.startswith("BIOS read back after the reset: set ProcVirtualization=Enabled")
    assert "MISMATCH: ProcVirtualization (wanted Enabled, reads Disabled, still pending)" in msg
    after["ProcVirtualization"] = "Enabled"
    assert verify(p, after) == []
    assert readback_message(p, []).endswith("all 2 attribute(s) as wanted")


# -- the settings object and apply time of each capture ----------------------------------------


@pytest.mark.parametrize(
    ("vendor", "settings", "apply_time"),
    [
        ("dell", "/redfish/v1/Systems/System.Embedded.1/Bios/Settings", "OnReset"),
        ("hpe", "/redfish/v1/systems/1/bios/settings/", ""),
        ("lenovo", "/redfish/v1/Systems/1/Bios/Pending", "OnReset"),
        ("supermicro", "/redfish/v1/Systems/1/Bios/SD", ""),
    ],
)
def test_settings_object_and_apply_time_from_the_capture(vendor: str, settings: str, apply_time: str) -> None:
    res = rf.parse_bios(recorded(vendor), "/" + CAPTURES[vendor][1])
    assert (res.settings_uri, res.apply_time) == (settings, apply_time)
    body = rf.patch_body({"X": "Enabled"}, res.apply_time)
    assert ("@Redfish.SettingsApplyTime" in body) == bool(apply_time)
    if apply_time:
        assert body["@Redfish.SettingsApplyTime"] == {"ApplyTime": "OnReset"}


# -- through the driver: a recorded Dell BMC that keeps PATCHed settings until a reset --------


class PendingBiosBmc:
    """The Dell capture's System and Bios; a PATCH of Bios/Settings is pending until ``reset()``."""

    def __init__(self, current: dict[str, Any], *, ignore: tuple[str, ...] = ()) -> None:
        directory = FIXTURES / CAPTURES["dell"][0]
        self.bios = json.loads((directory / "redfish__v1__Systems__System.Embedded.1__Bios.json").read_text())
        self.bios["Attributes"] = current
        self.pending: dict[str, Any] = {}
        self.patches: list[dict[str, Any]] = []
        self.ignore = ignore  # attributes the firmware drops on apply

    def reset(self) -> None:
        for k, v in self.pending.items():
            if k not in self.ignore:
                self.bios["Attributes"][k] = v
        self.pending = {}

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/redfish/v1":
            return httpx.Response(200, json={"Systems": {"@odata.id": "/redfish/v1/Systems"}})
        if path == "/redfish/v1/Systems":
            return httpx.Response(
                200, json={"Members": [{"@odata.id": "/redfish/v1/Systems/System.Embedded.1"}]}
            )
        if path == "/redfish/v1/Systems/System.Embedded.1":
            bios = {"@odata.id": "/redfish/v1/Systems/System.Embedded.1/Bios"}
            return httpx.Response(200, json={"Bios": bios, "PowerState": "On"})
        if path == "/redfish/v1/Systems/System.Embedded.1/Bios":
            return httpx.Response(200, json=copy.deepcopy(self.bios))
        if path == "/redfish/v1/Systems/System.Embedded.1/Bios/Settings":
            if request.method == "PATCH":
                body = json.loads(request.content)
                self.patches.append(body)
                self.pending.update(body["Attributes"])
                return httpx.Response(202)
            return httpx.Response(200, json={"Attributes": dict(self.pending)})
        return httpx.Response(404, json={"error": {"message": "not recorded"}})


def driver(bmc: PendingBiosBmc):  # type: ignore[no-untyped-def]
    ep = BmcEndpoint(bmc_ip="10.0.0.9", base_url="http://bmc.test", retries=0)
    return DRIVERS["dell"](ep, transport=httpx.MockTransport(bmc.handle))


def gpu_job() -> StartProvision:
    return StartProvision(
        job_id="j1", spec=ProvisionSpec(bmc_ip="10.0.0.9", vendor="dell", hostname="n1", gpu_passthrough=True)
    )


async def test_before_reset_patches_only_what_differs_with_on_reset_and_reads_back_after() -> None:
    current = attrs("dell")
    current["ProcVirtualization"] = "Disabled"
    bmc = PendingBiosBmc(current)
    drv = driver(bmc)
    async with drv:
        s = await step.before_reset(drv, gpu_job())
        assert s is not None and s.written
        assert bmc.patches == [
            {
                "Attributes": {"ProcVirtualization": "Enabled"},
                "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"},
            }
        ]
        assert s.note.startswith("BIOS (virtualization, iommu): set ProcVirtualization=Enabled on this reset")
        assert "(apply time OnReset)" in s.note and "WARNING" not in s.note
        bmc.reset()  # the job's one reset applies it
        msg = await step.after_reset(drv, s, deadline=0)
    assert msg == (
        "BIOS read back after the reset: set ProcVirtualization=Enabled; all 1 attribute(s) as wanted"
    )


async def test_a_setting_the_firmware_drops_is_reported_as_a_mismatch_not_a_failure() -> None:
    current = attrs("dell")
    current["ProcVirtualization"] = "Disabled"
    bmc = PendingBiosBmc(current, ignore=("ProcVirtualization",))
    drv = driver(bmc)
    async with drv:
        s = await step.before_reset(drv, gpu_job())
        assert s is not None
        bmc.reset()
        msg = await step.after_reset(drv, s, deadline=0)
    assert "MISMATCH: ProcVirtualization (wanted Enabled, reads Disabled)" in msg


async def test_nothing_is_patched_when_the_bios_already_is_as_wanted_and_no_intent_no_step() -> None:
    bmc = PendingBiosBmc(attrs("dell"))
    drv = driver(bmc)
    async with drv:
        s = await step.before_reset(drv, gpu_job())
        assert s is not None and not s.written and bmc.patches == []
        assert "already as wanted: ProcVirtualization=Enabled" in s.note
        plain = StartProvision(
            job_id="j2", spec=ProvisionSpec(bmc_ip="10.0.0.9", vendor="dell", hostname="n1")
        )
        assert await step.before_reset(drv, plain) is None


async def test_a_bmc_without_bios_warns_when_gpu_passthrough_needs_it() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/redfish/v1":
            return httpx.Response(200, json={"Systems": {"@odata.id": "/redfish/v1/Systems"}})
        if request.url.path == "/redfish/v1/Systems":
            return httpx.Response(200, json={"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]})
        return httpx.Response(200, json={"PowerState": "On"})

    ep = BmcEndpoint(bmc_ip="10.0.0.9", base_url="http://bmc.test", retries=0)
    async with DRIVERS["generic"](ep, transport=httpx.MockTransport(handle)) as drv:
        s = await step.before_reset(drv, gpu_job())
    assert s is not None and s.plan is None
    assert s.note.startswith("BIOS: the BMC offers no Bios resource; not set: virtualization, iommu.")
    assert "WARNING: gpu_passthrough needs virtualization and iommu" in s.note
