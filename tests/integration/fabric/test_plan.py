"""POST /fabric-config/plan through the gateway: a dry run that writes nothing."""

from __future__ import annotations

from tests.fixtures.fabric import OPERATOR, VIEWER

PLAN = {
    "fabric_switch_nos": "nxos",
    "management_cidr": "192.168.111.0/24",
    "vxlan_mtu": 9216,
    "expected_nodes": 300,
    "public_mtu": 1500,
}


async def test_plan_is_a_dry_run_with_suggestions_and_the_switch_config(fabric):
    r = await fabric.client.post("/controlnode/fabric-config/plan", json=PLAN, headers=OPERATOR)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["config"]["router_id_prefix_len"] == 23 and plan["vtep_capacity"] >= 375
    assert plan["config"]["as"] == 65000 and plan["config"]["fabric_switch_as"] == 65000
    assert plan["deployment_mode"] == "dc" and len(plan["plan_hash"]) == 64
    assert "router bgp" not in plan["switch_config"]  # GW route reflector: switch carries the underlay only
    assert "feature ospf" in plan["switch_config"]
    assert any("single route reflector" in x for x in plan["risks"])
    again = (await fabric.client.post("/controlnode/fabric-config/plan", json=PLAN, headers=OPERATOR)).json()
    assert again["plan_hash"] == plan["plan_hash"]
    assert (await fabric.get()).status_code == 404  # nothing stored


async def test_plan_rejects_missing_fields_with_422_and_needs_operator(fabric):
    r = await fabric.client.post(
        "/controlnode/fabric-config/plan", json={**PLAN, "fabric_switch_nos": ""}, headers=OPERATOR
    )
    assert r.status_code == 422 and r.json()["field"] == "fabric_switch_nos"
    r = await fabric.client.post(
        "/controlnode/fabric-config/plan", json={**PLAN, "public_mtu": 0}, headers=OPERATOR
    )
    assert r.status_code == 422 and r.json()["field"] == "public_mtu"
    r = await fabric.client.post("/controlnode/fabric-config/plan", json=PLAN, headers=VIEWER)
    assert r.status_code == 403


async def test_endpoints_are_in_the_gateway_openapi(fabric):
    spec = (await fabric.client.get("/openapi.json")).json()
    paths = spec["paths"]
    assert set(paths["/controlnode/fabric-config"]) == {"get", "post", "delete"}
    assert "post" in paths["/controlnode/fabric-config/plan"]
    assert "get" in paths["/controlnode/fabric-config/vtep-pool"]
