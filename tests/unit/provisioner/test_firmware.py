"""Firmware updates (issue 27 item 5), the pure core: how an update is sent to each recorded
UpdateService, how a Task reads (recorded sushy task samples, sushy-tools' own Task), the
per-component result, and the component kinds of the recorded FirmwareInventories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from karios.provisioner.drivers import DRIVERS
from karios.provisioner.firmware.core import (
    UpdateNotPossible,
    VersionSeen,
    component_results,
    plan_update,
    read_task,
    task_percent,
    verdict,
)
from karios.provisioner.inspect.parse import firmware, firmware_kind, firmware_of_system

FULL = Path(__file__).parents[2] / "fixtures" / "redfish_inventory"
REDFISH = Path(__file__).parent / "fixtures" / "redfish"
TASKS = REDFISH / "generic" / "sushy-task-samples"
SUSHY = REDFISH / "generic" / "sushy-tools-2.2.0"
DELL = FULL / "dell" / "idrac9-6.00.30.00_poweredge-r750"
LENOVO = FULL / "lenovo" / "xcc-tgbt42s-2.83_thinksystem-sr670-v2"
SMC = FULL / "supermicro" / "x13-bmc-11.01.01_sys-821ge-tnhr"
URL = "http://10.0.0.1:8081/images/fw/bios.bin"
BIOS = "/redfish/v1/UpdateService/FirmwareInventory/Installed-159-1.8.2__BIOS.Setup.1-1"


def _doc(path: Path) -> dict:
    return json.loads(path.read_text())


def _service(d: Path) -> dict:
    return _doc(d / "redfish__v1__UpdateService.json")


# -- how the image reaches the BMC ----------------------------------------------------------------


def test_dell_gets_simpleupdate_with_the_protocol_it_lists_and_the_apply_time_it_supports() -> None:
    plan = plan_update(
        _service(DELL), DRIVERS["dell"].quirks, image_url=URL, targets=[BIOS], apply_time="on_reset"
    )
    assert plan.method == "simple_update"
    assert plan.target == "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"
    assert plan.body == {
        "ImageURI": URL,
        "TransferProtocol": "HTTP",
        "Targets": [BIOS],
        "@Redfish.OperationApplyTime": "OnReset",
    }
    now = plan_update(
        _service(DELL), DRIVERS["dell"].quirks, image_url=URL, targets=[], apply_time="immediate"
    )
    assert now.body["@Redfish.OperationApplyTime"] == "Immediate" and "Targets" not in now.body


def test_lenovo_pushes_multipart_as_its_quirk_says_with_the_targets_as_update_parameters() -> None:
    uefi = "/redfish/v1/UpdateService/FirmwareInventory/UEFI"
    plan = plan_update(
        _service(LENOVO), DRIVERS["lenovo"].quirks, image_url=URL, targets=[uefi], apply_time="immediate"
    )
    assert (plan.method, plan.target, plan.body) == ("multipart_push", "/mfwupdate", {"Targets": [uefi]})


def test_simpleupdate_that_accepts_only_other_targets_falls_back_to_the_multipart_uri() -> None:
    """The XCC's SimpleUpdate lists only BMC-Backup: a generic driver on it pushes instead."""
    uefi = "/redfish/v1/UpdateService/FirmwareInventory/UEFI"
    plan = plan_update(
        _service(LENOVO), DRIVERS["generic"].quirks, image_url=URL, targets=[uefi], apply_time="immediate"
    )
    assert plan.method == "multipart_push"
    backup = "/redfish/v1/UpdateService/FirmwareInventory/BMC-Backup"
    simple = plan_update(
        _service(LENOVO), DRIVERS["generic"].quirks, image_url=URL, targets=[backup], apply_time="immediate"
    )
    assert simple.method == "simple_update" and simple.body["TransferProtocol"] == "HTTP"
    no_push = {k: v for k, v in _service(LENOVO).items() if k != "MultipartHttpPushUri"}
    with pytest.raises(UpdateNotPossible, match="targets: SimpleUpdate on this BMC accepts only"):
        plan_update(no_push, DRIVERS["generic"].quirks, image_url=URL, targets=[uefi], apply_time="immediate")


def test_supermicro_simpleupdate_without_listed_protocols_sends_none() -> None:
    plan = plan_update(
        _service(SMC), DRIVERS["supermicro"].quirks, image_url=URL, targets=[], apply_time="immediate"
    )
    assert plan.method == "simple_update" and plan.body == {"ImageURI": URL}


def test_on_reset_is_refused_where_the_bmc_does_not_advertise_apply_times() -> None:
    """sushy-tools' UpdateService (and the Supermicro X13) advertise no OperationApplyTimeSupport."""
    for service in (_doc(SUSHY / "redfish__v1__UpdateService.json"), _service(SMC)):
        with pytest.raises(UpdateNotPossible, match=r"^apply_time: the BMC does not advertise"):
            plan_update(service, DRIVERS["generic"].quirks, image_url=URL, targets=[], apply_time="on_reset")


def test_a_scheme_the_bmc_does_not_fetch_by_is_refused_naming_image_url() -> None:
    with pytest.raises(UpdateNotPossible, match=r"^image_url: the BMC fetches images by"):
        plan_update(
            _doc(SUSHY / "redfish__v1__UpdateService.json"),
            DRIVERS["generic"].quirks,
            image_url="ftp://10.0.0.1/bios.bin",
            targets=[],
            apply_time="immediate",
        )


def test_an_updateservice_with_neither_action_nor_push_uri_cannot_update() -> None:
    with pytest.raises(UpdateNotPossible, match="neither SimpleUpdate nor a multipart"):
        plan_update(
            {"Id": "UpdateService"},
            DRIVERS["generic"].quirks,
            image_url=URL,
            targets=[],
            apply_time="immediate",
        )


# -- reading a Task ---------------------------------------------------------------------------------


def test_a_completed_recorded_task_is_done_ok_with_its_message_filled_in() -> None:
    reading = read_task(200, _doc(TASKS / "redfish__v1__TaskService__Tasks__545.json"))
    assert (reading.state, reading.percent, reading.done, reading.ok) == ("Completed", 100, True, True)
    assert reading.messages == ["Warning: Property SKU is read only."]


def test_a_pending_recorded_task_is_not_done_and_reports_its_percent() -> None:
    reading = read_task(200, _doc(TASKS / "redfish__v1__TaskService__Tasks__546.json"))
    assert (reading.state, reading.percent, reading.done, reading.ok) == ("Pending", 55, False, False)


def test_the_task_monitors_final_answer_and_sushy_tools_task_are_done() -> None:
    assert read_task(200, _doc(TASKS / "taskmon__545.json")).ok
    assert read_task(200, _doc(SUSHY / "redfish__v1__TaskService__Tasks__42.json")).ok


@pytest.mark.parametrize(
    ("status", "doc", "done", "ok"),
    [
        (202, {}, False, False),  # a monitor while the task runs (DSP0266), no body
        (204, {}, True, True),  # the monitor's final answer of an operation with no body
        (202, {"TaskState": "Running", "PercentComplete": 30}, False, False),
        (200, {"TaskState": "Exception", "TaskStatus": "Critical"}, True, False),
        (200, {"TaskState": "Killed"}, True, False),
        (200, {"TaskState": "Cancelled"}, True, False),
        (200, {"TaskState": "Completed", "TaskStatus": "Critical"}, True, False),
        (200, {"TaskState": "Suspended"}, False, False),
        (200, {"TaskState": "Interrupted"}, False, False),
    ],
)
def test_task_states_map_to_running_done_or_failed(status: int, doc: dict, done: bool, ok: bool) -> None:
    reading = read_task(status, doc)
    assert (reading.done, reading.ok) == (done, ok)


def test_an_exception_task_keeps_its_messages_single_or_listed() -> None:
    one = read_task(
        200, {"TaskState": "Exception", "Messages": {"Message": "flash failed", "Severity": "Critical"}}
    )
    assert one.messages == ["Critical: flash failed"] and not one.ok


def test_progress_never_goes_back_and_stays_below_100_until_the_task_ends() -> None:
    running = read_task(200, {"TaskState": "Running", "PercentComplete": 100})
    assert task_percent(running, 40) == 99
    assert task_percent(read_task(200, {"TaskState": "Running", "PercentComplete": 10}), 40) == 40
    assert task_percent(read_task(200, {"TaskState": "Running"}), 40) == 40
    assert task_percent(read_task(200, {"TaskState": "Completed"}), 40) == 100


# -- per-component result -------------------------------------------------------------------------


def _seen(key: str, version: str, kind: str = "bios") -> VersionSeen:
    return VersionSeen(key.rsplit("/", 1)[-1], key.rsplit("/", 1)[-1], kind, key, version)


def test_components_report_what_changed_and_every_target() -> None:
    bmc = "/redfish/v1/UpdateService/FirmwareInventory/iDRAC"
    nic = "/redfish/v1/UpdateService/FirmwareInventory/NIC"
    before = {BIOS: _seen(BIOS, "1.8.2"), bmc: _seen(bmc, "6.00", "bmc"), nic: _seen(nic, "21.8", "nic")}
    after = {BIOS: _seen(BIOS, "1.9.0"), bmc: _seen(bmc, "6.00", "bmc"), nic: _seen(nic, "21.8", "nic")}
    out = component_results(before, after, [BIOS, bmc])
    assert [(r.id, r.version_before, r.version_after, r.outcome) for r in out] == [
        ("Installed-159-1.8.2__BIOS.Setup.1-1", "1.8.2", "1.9.0", "updated"),
        ("iDRAC", "6.00", "6.00", "unchanged"),
    ]  # the NIC, not a target and unchanged, is not reported
    assert verdict(out, [BIOS, bmc], pending_reset=False).endswith("same version: iDRAC")
    staged = component_results(before, before, [BIOS], pending_reset=True)
    assert [r.outcome for r in staged] == ["pending_reset"] and not verdict(
        staged, [BIOS], pending_reset=True
    )


def test_a_component_that_appears_or_disappears_is_reported() -> None:
    """Dell renames an inventory member with its version (Installed-159-1.8.2 → -1.9.0)."""
    new = BIOS.replace("1.8.2", "1.9.0")
    out = component_results({BIOS: _seen(BIOS, "1.8.2")}, {new: _seen(new, "1.9.0")}, [])
    assert sorted((r.outcome, r.version_before, r.version_after) for r in out) == [
        ("added", "", "1.9.0"),
        ("removed", "1.8.2", ""),
    ]


# -- the inventory in the hardware record ---------------------------------------------------------


def test_recorded_components_get_a_kind_and_their_uri() -> None:
    comp = firmware(
        _doc(DELL / f"redfish__v1{BIOS.removeprefix('/redfish/v1').replace('/', '__')}.json"),
        DRIVERS["dell"].quirks,
    )
    assert comp is not None and (comp.kind, comp.uri, comp.updateable) == ("bios", BIOS, True)
    kinds = {
        ("Installed-25227-6.00.30.00__iDRAC.Embedded.1-1", "Integrated Dell Remote Access Controller"): "bmc",
        (
            "Installed-25806-4301A56__Diagnostics.Embedded.1:LC.Embedded.1",
            "Dell 64 Bit uEFI Diagnostics",
        ): "lifecycle",
        ("Capsule_MCU", "Capsule MCU"): "other",  # "psu" is not a word of Capsule
        ("19", "BlueField-2 SmartNIC Main Card"): "nic",  # nor "uefi" of BlueField
        ("HGX_FW_BMC_0", "Software Inventory"): "bmc",
        ("HGX_FW_GPU_SXM_1", "Software Inventory"): "gpu",
        ("PSU1", "POWER-PSU1"): "psu",
        ("Disk1", "Firmware:DISK-Micron_7450_MTFDKBA960TFR"): "drive",
        ("17", "HPE Smart Array P408i-p SR Gen10"): "storage",
        ("2", "System ROM"): "bios",
        ("12", "PCIe Riser 1 Programmable Logic Device"): "cpld",
        ("Installed-109673-7.2.2.0__TPM.Integrated.1-1", "TPM"): "tpm",
    }
    assert {k: firmware_kind(*k) for k in kinds} == kinds


def test_without_a_firmware_inventory_the_system_and_manager_versions_are_the_components() -> None:
    system = {"@odata.id": "/redfish/v1/Systems/abc", "Id": "abc", "BiosVersion": "2.4.1"}
    manager = {
        "@odata.id": "/redfish/v1/Managers/BMC",
        "Id": "BMC",
        "Name": "Manager",
        "FirmwareVersion": "1.00",
    }
    got = [(c.id, c.kind, c.version, c.uri) for c in firmware_of_system(system, manager)]
    assert got == [
        ("abc/BIOS", "bios", "2.4.1", "/redfish/v1/Systems/abc"),
        ("BMC", "bmc", "1.00", "/redfish/v1/Managers/BMC"),
    ]
    assert firmware_of_system({}, {}) == []
