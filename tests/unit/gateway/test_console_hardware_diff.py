"""The console's servers view marks a server whose inspected hardware disagrees with the
inventory (issue 27 item 2): the view model carries the diff, the row shows "N differences" and
their list; a server that matches says so; one the inventory has no record of shows neither."""

from __future__ import annotations

from karios.api_gateway.auth import Principal, Role
from karios.api_gateway.console import pages, views
from karios.common.contracts.hardware import Drive, HardwareRecord, NetworkInterface, SystemInfo
from karios.common.contracts.inventory import BmcHardware, Disk, Nic, NodeSummary

REC = HardwareRecord(
    bmc_ip="10.0.0.10",
    inspected_at="2026-12-05T05:00:00+00:00",
    driver="dell",
    system=SystemInfo(manufacturer="Dell Inc.", model="PowerEdge R650", serial="HW1"),
    drives=[
        Drive(id="Disk.Bay.0", serial="S1", size_gb=960.2),
        Drive(id="Disk.Bay.1", serial="S2", size_gb=960.2),
    ],
    nics=[NetworkInterface(id="NIC.1", mac="b0:7b:25:aa:00:01")],
)
IN_SYNC = BmcHardware(
    device_name="db-01",
    bmc_ip="10.0.0.10",
    serial="HW1",
    disks=[Disk(name="sda", serial="S1", size_gb=960), Disk(name="sdb", serial="S2", size_gb=960)],
    nics=[Nic(name="eno1", macs=["b0:7b:25:aa:00:01"])],
)


def lines() -> list[views.ServerLine]:
    registry = [NodeSummary(bmc_ip=ip, hostname=f"h{n}") for n, ip in enumerate(("10.0.0.10", "10.0.0.11"))]
    return views.server_lines(registry, [], [])


def render(servers: list[views.ServerLine]) -> str:
    page = views.page_of(servers, 1, 50)
    p = Principal(name="op", role=Role.operator)
    return pages._page(
        "servers.html",
        p,
        "servers",
        servers=page,
        total=len(servers),
        q="",
        state="",
        states=views.SERVER_STATES,
    ).body.decode()


def test_a_row_out_of_sync_shows_how_many_differences_and_which() -> None:
    inv = IN_SYNC.model_copy(
        update={
            "disks": IN_SYNC.disks[:1],
            "nics": [*IN_SYNC.nics, Nic(name="eno2", macs=["02:00:00:00:00:02"])],
        }
    )
    rows = views.with_hardware(lines(), {"10.0.0.10": REC, "10.0.0.11": REC}, {"10.0.0.10": inv})
    db, other = rows
    assert db.out_of_sync == "2 differences"
    assert db.differences == ["disks: S2 only on the BMC", "nics: 02:00:00:00:00:02 only in the inventory"]
    assert other.diff is None and other.out_of_sync == "" and other.hardware  # no inventory record
    html = render(rows)
    assert "2 differences from the inventory" in html and 'data-differences="2"' in html
    assert "<li>disks: S2 only on the BMC</li>" in html
    assert html.count("hw-diff") == 1 and "matches the inventory" not in html


def test_a_row_in_sync_says_it_matches_and_a_changed_serial_is_one_difference() -> None:
    (db, _) = views.with_hardware(lines(), {"10.0.0.10": REC}, {"10.0.0.10": IN_SYNC})
    assert db.diff is not None and db.diff.in_sync and db.out_of_sync == "" and db.differences == []
    assert "matches the inventory" in render([db]) and "hw-diff" not in render([db])
    (db, _) = views.with_hardware(
        lines(), {"10.0.0.10": REC}, {"10.0.0.10": IN_SYNC.model_copy(update={"serial": "X9"})}
    )
    assert db.out_of_sync == "1 difference" and db.differences == ["serial: system serial HW1 (BMC) vs X9"]
