"""Validation matrix: every rule has a passing and a failing case, and names its field."""

from __future__ import annotations

import pytest

from karios.common.contracts.fabric import FabricConfigFields, FabricConfigInput
from karios.common.errors import ValidationFailed
from karios.fabric_worker.config import rules
from karios.fabric_worker.config.rules import RuleContext

GOOD = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_nos": "eos",
    "fabric_switch_peering_ip": "10.255.0.254",
    "fabric_switch_role": "leaf",
    "management_cidr": "192.168.111.0/24",
    "router_id_base": "10.255.0.1",
    "router_id_prefix_len": 24,
    "vxlan_mtu": 9216,
}
KEYED = RuleContext(ospf_auth_key_set=True, ospf_auth_key_len=8)
MD5 = {"ospf_auth_type": "message-digest", "ospf_fabric_interface": "eth1", "ospf_auth_key_id": 1}
HMAC = {**MD5, "ospf_auth_type": "hmac-sha-256"}

# (rule, passing patch, passing context, failing patch, failing context, field)
MATRIX = [
    (
        "expected_nodes range",
        {"expected_nodes": 1000},
        None,
        {"expected_nodes": 1001},
        None,
        "expected_nodes",
    ),
    ("expected_nodes unset ok", {"expected_nodes": 0}, None, {"expected_nodes": -1}, None, "expected_nodes"),
    ("expected_vms range", {"expected_vms": 10000}, None, {"expected_vms": 10001}, None, "expected_vms"),
    ("as 4-byte", {"as": 4_200_000_000, "fabric_switch_as": 0}, None, {"as": 4_294_967_296}, None, "as"),
    ("as 2-byte, not AS_TRANS", {"as": 64512, "fabric_switch_as": 0}, None, {"as": 23456}, None, "as"),
    ("as required", {"as": 1, "fabric_switch_as": 0}, None, {"as": 0}, None, "as"),
    (
        "fabric_switch_as",
        {"fabric_switch_as": 65001},
        None,
        {"fabric_switch_as": -5},
        None,
        "fabric_switch_as",
    ),
    (
        "management_cidr",
        {"management_cidr": "10.0.0.0/16"},
        None,
        {"management_cidr": "10.0.0/16"},
        None,
        "management_cidr",
    ),
    (
        "peering ip",
        {"fabric_switch_peering_ip": "10.0.9.1"},
        None,
        {"fabric_switch_peering_ip": "10.0.9"},
        None,
        "fabric_switch_peering_ip",
    ),
    (
        "router_id_base",
        {"router_id_base": "10.255.0.0"},
        None,
        {"router_id_base": "10.255.0.300"},
        None,
        "router_id_base",
    ),
    (
        "router_id_prefix_len",
        {"router_id_prefix_len": 30},
        None,
        {"router_id_prefix_len": 31},
        None,
        "router_id_prefix_len",
    ),
    ("pool and prefix together", {}, None, {"router_id_prefix_len": 0}, None, "router_id_prefix_len"),
    (
        "pool vs management",
        {"router_id_base": "10.254.0.1"},
        None,
        {"router_id_base": "192.168.111.1"},
        None,
        "router_id_base",
    ),
    (
        "fabric_switch_nos",
        {"fabric_switch_nos": "cumulus"},
        None,
        {"fabric_switch_nos": "junos"},
        None,
        "fabric_switch_nos",
    ),
    (
        "fabric_switch_role",
        {"fabric_switch_role": "border-leaf"},
        None,
        {"fabric_switch_role": "core"},
        None,
        "fabric_switch_role",
    ),
    (
        "external RR needs peering ip",
        {"external_route_reflector": True},
        None,
        {"external_route_reflector": True, "fabric_switch_peering_ip": ""},
        None,
        "fabric_switch_peering_ip",
    ),
    (
        "external RR needs switch AS",
        {"external_route_reflector": True},
        None,
        {"external_route_reflector": True, "fabric_switch_as": 0},
        None,
        "fabric_switch_as",
    ),
    (
        "external RR needs EVPN NOS",
        {"external_route_reflector": True, "fabric_switch_nos": "sonic"},
        None,
        {"external_route_reflector": True, "fabric_switch_nos": "other"},
        None,
        "fabric_switch_nos",
    ),
    (
        "external RR needs iBGP",
        {"external_route_reflector": True},
        None,
        {"external_route_reflector": True, "fabric_switch_as": 65001},
        None,
        "fabric_switch_as",
    ),
    (
        "ospf_auth_type values",
        {"ospf_auth_type": "none"},
        None,
        {"ospf_auth_type": "md5"},
        None,
        "ospf_auth_type",
    ),
    (
        "auth needs interface",
        MD5,
        KEYED,
        {**MD5, "ospf_fabric_interface": ""},
        KEYED,
        "ospf_fabric_interface",
    ),
    ("auth needs a key", MD5, KEYED, MD5, RuleContext(), "ospf_auth_key"),
    (
        "md5 key length",
        MD5,
        KEYED,
        MD5,
        RuleContext(ospf_auth_key_set=True, ospf_auth_key_len=17),
        "ospf_auth_key",
    ),
    ("auth key id", MD5, KEYED, {**MD5, "ospf_auth_key_id": 256}, KEYED, "ospf_auth_key_id"),
    (
        "hmac needs probe true",
        HMAC,
        RuleContext(frr_hmac_sha_capable=True, ospf_auth_key_set=True),
        HMAC,
        KEYED,
        "ospf_auth_type",
    ),
    (
        "hmac probed false",
        HMAC,
        RuleContext(frr_hmac_sha_capable=True, ospf_auth_key_set=True),
        HMAC,
        RuleContext(frr_hmac_sha_capable=False, ospf_auth_key_set=True),
        "ospf_auth_type",
    ),
    ("ospf_area", {"ospf_area": "0.0.0.1"}, None, {"ospf_area": "backbone"}, None, "ospf_area"),
    ("ospf_area integer", {"ospf_area": "10"}, None, {"ospf_area": "-1"}, None, "ospf_area"),
    ("ospf_area long integer", {"ospf_area": "4294967295"}, None, {"ospf_area": "9" * 15}, None, "ospf_area"),
    (
        "key id without auth",
        {"ospf_auth_key_id": 0},
        None,
        {"ospf_auth_key_id": 10**100},
        None,
        "ospf_auth_key_id",
    ),
    (
        "hello range",
        {"ospf_hello_interval": 1},
        None,
        {"ospf_hello_interval": 70000},
        None,
        "ospf_hello_interval",
    ),
    (
        "dead > hello",
        {"ospf_hello_interval": 2, "ospf_dead_interval": 8},
        None,
        {"ospf_hello_interval": 10, "ospf_dead_interval": 10},
        None,
        "ospf_dead_interval",
    ),
    (
        "auto ref bw",
        {"ospf_auto_ref_bw": 100000},
        None,
        {"ospf_auto_ref_bw": 5_000_000},
        None,
        "ospf_auto_ref_bw",
    ),
    (
        "interface name",
        {"ospf_fabric_interface": "enp65s0f1"},
        None,
        {"ospf_fabric_interface": "eth 1"},
        None,
        "ospf_fabric_interface",
    ),
    (
        "bgp password length",
        {},
        RuleContext(bgp_password_set=True, bgp_password_len=80),
        {},
        RuleContext(bgp_password_set=True, bgp_password_len=81),
        "bgp_password",
    ),
    ("vxlan_mtu max", {"vxlan_mtu": 9216}, None, {"vxlan_mtu": 9217}, None, "vxlan_mtu"),
    ("vxlan_mtu leaves room for overhead", {"vxlan_mtu": 1330}, None, {"vxlan_mtu": 1329}, None, "vxlan_mtu"),
    ("vxlan_mtu unset ok", {"vxlan_mtu": 0}, None, {"vxlan_mtu": 100}, None, "vxlan_mtu"),
    (
        "MTU drift",
        {"vxlan_mtu": 9000},
        RuleContext(underlay_mtu=9000),
        {"vxlan_mtu": 9216},
        RuleContext(underlay_mtu=9000),
        "vxlan_mtu",
    ),
    ("public_mtu", {"public_mtu": 1500}, None, {"public_mtu": 10000}, None, "public_mtu"),
]


@pytest.mark.parametrize(
    ("name", "good", "good_ctx", "bad", "bad_ctx", "field"), MATRIX, ids=[m[0] for m in MATRIX]
)
def test_rule_accepts_the_good_case_and_rejects_the_bad_one_naming_the_field(
    name, good, good_ctx, bad, bad_ctx, field
):
    rules.check(FabricConfigFields.model_validate({**GOOD, **good}), good_ctx or RuleContext())
    with pytest.raises(ValidationFailed) as exc:
        rules.check(FabricConfigFields.model_validate({**GOOD, **bad}), bad_ctx or RuleContext())
    assert exc.value.field == field, str(exc.value)
    assert str(exc.value).startswith(f"{field}: ")


def test_every_violation_is_listed_in_details():
    cfg = FabricConfigFields.model_validate({**GOOD, "expected_nodes": 5000, "vxlan_mtu": 20000})
    with pytest.raises(ValidationFailed) as exc:
        rules.check(cfg, RuleContext())
    assert [d["field"] for d in exc.value.details] == ["expected_nodes", "vxlan_mtu"]


def test_legacy_row_without_sizing_hints_is_accepted():
    rules.check(
        FabricConfigFields.model_validate({**GOOD, "expected_nodes": 0, "expected_vms": 0}), RuleContext()
    )


def test_bgp_mode_is_derived_from_the_two_asns():
    assert rules.bgp_mode(FabricConfigFields.model_validate(GOOD)) == "ibgp"
    assert rules.bgp_mode(FabricConfigFields.model_validate({**GOOD, "fabric_switch_as": 0})) == "ibgp"
    assert rules.bgp_mode(FabricConfigFields.model_validate({**GOOD, "fabric_switch_as": 65100})) == "ebgp"


def test_merge_decodes_router_id_cidr_and_keeps_unsent_fields():
    stored = FabricConfigFields.model_validate(GOOD)
    inp = FabricConfigInput.model_validate({"router_id_cidr": "10.254.4.1/22", "vxlan_mtu": 9000})
    merged = rules.merge(stored, inp, {"router_id_cidr", "vxlan_mtu"})
    assert (merged.router_id_base, merged.router_id_prefix_len) == ("10.254.4.1", 22)
    assert merged.vxlan_mtu == 9000 and merged.fabric_switch_nos == "eos"
    assert rules.encode_router_id_cidr(merged.router_id_base, merged.router_id_prefix_len) == "10.254.4.1/22"


@pytest.mark.parametrize("cidr", ["10.254.0.1", "10.254.0.1/33", "nope/24", "2001:db8::1/64"])
def test_merge_refuses_a_bad_router_id_cidr(cidr):
    inp = FabricConfigInput.model_validate({"router_id_cidr": cidr})
    with pytest.raises(ValidationFailed) as exc:
        rules.merge(None, inp, {"router_id_cidr"})
    assert exc.value.field == "router_id_cidr"


def test_merge_refuses_router_id_cidr_that_contradicts_base():
    inp = FabricConfigInput.model_validate({"router_id_cidr": "10.254.0.1/24", "router_id_base": "10.9.0.1"})
    with pytest.raises(ValidationFailed) as exc:
        rules.merge(None, inp, {"router_id_cidr", "router_id_base"})
    assert exc.value.field == "router_id_cidr"
