"""Changing the switch configuration (here: moving its BGP listen range): 409 with switch
snippets → ack with the hash → stored and audited; no ack where nothing on the switch changes.
The snippets themselves are pasted on a real FRR "switch" in
tests/integration/fabric_rollout/test_switch_snippets_lab.py."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import BASE, OPERATOR, SWITCH_RR


async def _audit(settings, after: int = 0):
    """Audit rows with id > after (the log is durable: it outlives deleted configs and earlier tests)."""
    eng = create_async_engine(settings.database_url)
    async with eng.connect() as conn:
        rows = (
            (
                await conn.execute(
                    sa.text("SELECT * FROM fabric.switch_ack_audit WHERE id > :a ORDER BY id"), {"a": after}
                )
            )
            .mappings()
            .all()
        )
    await eng.dispose()
    return rows


async def _last_id(settings) -> int:
    rows = await _audit(settings)
    return rows[-1]["id"] if rows else 0


async def test_pool_move_needs_the_switch_ack_then_succeeds_and_is_audited(fabric, settings):
    assert (await fabric.post(SWITCH_RR, OPERATOR)).status_code == 201
    seen = await _last_id(settings)
    move = {"router_id_cidr": "10.254.0.1/23"}

    r = await fabric.post(move, OPERATOR)
    assert r.status_code == 409, r.text
    err = r.json()
    assert err["code"] == "REQUIRES_SWITCH_RECONFIG_ACK"
    details = err["details"]
    assert details["old_listen_range"] == "10.255.0.0/24" and details["new_listen_range"] == "10.254.0.0/23"
    by_nos = {s["nos"]: s for s in details["snippets"]}
    assert set(by_nos) == {"sonic", "cumulus", "nxos", "eos", "frr", "other"}
    eos = by_nos["eos"]
    assert "-   bgp listen range 10.255.0.0/24 peer-group KARIOS-VTEPS remote-as 65000" in eos["diff"]
    assert "+   bgp listen range 10.254.0.0/23 peer-group KARIOS-VTEPS remote-as 65000" in eos["diff"]
    assert details["switch_nos"] == "eos" and details["switch_snippet_hash"] == eos["switch_snippet_hash"]
    assert len(eos["switch_snippet_hash"]) == 64
    assert (await fabric.get()).json()["router_id_cidr"] == "10.255.0.1/24"  # nothing written

    # a wrong hash (here: the cumulus one while acking eos) is refused with a fresh 409
    wrong = {
        **move,
        "switch_acked": True,
        "acked_by": "olga",
        "switch_snippet_hash": by_nos["cumulus"]["switch_snippet_hash"],
    }
    r = await fabric.post(wrong, OPERATOR)
    assert r.status_code == 409 and r.json()["field"] == "switch_snippet_hash"

    # acking without acked_by is a 422
    r = await fabric.post(
        {**move, "switch_acked": True, "switch_snippet_hash": eos["switch_snippet_hash"]}, OPERATOR
    )
    assert r.status_code == 422 and r.json()["field"] == "acked_by"

    ok = {**move, "switch_acked": True, "acked_by": "olga", "switch_snippet_hash": eos["switch_snippet_hash"]}
    r = await fabric.post(ok, OPERATOR)
    assert r.status_code == 200, r.text
    assert r.json()["router_id_cidr"] == "10.254.0.1/23"
    audit = await _audit(settings, seen)
    assert len(audit) == 1
    a = audit[0]
    assert (a["acked_by"], a["caller"], a["caller_role"], a["switch_nos"]) == (
        "olga",
        "ops-olga",
        "operator",
        "eos",
    )
    assert a["switch_snippet_hash"] == eos["switch_snippet_hash"] and a["skipped"] is False
    assert (a["old_range"], a["new_range"]) == ("10.255.0.0/24", "10.254.0.0/23")

    # the hash of that move is stale for the next one
    r = await fabric.post(
        {"router_id_cidr": "10.253.0.1/24", **{k: ok[k] for k in ok if k != "router_id_cidr"}}, OPERATOR
    )
    assert r.status_code == 409


async def test_ack_for_another_nos_uses_that_nos_hash(fabric):
    await fabric.post(SWITCH_RR)
    r = await fabric.post({"router_id_cidr": "10.254.0.1/24"})
    sonic = next(s for s in r.json()["details"]["snippets"] if s["nos"] == "sonic")
    r = await fabric.post(
        {
            "router_id_cidr": "10.254.0.1/24",
            "switch_acked": True,
            "switch_nos": "sonic",
            "acked_by": "ann",
            "switch_snippet_hash": sonic["switch_snippet_hash"],
        }
    )
    assert r.status_code == 200, r.text


async def test_skip_switch_ack_is_honoured_for_fabric_admin_only(fabric, settings):
    await fabric.post(SWITCH_RR)
    seen = await _last_id(settings)
    r = await fabric.post({"router_id_cidr": "10.254.0.1/24", "skip_switch_ack": True}, OPERATOR)
    assert r.status_code == 409 and "fabric_admin" in r.json()["message"]
    r = await fabric.post({"router_id_cidr": "10.254.0.1/24", "skip_switch_ack": True}, ADMIN)
    assert r.status_code == 200, r.text
    audit = await _audit(settings, seen)
    assert len(audit) == 1 and audit[0]["skipped"] is True and audit[0]["caller_role"] == "fabric_admin"


async def test_unchanged_pool_and_first_post_need_no_ack(fabric, settings):
    seen = await _last_id(settings)
    await fabric.post(SWITCH_RR)
    r = await fabric.post({**SWITCH_RR, "expected_vms": 400})  # nothing on the switch changes
    assert r.status_code == 200
    assert await _audit(settings, seen) == []
    # The port MTU is configuration on EOS: any change of the switch configuration is gated.
    r = await fabric.post({**SWITCH_RR, "vxlan_mtu": 9000})
    assert r.status_code == 409 and r.json()["field"] == "vxlan_mtu", r.text
    assert r.json()["details"]["changed_fields"] == ["vxlan_mtu"]


async def test_no_ack_when_the_switch_runs_no_bgp(fabric, settings):
    """Route reflector on the gateway node (iBGP, no switch RR): the switch only carries the
    underlay, so a pool move changes nothing on it — and its allocations outside are released."""
    seen = await _last_id(settings)
    assert (await fabric.post(BASE)).status_code == 201
    r = await fabric.post({"router_id_cidr": "10.254.0.1/24", "fabric_switch_peering_ip": "10.254.0.254"})
    assert r.status_code == 200, r.text
    assert r.json()["router_id_cidr"] == "10.254.0.1/24"
    assert await _audit(settings, seen) == []


async def test_bgp_underlay_gates_the_management_subnet_not_the_pool(fabric, settings):
    """BGP underlay: the switch listens on the management subnet, so a pool move needs no ack;
    moving the management subnet does, with snippets naming the ranges the switch really has."""
    bgp = {**SWITCH_RR, "ospf_enabled": False, "fabric_switch_peering_ip": "192.168.111.254"}
    assert (await fabric.post(bgp)).status_code == 201
    seen = await _last_id(settings)
    r = await fabric.post({"router_id_cidr": "10.254.0.1/24"})
    assert r.status_code == 200, r.text
    assert await _audit(settings, seen) == []

    move = {"management_cidr": "192.168.110.0/23"}
    r = await fabric.post(move)
    assert r.status_code == 409, r.text
    err = r.json()
    assert err["field"] == "management_cidr" and "management subnet" in err["message"]
    details = err["details"]
    assert (details["old_listen_range"], details["new_listen_range"]) == (
        "192.168.111.0/24",
        "192.168.110.0/23",
    )
    other = next(s for s in details["snippets"] if s["nos"] == "other")
    assert other["snippet"] == (
        "interface swp1\n"
        " no ip address 192.168.111.254/24\n"
        " ip address 192.168.111.254/23\n"
        "exit\n"
        "router bgp 65000\n"
        " no bgp listen range 192.168.111.0/24 peer-group KARIOS-VTEPS\n"
        " bgp listen range 192.168.110.0/23 peer-group KARIOS-VTEPS\n"
        "exit\n"
    )
    ack = {**move, "switch_acked": True, "switch_nos": "other", "acked_by": "olga"}
    r = await fabric.post({**ack, "switch_snippet_hash": other["switch_snippet_hash"]})
    assert r.status_code == 200, r.text
    audit = await _audit(settings, seen)
    assert [(a["old_range"], a["new_range"]) for a in audit] == [("192.168.111.0/24", "192.168.110.0/23")]


async def test_a_bgp_password_change_is_gated_like_any_switch_change(fabric, settings):
    """The switch runs BGP (RR on the switch): setting, re-valuing and clearing the password each
    need the ack (the switch must be told; the rendered text only holds a placeholder), naming
    bgp_password; re-posting the same password does not."""
    assert (await fabric.post(SWITCH_RR, OPERATOR)).status_code == 201
    for change in (
        {"bgp_password": "first-secret-1"},
        {"bgp_password": "second-secret-2"},
        {"clear_bgp_password": True},
    ):
        r = await fabric.post(change, OPERATOR)
        assert r.status_code == 409, (change, r.text)
        err = r.json()
        assert err["field"] == "bgp_password" and err["details"]["changed_fields"] == ["bgp_password"]
        assert "secret" not in r.text  # the snippet carries a placeholder, never the value
        eos = next(s for s in err["details"]["snippets"] if s["nos"] == "eos")
        ack = {
            **change,
            "switch_acked": True,
            "switch_nos": "eos",
            "switch_snippet_hash": eos["switch_snippet_hash"],
            "acked_by": "netops",
        }
        assert (await fabric.post(ack, OPERATOR)).status_code == 200
    assert (await fabric.get()).json()["bgp_password_is_set"] is False
    assert (await fabric.post({"bgp_password": "third-secret-3"}, ADMIN)).status_code == 409
    r = await fabric.post({"bgp_password": "third-secret-3", "skip_switch_ack": True}, ADMIN)
    assert r.status_code == 200 and r.json()["bgp_password_is_set"] is True
    r = await fabric.post({"bgp_password": "third-secret-3"}, OPERATOR)  # the same value again
    assert r.status_code == 200, r.text
