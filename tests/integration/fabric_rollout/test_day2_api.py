"""Fabric day 2 through the gateway (issue 13, items 2 and 6): real NATS + PostgreSQL, the real
inventory, fabric-worker and gateway, the lab's 3 namespace nodes (sshd + FRR) with node3's
underlay at MTU 1500 and a route reflector.

Preflight names the outlier and the largest vxlan_mtu; the apply refuses (409, naming node and
MTU) until the config fits or a fabric_admin forces it; progress counts the node it reports;
post-deploy carries the registered bmc_ip; batch post-deploy reaches nodes by IP; tearing
down one node degrades the rollout; after DELETE, /latest shows the teardown's last state.
Checks on the nodes themselves where the issue is about the node (the per-instance FRR log).

Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.auth import Role, create_token
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import (
    OPERATOR,
    OPERATOR_TOKEN,
    FabricEvents,
    finished,
    forget_jobs,
    lab_config,
    sql,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
# The lab configuration, with the switch ack gate left on (its default).
CONFIG = lab_config(skip_switch_ack=False)
APPLY = "/controlnode/fabric-config/apply"
BMCS = [f"198.18.2.{i}" for i in (1, 2, 3)]
NODE_IPS = [fabric_lab.underlay_ip(i) for i in (1, 2, 3)]


@pytest.fixture(scope="module")
def lab():
    fabric_lab.require_lab()
    with fabric_lab.FabricLab(n_nodes=3, prefix="kd", mtu_overrides={"node3": 1500}) as lab:
        yield lab


@pytest.fixture
async def api(settings, serve, lab):
    await serve(inventory_app(settings))
    # Default VNI set and default (per-instance) FRR log path: what a new user gets.
    rollout = FabricWorkerSettings(
        _env_file=None,
        ssh_key=Path(lab.client_key_path),
        connect_timeout=5,
        verify_timeout=30,
        preflight_timeout=15,
    )
    await serve(worker_app(settings, rollout_settings=rollout))
    await forget_jobs(settings)
    # Earlier tests' labs used these addresses with other host keys and registrations.
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=NODE_IPS)
    await sql(settings, "DELETE FROM inventory.bmc_infos WHERE os_ip = ANY(:n)", n=NODE_IPS)
    gw = await serve(gateway_app(settings))
    await create_token(gw.app.state.runtime.db, "ops-olga", Role.operator, OPERATOR_TOKEN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=120, headers=ADMIN) as c:
        yield c
        await c.delete("/controlnode/fabric-config")
    # The session's database is shared: this lab's nodes (their registrations and the host keys
    # first seen) must not follow the next test, whose lab reuses the addresses with new keys.
    await sql(settings, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = ANY(:b)", b=BMCS)
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=NODE_IPS)


def sh(lab, node, cmd: str) -> str:
    return lab.node_exec(node, cmd).stdout.strip()


async def _register(c: httpx.AsyncClient, lab) -> None:
    for i, n in enumerate(lab.nodes, 1):
        r = await c.post(
            "/controlnode/register",
            json={"bmc_ip": BMCS[i - 1], "os_ip": n.underlay_ip, "os_username": "root", "fqdn": n.name},
        )
        assert r.status_code == 200, r.text


async def test_preflight_judges_and_the_apply_refuses_until_fixed_or_forced(api, lab) -> None:
    c = api
    await _register(c, lab)
    assert (await c.post("/controlnode/fabric-config", json=CONFIG)).status_code == 201
    got = (await c.get("/controlnode/fabric-config")).json()
    assert "created" not in got and got["rollout_status"] == "pending"

    r = await c.post("/controlnode/fabric-config/preflight", json={"underlay_cidr": "198.18.0.0/24"})
    assert r.status_code == 200, r.text
    pf = r.json()
    assert pf["underlay_mtu"] == 0 and len(pf["mtu_drift"]) == 3  # the seed's fields, unchanged
    assert pf["max_vxlan_mtu"] == 1500
    assert [(o["fqdn"], o["bridge_mtu"]) for o in pf["mtu_outliers"]] == [("node3", 1500)]
    assert [(b["kind"], b["node_ip"], b["mtu"]) for b in pf["blockers"]] == [("mtu", "198.18.0.13", 1500)]

    # vxlan_mtu 9000 exceeds what node3 carries: 409 naming node and MTU; nothing queued.
    r = await c.post(APPLY)
    assert r.status_code == 409, r.text
    err = r.json()
    assert err["code"] == "FABRIC_PREFLIGHT_BLOCKED" and err["field"] == "vxlan_mtu"
    assert "node3 (198.18.0.13)" in err["message"] and "MTU 1500" in err["message"]
    assert err["details"]["max_vxlan_mtu"] == 1500
    assert [(b["node_ip"], b["mtu"]) for b in err["details"]["blockers"]] == [("198.18.0.13", 1500)]
    assert (await c.get("/controlnode/fabric-config/latest")).status_code == 404
    # A single-node apply to the outlier is refused the same way.
    assert (await c.post(APPLY.replace("apply", "node/198.18.0.13/apply"))).status_code == 409

    # The largest vxlan_mtu the underlay carries passes without force.
    assert (await c.post("/controlnode/fabric-config", json={"vxlan_mtu": 1500})).status_code == 200
    sse = await FabricEvents.open(c)
    r = await c.post(APPLY)
    assert r.status_code == 202, r.text
    job_id = r.json()["apply_job_id"]
    job = await finished(c, job_id)
    assert (job["job_status"], job["completed_nodes"]) == ("completed", 3), job
    await sse.wait_for(job_id, "apply_completed")
    # Progress counts the node each event reports: the last node_ready says 100.
    ready = [e["progress"] for e in sse.events if e.get("job_id") == job_id and e["state"] == "node_ready"]
    assert sorted(ready) == [33, 66, 100], ready
    await sse.close()
    # Default VNI set (10000) and one FRR log per instance (nodes share this filesystem).
    for n in lab.nodes:
        assert lab.node_exec(n, "ip link show vxlan10000").returncode == 0, n.name
        assert f"log file /var/log/frr/frr-{n.name}.log" in sh(lab, n, "cat /etc/frr/frr.conf")
        assert lab.node_exec(n, f"test -s /var/log/frr/frr-{n.name}.log").returncode == 0, n.name

    # Back to 9000: refused again; a fabric_admin may force it (the operator may not apply at all).
    assert (await c.post("/controlnode/fabric-config", json={"vxlan_mtu": 9000})).status_code == 200
    assert (await c.post(APPLY)).status_code == 409
    assert (await c.post(APPLY + "?force=true", headers=OPERATOR)).status_code == 403
    r = await c.post(APPLY + "?force=true")
    assert r.status_code == 202, r.text
    assert "forced past 1 preflight blocker(s)" in r.json()["message"]
    forced = await finished(c, r.json()["apply_job_id"])
    assert forced["job_status"] == "completed", forced


async def test_small_points_postdeploy_batch_teardown_and_latest_after_delete(api, lab) -> None:
    c = api
    await _register(c, lab)
    r = await c.post("/controlnode/fabric-config", json=CONFIG | {"vxlan_mtu": 1500})
    assert r.status_code in (200, 201), r.text
    r = await c.post(APPLY)
    assert r.status_code == 202, r.text
    assert (await finished(c, r.json()["apply_job_id"]))["job_status"] == "completed"

    # Node post-deploy carries the bmc_ip the node was registered with.
    steps = (await c.get("/controlnode/fabric-config/node/198.18.0.12/postdeploy")).json()
    assert steps and all(s["bmc_ip"] == "198.18.2.2" for s in steps), steps

    # Batch post-deploy for nodes never provisioned in a batch: by OS IP, by BMC IP, all.
    for batch_id in ("198.18.0.11", "198.18.2.1"):
        r = await c.get(f"/controlnode/fabric-config/batches/{batch_id}/postdeploy")
        assert r.status_code == 200, r.text
        b = r.json()
        assert (b["total_nodes"], b["ok"]) == (1, True), b
        assert (b["nodes"][0]["node_ip"], b["nodes"][0]["bmc_ip"]) == ("198.18.0.11", "198.18.2.1")
    every = (await c.get("/controlnode/fabric-config/batches/registered/postdeploy")).json()
    assert sorted(n["node_ip"] for n in every["nodes"]) == [n.underlay_ip for n in lab.nodes]
    assert (await c.get("/controlnode/fabric-config/batches/198.18.9.9/postdeploy")).status_code == 404

    # Tearing down one node: the fabric is no longer on every node.
    r = await c.delete("/controlnode/fabric-config/node/198.18.0.13")
    assert r.status_code == 200 and r.json()["removed"], r.text
    assert (await c.get("/controlnode/fabric-config")).json()["rollout_status"] == "degraded"

    # DELETE: /latest shows the teardown's last state, and not "pending" (nothing is left to apply).
    r = await c.delete("/controlnode/fabric-config")
    assert r.status_code == 200, r.text
    td = await finished(c, r.json()["teardown_job_id"], timeout=60)
    assert (td["job_status"], td["state"], td["rollout_status"]) == (
        "completed",
        "teardown_completed",
        "removed",
    ), td


async def test_no_vni_configured_is_a_clear_422_at_apply(settings, serve) -> None:
    await serve(inventory_app(settings))
    await serve(worker_app(settings, rollout_settings=FabricWorkerSettings(_env_file=None, vnis="")))
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=ADMIN) as c:
        assert (await c.post("/controlnode/fabric-config", json=CONFIG)).status_code == 201
        r = await c.post(APPLY)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "vnis" and "KARIOS_FABRIC_VNIS" in r.json()["message"]
        await c.delete("/controlnode/fabric-config")
