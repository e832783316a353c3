"""NetBox change log → DeviceChanged (pure core), the follower's cursor, and the config-context
mapping of users, keys and the gateway. Records are shaped as NetBox 4.7.3's
``/api/core/object-changes/`` answers them (snapshots carry foreign keys as bare ids)."""

from __future__ import annotations

from karios.common.contracts.inventory import DeviceChanged
from karios.inventory.changelog import ChangeLogFollower, affected_by, events_for
from karios.inventory.context import network_from_context, users_from_context
from karios.inventory.mapping import host_from_netbox


def change(cid: int, kind: str, obj_id: int, post: dict | None = None, pre: dict | None = None, nested=None):
    return {
        "id": cid,
        "changed_object_type": kind,
        "changed_object_id": obj_id,
        "changed_object": nested,
        "postchange_data": post,
        "prechange_data": pre,
    }


DEVICE = change(23, "dcim.device", 7, {"name": "web-1", "platform": 2}, {"name": "web-1", "platform": 1})
IFACE = change(
    24,
    "dcim.interface",
    70,
    {"device": 8, "name": "eno1"},
    nested={"id": 70, "device": {"id": 8, "name": "web-2"}},
)
ITEM_DELETED = change(25, "dcim.inventoryitem", 5, None, {"device": 9, "name": "nvme0"})
MAC = change(26, "dcim.macaddress", 3, {"mac_address": "02:B0:6C:42:BA:00", "assigned_object_id": 70})
IP = change(
    27, "ipam.ipaddress", 4, {"address": "10.0.0.5/24", "assigned_object_type": 8, "assigned_object_id": 71}
)
CONTEXT = change(28, "extras.configcontext", 1, {"data": {"karios": {}}})
MODULE_TYPE = change(29, "dcim.moduletype", 2, {"attributes": {"size": 960}})
UNTRACKED = change(30, "tenancy.tenant", 1, {"name": "t"})


def test_device_children_mac_and_ip_map_to_devices_deduplicated():
    affected = affected_by([DEVICE, IFACE, ITEM_DELETED, MAC, IP, UNTRACKED, DEVICE])
    assert affected.devices == {7: "web-1", 8: "web-2", 9: ""}
    assert affected.macs == {"02:b0:6c:42:ba:00"} and affected.interfaces == {71}
    assert not affected.everything
    events = events_for(affected, {71: (10, "web-3")})
    assert [(e.device_id, e.name, e.macs) for e in events] == [
        (7, "web-1", []),
        (8, "web-2", []),
        (9, "", []),
        (10, "web-3", []),
        (None, "", ["02:b0:6c:42:ba:00"]),
    ]


def test_config_contexts_and_module_types_drop_everything():
    for rec in (CONTEXT, MODULE_TYPE):
        assert events_for(affected_by([DEVICE, rec]), {}) == [DeviceChanged()]


def test_an_ip_whose_interface_is_gone_drops_everything():
    assert events_for(affected_by([IP]), {}) == [DeviceChanged()]


def test_untracked_objects_make_no_event():
    assert events_for(affected_by([UNTRACKED]), {}) == []


class Source:
    """The three change-log reads over a list of records (the follower's I/O edge)."""

    def __init__(self, records: list[dict]) -> None:
        self.records = records
        self.reads: list[int] = []

    async def latest_change_id(self) -> int:
        return max((r["id"] for r in self.records), default=0)

    async def changes_after(self, cursor: int, limit: int = 500) -> list[dict]:
        self.reads.append(cursor)
        return [r for r in sorted(self.records, key=lambda r: r["id"]) if r["id"] > cursor][:limit]

    async def devices_of_interfaces(self, ids: list[int]) -> dict[int, tuple[int, str]]:
        return {}


async def test_follower_starts_at_the_newest_record_drops_everything_once_then_follows():
    source = Source([DEVICE])
    seen: list[DeviceChanged] = []

    async def emit(evt: DeviceChanged) -> None:
        seen.append(evt)

    follower = ChangeLogFollower(source, emit, interval=0.01, batch=2)
    assert await follower.tick() == 1 and seen == [DeviceChanged()] and follower.cursor == 23
    assert await follower.tick() == 0  # nothing new: the old record is not replayed
    source.records += [IFACE, ITEM_DELETED, change(31, "dcim.device", 12, {"name": "db-1"})]
    seen.clear()
    assert await follower.tick() == 3  # two pages of two (batch=2) in one tick
    assert [e.device_id for e in seen] == [8, 9, 12] and follower.cursor == 31
    assert source.reads[-2:] == [23, 25]


def test_users_and_network_from_the_config_context():
    ctx = {
        "karios": {
            "users": [
                {
                    "name": "ops",
                    "ssh_authorized_keys": ["ssh-ed25519 AAAA ops", 'bad "quote"', 7],
                    "sudo": True,
                },
                {"name": "Bad Name"},
                {"name": "x", "password_hash": "has space"},
                "not a mapping",
                {"name": "dev", "password_hash": "$6$s$h", "shell": "/bin/bash"},
            ],
            "network": {"gateway": "10.0.0.254", "nameservers": ["10.0.0.53", ""]},
        }
    }
    users = users_from_context(ctx)
    assert [(u.name, u.ssh_authorized_keys, u.sudo, u.password_hash) for u in users] == [
        ("ops", ["ssh-ed25519 AAAA ops"], True, ""),
        ("dev", [], False, "$6$s$h"),
    ]
    assert network_from_context(ctx) == ("10.0.0.254", ["10.0.0.53"])
    assert users_from_context({}) == [] and network_from_context(None) == ("", [])


def test_host_from_netbox_carries_users_and_gateway_from_the_rendered_context():
    device = {
        "id": 7,
        "name": "web-1",
        "primary_ip4": {"address": "10.0.0.5/24"},
        "config_context": {"karios": {"users": [{"name": "ops"}], "network": {"gateway": "10.0.0.254"}}},
    }
    host = host_from_netbox(device, [])
    assert [u.name for u in host.users] == ["ops"] and host.ipv4_gateway == "10.0.0.254"
    assert host_from_netbox({"id": 1, "name": "n"}, []).users == []
