"""The NetBox write-back's pure core (issue 27 item 2): what a hardware record creates and updates
on a NetBox device, and that writing the same record again plans nothing (the plan applied to
the state is a state with nothing left to do). Also: the device type of an adopted server from its
DMI make and model, the journal text, which failures are retried, and the bus answer with the
write-back off (FastStream's in-memory broker). The real NetBox:
``tests/integration/inventory/test_netbox_writeback.py``."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from faststream.nats import TestNatsBroker

from karios.common.bus.envelope import wrap
from karios.common.contracts.base import Reply
from karios.common.contracts.discovery import NetboxDevice
from karios.common.contracts.hardware import (
    Drive,
    HardwareRecord,
    NetworkInterface,
    PcieDevice,
    SystemInfo,
)
from karios.common.contracts.netbox_writeback import WriteBackDevice, netbox_interface_type
from karios.common.errors import Forbidden, ServiceUnavailable, UpstreamError
from karios.common.settings import KariosSettings
from karios.inventory.app import create_app
from karios.inventory.netbox_writer import NetBoxWriter
from karios.inventory.writeback import (
    DeviceState,
    ExistingInterface,
    ExistingItem,
    Plan,
    device_state,
    device_type_slug,
    identity_conflict,
    inspection_marker,
    interface_name,
    journal_comments,
    journal_kind,
    manufacturer_name,
    pick_device_type,
    pick_manufacturer,
    plan_writeback,
    wanted_nics,
)
from karios.inventory.writeback_service import retry_later

FIELDS = frozenset({"size_gb", "pci_address"})  # what the lab NetBox defines on inventory items
MAC1, MAC2, MAC3 = "b8:ce:f6:01:02:03", "b8:ce:f6:01:02:04", "c4:cb:e1:aa:bb:01"


def rec(**kw) -> HardwareRecord:
    base = {
        "bmc_ip": "10.0.0.5",
        "inspected_at": "2026-12-05T01:00:00+00:00",
        "driver": "dell",
        "system": SystemInfo(manufacturer="Dell Inc.", model="PowerEdge R750", serial="7XK1MN3"),
        "nics": [
            NetworkInterface(id="NIC.Integrated.1-1-1", mac=MAC1.upper(), speed_mbps=25000),
            NetworkInterface(id="NIC.Integrated.1-2-1", mac=MAC2, permanent_mac=MAC2, speed_mbps=0),
            NetworkInterface(id="3", mac=MAC3, speed_mbps=1000),
            NetworkInterface(id="ToManager", mac="0a:8f:c3:a5:8a:71", host_interface=True),
            NetworkInterface(id="dup", mac=MAC1),  # the same port twice (a second Redfish view)
            NetworkInterface(id="nomac"),
        ],
        "drives": [
            Drive(id="Disk.Bay.0", name="Disk 0", model="Dell Ent NVMe P5600", serial="PHAB1",
                  size_gb=1600.3, protocol="NVMe", media_type="SSD"),
            Drive(id="Disk.Bay.1", name="Disk 1", model="ST2400MM0129", serial="WBN1",
                  size_gb=2400.5, protocol="SAS", media_type="HDD"),
        ],
        "gpus": [
            PcieDevice(id="0000:41:00.0", name="GH100", model="H100 PCIe", serial="GPU1", vendor_id="10de",
                       device_id="2331", manufacturer="NVIDIA", is_gpu=True),
            PcieDevice(id="0000:42:00.0", name="GH100", model="H100 PCIe", serial="GPU2", vendor_id="10de",
                       device_id="2331", manufacturer="NVIDIA", is_gpu=True),
        ],
    }  # fmt: skip
    return HardwareRecord.model_validate({**base, **kw})


def empty(**kw) -> DeviceState:
    return DeviceState(**{"id": 7, "name": "srv-1", "item_fields": FIELDS, **kw})


_ids = itertools.count(1000)


def applied(state: DeviceState, plan: Plan) -> DeviceState:
    """What NetBox holds once ``plan`` is carried out (as the adapter does it)."""
    ifaces = {i.id: i for i in state.interfaces}
    for new in plan.interfaces:
        n = next(_ids)
        ifaces[n] = ExistingInterface(n, new.name, (new.mac,), new.mac)
    for m in plan.macs:
        i = ifaces[m.interface_id]
        ifaces[i.id] = ExistingInterface(
            i.id, i.name, (*i.macs, m.mac), m.mac if m.primary else i.primary_mac
        )
    items = {i.id: i for i in state.items}
    roles = {"disk": "disk", "gpu": "gpu"}
    for new in plan.items:
        n = next(_ids)
        items[n] = ExistingItem(
            n,
            new.name,
            roles[new.kind],
            new.serial,
            new.part_id,
            new.description,
            True,
            dict(new.custom_fields),
        )
    for u in plan.updates:
        i = items[u.id]
        fields = dict(u.fields)
        cf = {**i.custom_fields, **fields.pop("custom_fields", {})}
        items[u.id] = dataclasses.replace(i, **fields, custom_fields=cf)
    return dataclasses.replace(
        state,
        serial=plan.device_serial or state.serial,
        interfaces=tuple(ifaces.values()),
        items=tuple(items.values()),
    )


# -- interfaces --------------------------------------------------------------------------------


def test_interface_names_types_and_which_nics_count():
    assert interface_name("1", "") == "nic1" and interface_name("NIC.Slot.5-1", "x") == "NIC.Slot.5-1"
    assert interface_name("", "eno1") == "eno1" and len(interface_name("x" * 80, "")) == 64
    nics = wanted_nics(rec())
    assert [(n.name, n.mac, n.type, n.speed_kbps) for n in nics] == [
        ("NIC.Integrated.1-1-1", MAC1, "25gbase-x-sfp28", 25_000_000),
        ("NIC.Integrated.1-2-1", MAC2, "other", None),  # speed 0: not reported
        ("nic3", MAC3, "1000base-t", 1_000_000),
    ]  # the BMC host link, a duplicate MAC and a NIC without MAC are no ports
    assert netbox_interface_type(100000) == "100gbase-x-qsfp28" and netbox_interface_type(None) == "other"


def test_a_new_device_gets_every_port_disk_and_gpu_and_its_serial():
    plan = plan_writeback(rec(), empty())
    assert plan.device_serial == "7XK1MN3"
    assert [(i.name, i.mac, i.type, i.speed_kbps) for i in plan.interfaces] == [
        ("NIC.Integrated.1-1-1", MAC1, "25gbase-x-sfp28", 25_000_000),
        ("NIC.Integrated.1-2-1", MAC2, "other", None),
        ("nic3", MAC3, "1000base-t", 1_000_000),
    ]
    items = [(i.kind, i.name, i.serial, i.part_id, i.description, dict(i.custom_fields)) for i in plan.items]
    assert items == [
        ("disk", "Disk 0", "PHAB1", "Dell Ent NVMe P5600", "1600.3 GB, NVMe, SSD", {"size_gb": 1600}),
        ("disk", "Disk 1", "WBN1", "ST2400MM0129", "2400.5 GB, SAS, HDD", {"size_gb": 2400}),
        # Same name twice: the serial tells them apart; `bus` is no custom field of this NetBox.
        ("gpu", "GH100 GPU1", "GPU1", "H100 PCIe", "NVIDIA, PCI 0000:41:00.0, id 10de:2331",
         {"pci_address": "0000:41:00.0"}),
        ("gpu", "GH100 GPU2", "GPU2", "H100 PCIe", "NVIDIA, PCI 0000:42:00.0, id 10de:2331",
         {"pci_address": "0000:42:00.0"}),
    ]  # fmt: skip
    assert not plan.macs and not plan.updates and not plan.notes and not plan.empty
    assert plan.new_macs == [MAC1, MAC2, MAC3]


def test_written_twice_is_written_once():
    state = empty()
    first = plan_writeback(rec(), state)
    state = applied(state, first)
    again = plan_writeback(rec(inspected_at="2026-12-05T02:00:00+00:00"), state)
    assert again.empty and not again.notes and again.changes() == []
    assert again.unchanged == {"interfaces": 3, "disks": 2, "gpus": 2}
    comments = journal_comments(again, title="t", marker="m")
    assert "No change" in comments and "Already in NetBox: 3 interfaces, 2 disks, 2 gpus." in comments


def test_a_mac_goes_to_the_interface_of_its_name_and_a_mac_of_another_device_stays_there():
    state = empty(
        interfaces=(
            ExistingInterface(1, "NIC.Integrated.1-1-1"),  # no MAC yet: gets it, as primary
            ExistingInterface(2, "nic3", ("02:00:00:00:00:09",), "02:00:00:00:00:09"),  # keeps its primary
        ),
        macs_elsewhere={MAC2: "other-srv eth1"},
    )
    plan = plan_writeback(rec(), state)
    assert [(m.interface_id, m.mac, m.primary) for m in plan.macs] == [(1, MAC1, True), (2, MAC3, False)]
    assert plan.interfaces == []  # MAC2 is another device's: no interface made for it
    assert plan.notes == ["MAC b8:ce:f6:01:02:04 (NIC.Integrated.1-2-1) is on interface other-srv eth1 of "
                          "another device: left there"]  # fmt: skip
    assert journal_kind(plan) == "warning"
    assert "MAC b8:ce:f6:01:02:03 added to interface NIC.Integrated.1-1-1 (primary)" in plan.changes()


def test_ports_sharing_a_name_get_their_own_interfaces():
    same = [NetworkInterface(name="System Ethernet Interface", mac=m) for m in (MAC1, MAC2)]
    plan = plan_writeback(rec(nics=same), empty())
    assert [(i.name, i.mac) for i in plan.interfaces] == [
        ("System Ethernet Interface", MAC1),
        ("System Ethernet Interface-2", MAC2),
    ]
    # A MAC of this device on an interface of the port's name: the port's MAC is added, not primary.
    state = empty(interfaces=(ExistingInterface(1, "nic3", (MAC2,), MAC2),))
    plan = plan_writeback(rec(nics=[NetworkInterface(id="3", mac=MAC3)]), state)
    assert [(m.interface_id, m.mac, m.primary) for m in plan.macs] == [(1, MAC3, False)]


# -- disks and GPUs ----------------------------------------------------------------------------


def test_an_operators_item_gets_only_its_empty_fields_and_karios_items_are_kept_in_step():
    operator = ExistingItem(1, "nvme0", "disk", "PHAB1", part_id="P5600 custom", description="",
                            custom_fields={"size_gb": 1600})  # fmt: skip
    ours = ExistingItem(2, "Disk 1", "disk", "WBN1", part_id="old model", description="2400.5 GB, SAS, HDD",
                        discovered=True, custom_fields={"size_gb": 2000})  # fmt: skip
    roleless = ExistingItem(3, "gpu a", "", "GPU1", part_id="H100 PCIe")
    plan = plan_writeback(rec(), empty(items=(operator, ours, roleless)))
    updates = {u.id: dict(u.fields) for u in plan.updates}
    assert updates[1] == {"description": "1600.3 GB, NVMe, SSD"}  # its part number and size stay
    assert updates[2] == {"part_id": "ST2400MM0129", "custom_fields": {"size_gb": 2400}}
    assert updates[3] == {"description": "NVIDIA, PCI 0000:41:00.0, id 10de:2331", "role": "gpu",
                          "custom_fields": {"pci_address": "0000:41:00.0"}}  # fmt: skip
    assert [i.serial for i in plan.items] == ["GPU2"]
    assert "disk 'Disk 1' (serial WBN1) updated: custom_fields {size_gb: 2000} → {size_gb: 2400}, " \
           "part_id 'old model' → 'ST2400MM0129'" in plan.changes()  # fmt: skip


def test_a_part_modelled_as_a_module_is_not_added_again_and_names_stay_unique():
    state = empty(
        module_serials=frozenset({"phab1"}),  # that disk is a module in a drive bay
        items=(ExistingItem(1, "Disk 1", "disk", "OTHER", discovered=False),),  # the name, another part
    )
    plan = plan_writeback(rec(gpus=[]), state)
    assert [(i.name, i.serial) for i in plan.items] == [("Disk 1 (WBN1)", "WBN1")]
    assert plan.unchanged["disks"] == 1


def test_a_part_without_serial_is_matched_by_name_within_its_role():
    drives = [Drive(id="SimpleStorage/0", name="Disk 0", model="QEMU HARDDISK", size_gb=100.0,
                    source="SimpleStorage")]  # fmt: skip
    mine = ExistingItem(5, "Disk 0", "disk", "", "QEMU HARDDISK", "100 GB", True, {"size_gb": 100})
    other_role = ExistingItem(6, "Disk 0 psu", "psu", "")
    plan = plan_writeback(rec(drives=drives, gpus=[]), empty(items=(mine, other_role)))
    assert plan.items == [] and plan.unchanged["disks"] == 1 and plan.updates == []


def test_parts_gone_are_named_never_deleted_unless_the_collection_was_not_read():
    gone = ExistingItem(9, "Disk 7", "disk", "OLD7", discovered=True)
    operators = ExistingItem(10, "spare", "disk", "SPARE")  # the operator's: never reported on
    plan = plan_writeback(rec(), empty(items=(gone, operators)))
    assert plan.notes == ["disk 'Disk 7' (serial OLD7) was not reported this time: left in NetBox"]
    unread = plan_writeback(rec(missing=["Storage: 503 Service Unavailable"]), empty(items=(gone,)))
    assert unread.notes == ["the disks were not (all) read: none is taken as gone"]
    text = journal_comments(unread, title="t", marker="m", missing=["Storage: 503 Service Unavailable"])
    assert "Left alone:" in text and "Not reported by the BMC:\n- Storage: 503 Service Unavailable" in text


# -- identity ----------------------------------------------------------------------------------


def test_a_record_of_another_machine_writes_nothing():
    plan = plan_writeback(rec(), empty(serial="ABCDEF1"))
    assert plan.conflict and plan.empty and plan.items == [] and plan.interfaces == []
    assert "serial 7XK1MN3 but the NetBox device has serial ABCDEF1" in plan.conflict
    assert journal_kind(plan) == "warning" and "Not written:" in journal_comments(plan, title="t", marker="m")
    assert identity_conflict("7xk1mn3", "7XK1MN3") == ""  # case does not make another machine
    assert identity_conflict("To Be Filled By O.E.M.", "7XK1MN3") == ""  # a placeholder is no serial


def test_a_placeholder_serial_is_not_written_to_the_device():
    plan = plan_writeback(rec(system=SystemInfo(serial="System Serial Number")), empty())
    assert plan.device_serial == "" and not plan.conflict


def test_the_journal_names_its_inspection():
    r = rec()
    assert inspection_marker(r) == "karios:inspection:10.0.0.5@2026-12-05T01:00:00+00:00"
    text = journal_comments(
        plan_writeback(r, empty()), title="Karios inspection", marker=inspection_marker(r)
    )
    assert text.startswith("**Karios inspection**\n\n`karios:inspection:10.0.0.5@")
    assert "- interface nic3 created (1000base-t, MAC c4:cb:e1:aa:bb:01)" in text
    assert "- disk 'Disk 0' created (serial PHAB1, Dell Ent NVMe P5600, 1600.3 GB, NVMe, SSD)" in text


# -- NetBox JSON in ----------------------------------------------------------------------------


def test_the_state_read_from_netbox_json():
    state = device_state(
        {"id": 7, "name": "srv-1", "serial": ""},
        [{"id": 1, "name": "eno1", "primary_mac_address": {"id": 3, "mac_address": "B8:CE:F6:01:02:03"},
          "mac_addresses": [{"id": 3, "mac_address": "B8:CE:F6:01:02:03"}, {"id": 4, "mac_address": MAC2}]}],
        [{"id": 5, "name": "nvme0", "role": {"slug": "disk"}, "serial": "S1", "discovered": True,
          "custom_fields": {"size_gb": None}}],
        [{"id": 6, "serial": "SSD9"}, {"id": 8, "serial": None}],
        [{"id": 1, "name": "eno1", "device": {"id": 7, "name": "srv-1"},
          "mac_addresses": [{"mac_address": MAC1}]},
         {"id": 2, "name": "eth0", "device": {"id": 9, "name": "other"}, "mac_address": MAC3}],
        ["size_gb"],
    )  # fmt: skip
    assert state.interfaces == (ExistingInterface(1, "eno1", (MAC1, MAC2), MAC1),)
    assert state.items[0].role == "disk" and state.items[0].discovered and state.module_serials == {"ssd9"}
    assert dict(state.macs_elsewhere) == {MAC3: "other eth0"}  # this device's own MAC is not "elsewhere"
    assert state.item_fields == {"size_gb"}


# -- the device of an adopted server -----------------------------------------------------------


def test_the_device_type_of_a_dmi_make_and_model():
    assert (
        manufacturer_name("Dell Inc.") == "Dell"
        and manufacturer_name("Super Micro Computer, Inc.") == "Supermicro"
    )
    assert (
        manufacturer_name("Acme  Servers") == "Acme Servers"
        and manufacturer_name("To be filled by O.E.M.") == ""
    )
    makers = [{"id": 1, "name": "DELL", "slug": "dell-emc"}, {"id": 2, "name": "Lenovo", "slug": "lenovo"}]
    assert pick_manufacturer("Dell", makers)["id"] == 1  # any case
    assert (
        pick_manufacturer("lenovo", [{"id": 2, "name": "Lenovo Group", "slug": "lenovo"}])["id"] == 2
    )  # slug
    assert pick_manufacturer("HPE", makers) is None
    types = [
        {"id": 10, "model": "PowerEdge R650", "slug": "dell-poweredge-r650", "part_number": ""},
        {"id": 11, "model": "R750 (custom)", "slug": "x", "part_number": "PowerEdge R750"},
        {"id": 12, "model": "Other", "slug": "dell-poweredge-r760", "part_number": ""},
    ]
    assert pick_device_type("Dell", "poweredge r650", types)["id"] == 10
    assert pick_device_type("Dell", "PowerEdge R750", types)["id"] == 11  # by part number
    assert pick_device_type("Dell", "PowerEdge R760", types)["id"] == 12  # by the slug Karios gives
    assert pick_device_type("Dell", "PowerEdge R860", types) is None
    assert device_type_slug("Dell", "PowerEdge R750") == "dell-poweredge-r750"


# -- retries and the bus answer ----------------------------------------------------------------


def test_which_failures_are_tried_again():
    assert retry_later(UpstreamError("cannot reach NetBox")) and retry_later(
        ServiceUnavailable("no provisioner")
    )
    assert not retry_later(UpstreamError("NetBox answered 400", details={"netbox_status": 400}))
    assert retry_later(UpstreamError("NetBox answered 503", details={"netbox_status": 503}))
    assert not retry_later(Forbidden("no write permission"))


@pytest.mark.parametrize("netbox", [False, True], ids=["file-inventory", "netbox-write-back-off"])
async def test_with_the_write_back_off_the_request_answers_why(netbox):
    settings = KariosSettings(
        _env_file=None,  # type: ignore[call-arg]
        dev_mode=True,
        nats_url="nats://127.0.0.1:1",
        bus_prefix="unit",
        log_json=False,
        inventory_file=None,
        netbox_url="http://127.0.0.1:9" if netbox else "",
    )
    app = create_app(settings)
    bus = app.state.runtime.bus
    q = WriteBackDevice(device=NetboxDevice(name="srv-x"), hardware=rec(), source="abc")
    async with TestNatsBroker(bus.broker) as br:
        msg = await br.request(
            wrap(q, source="test").model_dump_json(), bus.subjects.request("inventory", "write_back_device")
        )
    reply = Reply.model_validate_json(msg.body)
    assert reply.ok and reply.result["written"] is False and reply.result["device_id"] is None
    assert "KARIOS_INVENTORY_WRITEBACK" in reply.result["reason"]


# -- the adapter's get-or-create ---------------------------------------------------------------


class _Roles:
    """``dcim.inventory_item_roles`` of a NetBox; ``race``: another replica creates first."""

    def __init__(self, race: bool = False) -> None:
        self.rows: list[dict] = []
        self.race, self.creates = race, 0

    def create(self, body: dict) -> dict:
        self.creates += 1
        row = {"id": 100 + len(self.rows), **body}
        self.rows.append(row)
        if self.race:
            raise UpstreamError("NetBox answered 400: slug already exists", details={"netbox_status": 400})
        return row


class _Store:
    def __init__(self, roles: _Roles) -> None:
        self.api = type("Api", (), {"dcim": type("Dcim", (), {"inventory_item_roles": roles})()})()

    async def rows(self, what, endpoint, **filters):  # type: ignore[no-untyped-def]
        return [r for r in endpoint.rows if all(r.get(k) == v for k, v in filters.items())]

    async def call(self, what, fn, *, write=False, needs=""):  # type: ignore[no-untyped-def]
        return fn()


@pytest.mark.parametrize("race", [False, True], ids=["missing", "made-meanwhile"])
async def test_the_disk_and_gpu_roles_are_created_once_when_netbox_has_none(race):
    roles = _Roles(race=race)
    writer = NetBoxWriter(_Store(roles), disk_role="disk", gpu_role="gpu")  # type: ignore[arg-type]
    assert await writer._roles() == {"disk": 100, "gpu": 101}
    assert await writer._roles() == {"disk": 100, "gpu": 101} and roles.creates == 2  # then cached
    assert [(r["name"], r["slug"]) for r in roles.rows] == [("Disk", "disk"), ("GPU", "gpu")]
