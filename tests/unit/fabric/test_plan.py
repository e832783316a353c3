"""The planner: sizing, suggestions, risks, and a plan_hash stable over the canonical plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from karios.common.contracts.fabric import FabricPlanRequest
from karios.common.errors import ValidationFailed
from karios.fabric_worker.config.plan import plan_fabric

BASE = {"fabric_switch_nos": "eos", "management_cidr": "192.168.111.0/24", "vxlan_mtu": 9216}


def plan(**kw):
    return plan_fabric(FabricPlanRequest(**{**BASE, **kw}))


requests = st.builds(
    FabricPlanRequest,
    fabric_switch_nos=st.sampled_from(["sonic", "cumulus", "nxos", "eos", "other"]),
    management_cidr=st.sampled_from(["192.168.111.0/24", "172.16.0.0/16", "10.10.0.0/20"]),
    vxlan_mtu=st.integers(1330, 9216),
    expected_nodes=st.integers(0, 1000),
    expected_vms=st.integers(0, 10000),
    local_as=st.sampled_from([0, 65000, 4_200_000_000]),
    fabric_switch_as=st.sampled_from([0, 65000, 65100]),
    underlay_mode=st.sampled_from(["", "ospf", "bgp"]),
    external_route_reflector=st.booleans(),
    bfd_enabled=st.booleans(),
    public_mtu=st.sampled_from([1500, 9000]),
    fabric_switch_role=st.sampled_from(["", "leaf", "spine", "border-leaf"]),
)


@settings(max_examples=60, deadline=None)
@given(requests)
def test_same_input_same_plan_hash_and_hash_covers_the_plan(req):
    try:
        first = plan_fabric(req)
    except ValidationFailed:
        return
    second = plan_fabric(FabricPlanRequest.model_validate(req.model_dump()))
    assert first.plan_hash == second.plan_hash and first == second
    changed = plan_fabric(req.model_copy(update={"vxlan_mtu": 9216 if req.vxlan_mtu != 9216 else 9000}))
    assert changed.plan_hash != first.plan_hash
    if req.expected_nodes:
        assert first.vtep_capacity >= req.expected_nodes  # auto-sizing always fits


def test_operator_prefix_is_honoured_verbatim_and_shortfall_is_a_risk():
    p = plan(expected_nodes=400, router_id_prefix_len=24, public_mtu=1500)
    assert p.config.router_id_prefix_len == 24 and p.vtep_capacity == 253
    assert any("fewer than expected_nodes" in r for r in p.risks)


def test_auto_sizing_and_suggestions():
    p = plan(expected_nodes=300, public_mtu=1500)
    assert p.config.router_id_prefix_len == 23 and p.config.router_id_base == "10.255.0.0"
    assert p.config.as_ == 65000 and p.config.fabric_switch_as == 65000 and p.bgp_mode == "ibgp"
    assert p.config.fabric_switch_peering_ip == "10.255.1.254"
    assert p.deployment_mode == "dc"
    assert any("fabric_switch_as suggested" in n for n in p.notes)


def test_bgp_underlay_suggests_a_management_address_and_disables_ospf():
    p = plan(underlay_mode="bgp", expected_nodes=8)
    assert p.config.ospf_enabled is False and p.config.fabric_switch_peering_ip == "192.168.111.254"
    assert p.deployment_mode == "cube" and p.config.public_mtu == 0
    assert any("underlay bgp" in n for n in p.notes)


def test_small_headroom_mtu_and_ebgp_risks():
    p = plan(
        expected_nodes=250,
        router_id_prefix_len=24,
        vxlan_mtu=1500,
        fabric_switch_as=65100,
        local_as=65000,
        public_mtu=1500,
        deployment_mode="dc",
    )
    text = " | ".join(p.risks)
    assert "headroom" in text and "1450 bytes for tenant frames" in text and "eBGP" in text
    assert "public_mtu 1500 exceeds the tenant MTU 1450" in text


def test_vni_range_grows_with_expected_vms():
    assert (plan().vni_start, plan().vni_end) == (10000, 14095)
    assert plan(expected_vms=10000).vni_end == 10000 + 16384 - 1


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"fabric_switch_nos": ""}, "fabric_switch_nos"),
        ({"fabric_switch_nos": "junos"}, "fabric_switch_nos"),
        ({"management_cidr": ""}, "management_cidr"),
        ({"management_cidr": "300.1.1.0/24"}, "management_cidr"),
        ({"vxlan_mtu": 0}, "vxlan_mtu"),
        ({"vxlan_mtu": 9999}, "vxlan_mtu"),
        ({"underlay_mode": "isis"}, "underlay_mode"),
        ({"deployment_mode": "dc"}, "public_mtu"),
        ({"expected_nodes": 1001}, "expected_nodes"),
        ({"local_as": 23456}, "local_as"),
        ({"router_id_prefix_len": 31}, "router_id_prefix_len"),
        ({"router_id_base": "192.168.111.0"}, "router_id_base"),
    ],
)
def test_plan_rejects_bad_input_naming_the_field(patch, field):
    with pytest.raises(ValidationFailed) as exc:
        plan(**patch)
    assert exc.value.field == field
