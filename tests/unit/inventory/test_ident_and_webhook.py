"""MAC notations, ident parsing, and NetBox webhook signatures/payloads."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from karios.common.errors import ValidationFailed
from karios.inventory.store import parse_ident
from karios.inventory.webhook import device_changed_from_webhook, sign, signature_valid


@pytest.mark.parametrize(
    "notation",
    ["aa:bb:cc:dd:ee:ff", "AA-BB-CC-DD-EE-FF", "aabb.ccdd.eeff", "AABBCCDDEEFF", " Aa:Bb:cC:dd:EE:ff "],
)
def test_every_mac_notation_is_the_same_lookup(notation):
    ident = parse_ident(mac=notation)
    assert ident.field == "mac" and ident.value == "aa:bb:cc:dd:ee:ff"
    assert ident.key == "mac:aa:bb:cc:dd:ee:ff"


def test_ident_reads_a_mac_or_else_a_name():
    assert parse_ident(ident="AABB.CCDD.EEFF").field == "mac"
    assert parse_ident(ident="node-01") == parse_ident(name="node-01")
    assert parse_ident(ident="node-01").value == "node-01"


@pytest.mark.parametrize("kwargs", [{"mac": "zz:bb:cc:dd:ee:ff"}, {"mac": "aa:bb"}, {}, {"name": "  "}])
def test_bad_or_missing_ident_is_a_422_naming_the_field(kwargs):
    with pytest.raises(ValidationFailed) as err:
        parse_ident(**kwargs)
    assert err.value.field == "mac" and err.value.http_status == 422


SECRET = "webhook-s3cret"


def test_signature_is_netbox_hmac_sha512_hex_of_the_exact_body():
    body = b'{"event": "updated", "object_type": "dcim.device"}'
    expected = hmac.new(SECRET.encode(), body, hashlib.sha512).hexdigest()
    assert sign(body, SECRET) == expected
    assert signature_valid(body, expected, SECRET)
    assert signature_valid(body, expected.upper(), SECRET)


@pytest.mark.parametrize(
    ("body", "sig", "secret"),
    [
        (b"{}", None, SECRET),  # no header
        (b"{}", "", SECRET),
        (b"{}", sign(b"{} ", SECRET), SECRET),  # body changed by one byte
        (b"{}", sign(b"{}", "other"), SECRET),  # wrong secret
        (b"{}", sign(b"{}", SECRET)[:-2], SECRET),  # truncated
        (b"{}", sign(b"{}", ""), ""),  # receiver without secret accepts nothing
    ],
)
def test_signature_rejected(body, sig, secret):
    assert not signature_valid(body, sig, secret)


def test_device_update_names_the_device():
    evt = device_changed_from_webhook(
        {"event": "updated", "object_type": "dcim.device", "data": {"id": 12, "name": "node-01"}}
    )
    assert evt is not None and evt.device_id == 12 and evt.name == "node-01" and evt.macs == []


def test_interface_change_names_its_device_and_old_and_new_macs():
    payload = {
        "event": "updated",
        "object_type": "dcim.interface",
        "data": {
            "id": 5,
            "name": "eno1",
            "device": {"id": 12, "name": "node-01"},
            "mac_address": "AA:BB:CC:00:00:02",
            "mac_addresses": [
                {"id": 1, "mac_address": "AA:BB:CC:00:00:01"},
                {"id": 2, "mac_address": "AA:BB:CC:00:00:02"},
            ],
        },
        "snapshots": {"prechange": {"device": 12, "mac_address": "AA:BB:CC:00:00:09"}, "postchange": {}},
    }
    evt = device_changed_from_webhook(json.loads(json.dumps(payload)))
    assert evt is not None and evt.device_id == 12 and evt.name == "node-01"
    assert set(evt.macs) == {"aa:bb:cc:00:00:01", "aa:bb:cc:00:00:02", "aa:bb:cc:00:00:09"}


def test_mac_object_and_inventory_item_changes_reach_their_device():
    mac_evt = device_changed_from_webhook(
        {
            "event": "created",
            "object_type": "dcim.macaddress",
            "data": {
                "mac_address": "AA:BB:CC:00:00:03",
                "assigned_object_type": "dcim.interface",
                "assigned_object": {"id": 5, "name": "eno1", "device": {"id": 12, "name": "node-01"}},
            },
        }
    )
    assert mac_evt is not None and mac_evt.device_id == 12 and mac_evt.macs == ["aa:bb:cc:00:00:03"]
    item_evt = device_changed_from_webhook(
        {
            "event": "deleted",
            "object_type": "dcim.inventoryitem",
            "data": {"id": 3, "name": "nvme0", "device": {"id": 12, "name": "node-01"}},
        }
    )
    assert item_evt is not None and item_evt.name == "node-01"


def test_objects_no_lookup_depends_on_are_ignored():
    assert (
        device_changed_from_webhook({"object_type": "tenancy.tenant", "data": {"id": 1, "name": "t"}}) is None
    )
    assert (
        device_changed_from_webhook({"object_type": "ipam.ipaddress", "data": {"address": "10.0.0.1/24"}})
        is None
    )
    assert device_changed_from_webhook({}) is None


def test_module_types_and_config_contexts_drop_every_cache_entry():
    for kind in ("dcim.moduletype", "extras.configcontext", "dcim.platform", "dcim.site"):
        evt = device_changed_from_webhook({"object_type": kind, "data": {"id": 1}})
        assert evt is not None and (evt.device_id, evt.name, evt.macs) == (None, "", [])
