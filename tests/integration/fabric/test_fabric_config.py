"""GET/POST/DELETE /controlnode/fabric-config against the real worker, NATS and PostgreSQL."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import BASE, OPERATOR, VIEWER

# These changes re-configure the switch (docs/fabric.md, ack gate); the tests here are about
# something else: the fabric_admin client skips the ack (tests/integration/fabric/test_ack_gate.py).
SKIP_ACK = {"skip_switch_ack": True}


async def _rows(settings, sql: str):
    eng = create_async_engine(settings.database_url)
    async with eng.connect() as conn:
        rows = (await conn.execute(sa.text(sql))).mappings().all()
    await eng.dispose()
    return rows


async def test_first_post_creates_then_get_returns_every_field_with_derived_ones(fabric):
    assert (await fabric.get()).status_code == 404
    r = await fabric.post(BASE)
    assert r.status_code == 201, r.text
    body = (await fabric.get(VIEWER)).json()
    assert body["as"] == 65000 and body["fabric_switch_nos"] == "eos"
    assert body["router_id_base"] == "10.255.0.1" and body["router_id_prefix_len"] == 24
    assert body["router_id_cidr"] == "10.255.0.1/24"
    assert body["bgp_mode"] == "ibgp"
    assert body["rollout_status"] == "pending"  # nothing rolled out yet
    assert body["physnet"] is None and body["last_job"] is None
    assert body["bgp_password_is_set"] is False and body["ospf_auth_key_is_set"] is False
    assert body["frr_hmac_sha_capable"] is None
    for field in (
        "advertise_all_vni",
        "bfd_enabled",
        "expected_nodes",
        "expected_vms",
        "external_route_reflector",
        "fabric_switch_as",
        "fabric_switch_name",
        "fabric_switch_peering_ip",
        "fabric_switch_role",
        "management_cidr",
        "ospf_area",
        "ospf_auth_key_id",
        "ospf_auth_type",
        "ospf_auto_ref_bw",
        "ospf_dead_interval",
        "ospf_enabled",
        "ospf_fabric_interface",
        "ospf_hello_interval",
        "public_mtu",
        "vxlan_mtu",
    ):
        assert field in body, field


async def test_second_post_updates_merging_unsent_fields_and_derives_ebgp(fabric):
    await fabric.post(BASE)
    r = await fabric.post({"fabric_switch_as": 65100, "vxlan_mtu": 9000, **SKIP_ACK})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["created"] is False and body["bgp_mode"] == "ebgp"
    assert body["vxlan_mtu"] == 9000 and body["fabric_switch_name"] == "leaf-01"  # kept


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"bgp_password": "two words"}, "bgp_password"),
        (
            {
                "ospf_auth_type": "message-digest",
                "ospf_fabric_interface": "eth1",
                "ospf_auth_key": "k\tey",
                "ospf_auth_key_id": 3,
            },
            "ospf_auth_key",
        ),
    ],
)
async def test_a_secret_with_whitespace_is_refused_at_once_naming_it(fabric, settings, extra, field):
    """FRR ends a key at whitespace: refused when stored, not at the next apply (found by fuzzing)."""
    before = await _rows(settings, "SELECT * FROM fabric.fabric_config")
    r = await fabric.post({**BASE, **extra})
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert "whitespace" in r.json()["message"] and "two words" not in r.text and "k\tey" not in r.text
    assert await _rows(settings, "SELECT * FROM fabric.fabric_config") == before  # nothing written


async def test_secrets_are_write_only_encrypted_and_never_logged(fabric, settings, caplog):
    caplog.set_level(logging.DEBUG)
    body = {
        **BASE,
        "bgp_password": "bgp-s3cret-pw",
        "ospf_auth_type": "message-digest",
        "ospf_fabric_interface": "eth1",
        "ospf_auth_key": "ospfK3y",
        "ospf_auth_key_id": 7,
    }
    r = await fabric.post(body)
    assert r.status_code == 201, r.text
    got = await fabric.get()
    for resp in (r, got):
        assert "s3cret" not in resp.text and "ospfK3y" not in resp.text
        assert resp.json()["bgp_password_is_set"] is True and resp.json()["ospf_auth_key_is_set"] is True
    row = (await _rows(settings, "SELECT * FROM fabric.fabric_config"))[0]
    assert row["bgp_password_enc"].startswith("v1:k1:") and "s3cret" not in row["bgp_password_enc"]
    assert "s3cret" not in str(row["data"]) and "ospfK3y" not in str(row["data"])
    assert "s3cret" not in caplog.text and "ospfK3y" not in caplog.text

    # empty input = unchanged
    r = await fabric.post({"bgp_password": "", "vxlan_mtu": 9100, **SKIP_ACK})
    assert r.json()["bgp_password_is_set"] is True
    # clear_* removes
    r = await fabric.post({"clear_bgp_password": True})
    assert r.status_code == 200 and r.json()["bgp_password_is_set"] is False
    assert r.json()["ospf_auth_key_is_set"] is True
    # a key the auth type needs cannot be cleared
    r = await fabric.post({"clear_ospf_auth_key": True})
    assert r.status_code == 422 and r.json()["field"] == "ospf_auth_key"


async def test_invalid_post_is_422_naming_the_field_and_writes_nothing(fabric, settings):
    await fabric.post(BASE)
    audit_before = await _rows(settings, "SELECT count(*) AS n FROM fabric.switch_ack_audit")
    before = (await fabric.get()).json()
    for patch, field in (
        ({"expected_nodes": 1001}, "expected_nodes"),
        ({"expected_vms": 10001}, "expected_vms"),
        ({"ospf_auth_type": "plaintext"}, "ospf_auth_type"),
        (
            {
                "ospf_auth_type": "hmac-sha-256",
                "ospf_fabric_interface": "eth1",
                "ospf_auth_key": "k",
                "ospf_auth_key_id": 1,
            },
            "ospf_auth_type",
        ),
        ({"external_route_reflector": True, "fabric_switch_nos": "other"}, "fabric_switch_nos"),
        ({"management_cidr": "192.168.111.0/33"}, "management_cidr"),
        ({"as": 23456}, "as"),
        ({"vxlan_mtu": 9300}, "vxlan_mtu"),
        ({"router_id_cidr": "10.255.0.1"}, "router_id_cidr"),
        ({"as": "not-a-number"}, "as"),
    ):
        r = await fabric.post(patch)
        assert r.status_code == 422, (patch, r.text)
        assert r.json()["field"] == field, (patch, r.json())
    after = (await fabric.get()).json()
    assert after == before
    assert await _rows(settings, "SELECT count(*) AS n FROM fabric.switch_ack_audit") == audit_before


async def test_mtu_drift_against_preflight_consensus_is_rejected(fabric, settings):
    await fabric.post(BASE)
    eng = create_async_engine(settings.database_url)
    async with eng.begin() as conn:  # what preflight records (preflight lands with the rollout issue)
        await conn.execute(
            sa.text("UPDATE fabric.fabric_config SET underlay_mtu = 9000, frr_hmac_sha_capable = true")
        )
    await eng.dispose()
    r = await fabric.post({"vxlan_mtu": 9216})
    assert r.status_code == 422 and r.json()["field"] == "vxlan_mtu" and "drift" in r.json()["message"]
    r = await fabric.post(
        {
            "vxlan_mtu": 9000,
            "ospf_auth_type": "hmac-sha-256",
            "ospf_fabric_interface": "eth1",
            "ospf_auth_key": "a-long-hmac-key",
            "ospf_auth_key_id": 3,
            **SKIP_ACK,
        }
    )
    assert r.status_code == 200, r.text
    assert r.json()["frr_hmac_sha_capable"] is True


async def test_rollout_status_pending_until_rolled_out_and_legacy_empty_reads_ready(fabric, settings):
    assert (await fabric.post(BASE)).json()["rollout_status"] == "pending"
    eng = create_async_engine(settings.database_url)
    async with eng.begin() as conn:  # a row predating the column, then one an apply made ready
        await conn.execute(sa.text("UPDATE fabric.fabric_config SET rollout_status = ''"))
    assert (await fabric.get()).json()["rollout_status"] == "ready"
    async with eng.begin() as conn:
        await conn.execute(sa.text("UPDATE fabric.fabric_config SET rollout_status = 'ready'"))
    # Re-posting the same values changes nothing on the nodes: still ready.
    assert (await fabric.post({"expected_nodes": BASE["expected_nodes"]})).json()["rollout_status"] == "ready"
    # A change the nodes do not run yet: pending again (a secret counts too).
    assert (await fabric.post({"bfd_enabled": False, **SKIP_ACK})).json()["rollout_status"] == "pending"
    async with eng.begin() as conn:
        await conn.execute(sa.text("UPDATE fabric.fabric_config SET rollout_status = 'ready'"))
    assert (await fabric.post({"bgp_password": "n3w-secret"})).json()["rollout_status"] == "pending"
    # failed/degraded stay (last_job keeps explaining them) until the next apply.
    async with eng.begin() as conn:
        await conn.execute(sa.text("UPDATE fabric.fabric_config SET rollout_status = 'failed'"))
    assert (await fabric.post({"bfd_enabled": True, **SKIP_ACK})).json()["rollout_status"] == "failed"
    await eng.dispose()


async def test_delete_is_hard_and_needs_fabric_admin(fabric, settings):
    await fabric.post(BASE)
    r = await fabric.client.delete("/controlnode/fabric-config", headers=OPERATOR)
    assert r.status_code == 403
    r = await fabric.client.delete("/controlnode/fabric-config", headers=ADMIN)
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert (await fabric.get()).status_code == 404
    assert await _rows(settings, "SELECT * FROM fabric.fabric_config") == []
    r = await fabric.client.delete("/controlnode/fabric-config", headers=ADMIN)
    assert r.status_code == 404


async def test_roles_viewer_reads_operator_writes(fabric):
    r = await fabric.post(BASE, headers=VIEWER)
    assert r.status_code == 403
    r = await fabric.post(BASE, headers=OPERATOR)
    assert r.status_code == 201
    r = await fabric.client.get("/controlnode/fabric-config")
    assert r.status_code == 401
