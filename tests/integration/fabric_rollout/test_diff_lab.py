"""Apply preview (issue 15 item 2) through the gateway: real NATS + PostgreSQL, the real
inventory, fabric-worker and gateway, the lab's 3 namespace nodes (sshd + FRR) and a route
reflector.

Empty nodes: the diff shows the whole frr.conf added and vtep0 to create, with the BGP password
and OSPF key set in the config and never in the answer. After an apply: no node changes. A line
added by hand to node2's frr.conf (and a bridge MTU changed there): the diff is exactly that
line (and that MTU). An unregistered address: 404; a registered node nobody answers for:
``reachable: false`` with its error. Nothing the preview does changes a node.

Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import os
import sys
import time
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
    VIEWER,
    VIEWER_TOKEN,
    finished,
    forget_every_node,
    forget_fabric_config,
    forget_jobs,
    lab_config,
    sql,
)
from tests.fixtures.wait import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
CONFIG = lab_config()
BGP_PW = "Bgp-Preview-S3cret"
OSPF_KEY = "OspfKey77"
SECRETS = {
    "bgp_password": BGP_PW,
    "ospf_enabled": True,
    "ospf_auth_type": "message-digest",
    "ospf_auth_key": OSPF_KEY,
    "ospf_auth_key_id": 3,
    "ospf_fabric_interface": "br-underlay",
}
DIFF = "/controlnode/fabric-config/diff"
BMCS = [f"198.18.5.{i}" for i in (1, 2, 3)]
NODE_IPS = [fabric_lab.underlay_ip(i) for i in (1, 2, 3)]
NODE2 = NODE_IPS[1]
DEAD = ("198.18.5.9", "127.0.0.79")  # a registered node whose address has no sshd


@pytest.fixture(scope="module")
def lab():
    fabric_lab.require_lab()
    with fabric_lab.FabricLab(n_nodes=3, prefix="kdf") as lab:
        yield lab


async def _forget(settings) -> None:
    ips, bmcs = [*NODE_IPS, DEAD[1]], [*BMCS, DEAD[0]]
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=ips)
    await sql(settings, "DELETE FROM fabric.vtep_allocations WHERE node_ip = ANY(:n)", n=ips)
    await sql(
        settings, "DELETE FROM inventory.bmc_infos WHERE os_ip = ANY(:n) OR bmc_ip = ANY(:b)", n=ips, b=bmcs
    )


@pytest.fixture
async def api(settings, serve, lab):
    await serve(inventory_app(settings))
    rollout = FabricWorkerSettings(
        _env_file=None,
        ssh_key=Path(lab.client_key_path),
        vnis="100,200",
        frr_log_file="/run/frr/frr.log",
        connect_timeout=5,
        verify_timeout=30,
        preflight_timeout=20,
        drift_interval=0,
    )
    await serve(worker_app(settings, rollout_settings=rollout))
    await forget_jobs(settings)
    await forget_fabric_config(settings)  # earlier tests on the shared database may leave theirs
    await forget_every_node(settings)
    await _forget(settings)
    gw = await serve(gateway_app(settings))
    await create_token(gw.app.state.runtime.db, "viewer-vic", Role.viewer, VIEWER_TOKEN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=120, headers=ADMIN) as c:
        yield c
        await c.delete("/controlnode/fabric-config")
        await wait_until(
            lambda: _idle(settings), timeout=60, interval=0.3, what="the teardown after the test to end"
        )
    await _forget(settings)


async def _idle(settings) -> bool:
    rows = await sql(settings, "SELECT count(*) AS n FROM fabric.fabric_jobs WHERE job_status = 'running'")
    return rows[0]["n"] == 0


async def _diff(c: httpx.AsyncClient, node_ip: str = "") -> tuple[dict, str, float]:
    t0 = time.monotonic()
    r = await c.post(DIFF, params={"node_ip": node_ip} if node_ip else None)
    assert r.status_code == 200, r.text
    return r.json(), r.text, time.monotonic() - t0


def _body_lines(diff: str, sign: str) -> list[str]:
    return [ln for ln in diff.splitlines() if ln.startswith(sign) and not ln.startswith(sign * 3)]


def _snapshot(lab) -> list[str]:
    """What a write would change on a node: frr.conf, FRR running, links, addresses and MTUs.

    Not the kernel's carrier state nor what follows from it (a bridge's carrier comes up on its
    own after a port joins, ``NO-CARRIER``/``DOWN`` → ``UP``, CI saw it flip between two
    snapshots; IPv6 then adds a link-local address): links with their admin flags but not the
    carrier's, IPv4 addresses.
    """
    links = "ip -o link | sed -E 's/NO-CARRIER,|,LOWER_UP|,M-DOWN//g; s/ state [A-Z]+//'"
    addrs = "ip -br -4 addr | awk '{$2=\"\"; print}'"
    cmd = f"cat /etc/frr/frr.conf 2>/dev/null; {links}; {addrs}; cat /run/frr/zebra.pid 2>/dev/null"
    return [lab.node_exec(i, cmd).stdout for i in (1, 2, 3)]


async def test_diff_preview_empty_applied_hand_edited_unreachable(api, lab, settings) -> None:
    c = api
    for i, n in enumerate(lab.nodes):
        body = {"bmc_ip": BMCS[i], "os_ip": n.underlay_ip, "os_username": "root", "fqdn": n.name}
        assert (await c.post("/controlnode/register", json=body)).status_code == 200
    assert (await c.post(DIFF)).status_code == 404  # no configuration stored yet
    r = await c.post("/controlnode/fabric-config", json={**CONFIG, **SECRETS})
    assert r.status_code in (200, 201), r.text
    assert (await c.post(DIFF, headers=VIEWER)).status_code == 403
    bad = await c.post(DIFF, params={"node_ip": "not-an-ip"})
    assert bad.status_code == 422 and bad.json()["field"] == "node_ip", bad.text
    assert (await c.post(DIFF, params={"node_ip": "198.18.9.9"})).status_code == 404

    # -- empty nodes: everything is added; the secrets are not in the answer ----------------------
    before = _snapshot(lab)
    view, raw, empty_s = await _diff(c)
    assert BGP_PW not in raw and OSPF_KEY not in raw
    assert (view["changed"], view["nodes_total"], view["nodes_changed"], view["nodes_failed"]) == (
        True,
        3,
        3,
        0,
    ), view
    assert [n["node_ip"] for n in view["nodes"]] == NODE_IPS
    for n in view["nodes"]:
        assert n["reachable"] and n["changed"] and not n["error"], n
        assert n["vtep_ip"].startswith("198.19.1.") and n["vtep_allocated"] is False
        assert n["frr_action"] == "start"  # FRR installed in the lab, not running
        files = {f["name"]: f for f in n["files"]}
        conf = files["frr.conf"]
        assert conf["change"] == "create" and conf["diff"].startswith(
            "--- /dev/null\n+++ b/etc/frr/frr.conf\n"
        )
        assert _body_lines(conf["diff"], "-") == []
        added = _body_lines(conf["diff"], "+")
        assert "+router bgp 65000" in added and any(ln.endswith("password <redacted>") for ln in added), added
        assert any("md5 <redacted>" in ln for ln in added), added
        links = [(x["device"], x["action"]) for x in n["links"]]
        assert links[:3] == [("vtep0", "create"), ("vtep0", "address"), ("vtep0", "up")], links
        assert n["links"][1]["detail"] == f"{n['vtep_ip']}/32"
        assert {("vxlan100", "create"), ("br200", "create")} <= set(links), links
    planned = {n["node_ip"]: n["vtep_ip"] for n in view["nodes"]}
    assert len(set(planned.values())) == 3
    assert _snapshot(lab) == before  # read-only
    stored = "SELECT node_ip FROM fabric.vtep_allocations WHERE node_ip = ANY(:n) UNION ALL "
    stored += "SELECT node_ip FROM fabric.node_host_keys WHERE node_ip = ANY(:n)"
    assert await sql(settings, stored, n=NODE_IPS) == []  # no VTEP allocated, no host key pinned

    # -- apply (the lab's RR has no password: the secrets are cleared first) ----------------------
    clear = {**CONFIG, "clear_bgp_password": True, "clear_ospf_auth_key": True, "ospf_auth_type": ""}
    assert (await c.post("/controlnode/fabric-config", json=clear)).status_code in (200, 201)
    r = await c.post("/controlnode/fabric-config/apply")
    assert r.status_code == 202, r.text
    job = await finished(c, r.json()["apply_job_id"])
    assert job["job_status"] == "completed", job
    view, _, applied_s = await _diff(c)
    assert (view["changed"], view["nodes_changed"], view["nodes_failed"]) == (False, 0, 0), view
    assert all(
        not n["changed"] and n["files"] == [] and n["links"] == [] and n["frr_action"] == "none"
        for n in view["nodes"]
    ), view
    allocated = {j["node_ip"]: j["vtep_ip"] for j in job["nodes"]}
    assert {n["node_ip"]: n["vtep_ip"] for n in view["nodes"]} == allocated == planned  # as previewed
    assert all(n["vtep_allocated"] for n in view["nodes"])

    # -- node2 edited by hand: exactly that line (and that MTU) -----------------------------------
    res = lab.node_exec("node2", "echo '! edited by hand' >> /etc/frr/frr.conf && ip link set br100 mtu 1400")
    assert res.returncode == 0, res.stderr
    view, _, node_s = await _diff(c, NODE2)
    (n,) = view["nodes"]
    assert (n["node_ip"], n["changed"], n["frr_action"]) == (NODE2, True, "reload"), n
    (f,) = n["files"]
    assert (f["name"], f["change"]) == ("frr.conf", "modify")
    assert (_body_lines(f["diff"], "-"), _body_lines(f["diff"], "+")) == (["-! edited by hand"], []), f[
        "diff"
    ]
    assert [(x["device"], x["action"], x["detail"]) for x in n["links"]] == [
        ("br100", "mtu", "mtu 1400 → 8950")
    ]
    whole, _, _ = await _diff(c)
    assert [x["node_ip"] for x in whole["nodes"] if x["changed"]] == [NODE2], whole

    # -- a registered node nobody answers for -----------------------------------------------------
    body = {"bmc_ip": DEAD[0], "os_ip": DEAD[1], "os_username": "root", "fqdn": "ghost"}
    assert (await c.post("/controlnode/register", json=body)).status_code == 200
    view, _, dead_s = await _diff(c, DEAD[1])
    (n,) = view["nodes"]
    assert (n["reachable"], n["changed"], view["nodes_unreachable"], view["nodes_failed"]) == (
        False,
        False,
        1,
        1,
    )
    assert DEAD[1] in n["error"] and n["files"] == [] and n["links"] == [], n
    print(
        f"\ndiff preview: empty 3 nodes {empty_s:.2f} s, applied {applied_s:.2f} s, one node {node_s:.2f} s, "
        f"unreachable {dead_s:.2f} s"
    )
