"""``karios server show BMC_IP --hardware`` rendering (issue 27 item 2): the record's summary and
the diff's table, from a diff the real pure diff made, without a gateway."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from rich.console import Console

from karios.cli.client.server_cmd import diff_rows, diff_table, record_table
from karios.cli.client.shared import STATE, print_table
from karios.cli.main import app, main
from karios.common.contracts.hardware import Drive, HardwareRecord, NetworkInterface, SystemInfo
from karios.common.contracts.inventory import BmcHardware, Disk, Nic
from karios.common.hardware_diff import hardware_diff

REC = HardwareRecord(
    bmc_ip="10.0.0.7",
    inspected_at="2026-12-05T05:00:00+00:00",
    driver="dell",
    system=SystemInfo(manufacturer="Dell Inc.", model="PowerEdge R750", serial="CNIVC0014M0388"),
    processor_count=2,
    memory_total_gib=512.0,
    drives=[
        Drive(id="Disk.Bay.0", serial="61X0A002TCD8", size_gb=1920.4, model="CM6"),
        Drive(id="Disk.Bay.1", serial="61M0A08ZTCD8", size_gb=1920.4, model="CM6"),
    ],
    nics=[
        NetworkInterface(id="NIC.1", mac="70:b5:e8:f0:52:dc"),
        NetworkInterface(id="NIC.2", mac="70:b5:e8:f0:52:dd"),
    ],
    missing=["PCIeDevices: 404 Not Found"],
)
INV = BmcHardware(
    device_name="r750-07",
    bmc_ip="10.0.0.7",
    serial="CNIVC0014M0388",
    disks=[Disk(name="nvme1", serial="61M0A08ZTCD8", size_gb=3840)],
    nics=[Nic(name="eth0", macs=["70:b5:e8:f0:52:dc"]), Nic(name="eth9", macs=["02:00:00:00:00:09"])],
)


@pytest.fixture(autouse=True)
def _output_state() -> Iterator[None]:
    saved = dict(STATE)
    STATE.update(output="table", context=None)
    yield
    STATE.clear()
    STATE.update(saved)


def _render(t) -> str:  # type: ignore[no-untyped-def]
    buf = io.StringIO()
    con = Console(file=buf, width=100, force_terminal=False, color_system=None, highlight=False)
    print_table(t, con)
    return buf.getvalue()


def test_the_diff_table_lists_each_difference_with_its_side_and_detail() -> None:
    diff = hardware_diff(REC, INV).model_dump()
    assert diff_rows(diff) == [
        {
            "category": "disks",
            "where": "BMC only",
            "item": "61X0A002TCD8",
            "detail": "Disk.Bay.0, CM6, 1920.4 GB",
        },
        {
            "category": "disks",
            "where": "differs",
            "item": "61M0A08ZTCD8",
            "detail": "size_gb: BMC 1920.4 / inventory 3840",
        },
        {"category": "nics", "where": "BMC only", "item": "70:b5:e8:f0:52:dd", "detail": "NIC.2"},
        {"category": "nics", "where": "inventory only", "item": "02:00:00:00:00:09", "detail": "eth9"},
    ]
    out = _render(diff_table(diff))
    assert "BMC vs inventory (r750-07): 4 differences" in out
    assert "not compared: gpus: PCIeDevices: 404 Not Found" in out
    assert "02:00:00:00:00:09" in out and "inventory only" in out


def test_an_in_sync_diff_says_so_and_the_record_summary_shows_identity_and_counts() -> None:
    inv = INV.model_copy(
        update={
            "disks": [Disk(name=d.id, serial=d.serial, size_gb=d.size_gb) for d in REC.drives],
            "nics": [Nic(name=n.id, macs=[n.mac]) for n in REC.nics],
        }
    )
    diff = hardware_diff(REC, inv).model_dump()
    assert diff_rows(diff) == []
    assert "BMC vs inventory (r750-07): in sync" in _render(diff_table(diff))
    summary = _render(record_table(REC.model_dump()))
    for text in (
        "Dell Inc. PowerEdge R750",
        "CNIVC0014M0388",
        "512.0 GiB",
        "2 (3840.8 GB)",
        "70:b5:e8:f0:52:dd",
    ):
        assert text in summary, summary
    assert "PCIeDevices: 404 Not Found" in summary


def test_server_show_has_help_and_refuses_an_unknown_output(capsys: pytest.CaptureFixture[str]) -> None:
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, ["server", "show", "--help"])
    assert r.exit_code == 0 and "--hardware" in r.output and "BMC_IP" in r.output
    assert main(["server", "show", "10.0.0.7", "--hardware", "-o", "yaml"]) == 2
    assert "--output 'yaml': expected one of table, wide, json" in capsys.readouterr().err
