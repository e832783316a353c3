"""The console's pure view models: role → controls, jobs and stage timeline, fabric node states
from the last job / drift check / preflight, the topology's coordinates."""

from __future__ import annotations

import pytest

from karios.api_gateway.auth import Role
from karios.api_gateway.console import views
from karios.common.contracts.fabric_rollout import (
    DriftFinding,
    FabricDriftView,
    FabricJobNodeView,
    FabricJobView,
    FabricPreflightResult,
    MtuDriftView,
    NodeDriftView,
    PreflightNodeView,
    VtepPoolHeadroom,
)

DAY2 = {"retry_job", "adopt_discovered"}
T0, T1, T2 = "2026-12-01T10:00:00+00:00", "2026-12-01T10:05:00+00:00", "2026-12-01T10:10:00+00:00"


@pytest.mark.parametrize(
    ("role", "writes"),
    [
        (Role.viewer, set()),
        (Role.operator, {"provision", "cancel_job", "preflight", "edit_fabric", "preview_diff", *DAY2}),
        (
            Role.fabric_admin,
            {"provision", "cancel_job", "preflight", "edit_fabric", "preview_diff", "apply_fabric", *DAY2},
        ),
    ],
)
def test_controls_follow_the_roles_the_api_requires(role, writes):
    c = views.controls_for(role)
    assert {k for k, v in c.__dict__.items() if v} == writes
    assert c.any is bool(writes)


def job(id_: str, status: str = "running", state: str = "booting", **kw) -> dict:
    return {
        "id": id_,
        "bmc_ip": "10.0.0.1",
        "job_type": "provision",
        "job_status": state,
        "status": status,
        "progress": 35,
        "message": "",
        "updated_at": T0,
        **kw,
    }


def test_job_lines_merge_the_queue_and_offer_cancel_only_to_operators_on_running_jobs():
    jobs = [job("a"), job("b", status="cancelled", state="cancelled")]
    queue = [
        {"job_id": "a", "position": 0},
        {"job_id": "q", "bmc_ip": "10.0.0.9", "state": "queued", "position": 2},
    ]
    lines = views.job_lines(jobs, queue, views.controls_for(Role.operator))
    assert [(j.job_id, j.position, j.cancellable, j.css) for j in lines] == [
        ("q", 2, True, "run"),  # only the queue knows it yet
        ("a", 0, True, "run"),
        ("b", 0, False, "muted"),
    ]
    assert lines[1].updated_at == "10:00:00"
    assert not any(j.cancellable for j in views.job_lines(jobs, queue, views.controls_for(Role.viewer)))
    last = views.last_job_by_bmc(lines)
    assert last["10.0.0.1"].job_id == "a" and last["10.0.0.9"].job_id == "q"


def test_stage_timeline_folds_repeats_marks_passed_stages_and_the_current_one():
    rows = [
        {"stage": "Queued", "percent_complete": 0, "status": "running", "created_at": T0},
        {"stage": "Building ISO", "percent_complete": 10, "status": "running", "created_at": T0},
        {"stage": "Installing OS", "percent_complete": 50, "status": "running", "created_at": T1},
        {
            "stage": "Installing OS",
            "percent_complete": 70,
            "status": "running",
            "message": "packages",
            "created_at": T2,
        },
    ]
    steps = views.stage_timeline(rows)
    assert [(s.stage, s.percent, s.css, s.current) for s in steps] == [
        ("Queued", 0, "ok", False),
        ("Building ISO", 10, "ok", False),
        ("Installing OS", 70, "run", True),
    ]
    assert steps[-1].message == "packages" and steps[-1].at == "10:10:00"
    failed = views.stage_timeline([*rows[:2], {"stage": "Failed", "status": "failed", "created_at": T1}])
    assert [s.css for s in failed] == ["ok", "ok", "fail"]
    assert views.stage_timeline([]) == []


def latest(status: str = "completed", updated: str = T1, nodes=None, job_type: str = "fabric_apply"):
    return FabricJobView(
        job_id="j1", job_type=job_type, job_status=status, updated_at=updated, nodes=nodes or []
    )


def jn(ip: str, ok: bool = True, error: str = "", vtep: str = "") -> FabricJobNodeView:
    return FabricJobNodeView(node_ip=ip, fqdn="", ok=ok, error=error, vtep_ip=vtep)


def drift(checked: str, *nodes: NodeDriftView) -> FabricDriftView:
    return FabricDriftView(checked_at=checked, nodes=list(nodes))


IPS = {"10.0.0.2": "n2", "10.0.0.10": "n10", "10.0.0.1": "n1"}


def states(nodes) -> dict[str, str]:
    return {n.node_ip: n.state for n in nodes}


def test_fabric_node_states_from_the_last_job():
    nodes = views.fabric_nodes(
        IPS,
        latest(nodes=[jn("10.0.0.1", vtep="10.255.0.1"), jn("10.0.0.2", ok=False, error="ssh: refused")]),
        None,
    )
    assert [n.node_ip for n in nodes] == ["10.0.0.1", "10.0.0.2", "10.0.0.10"]  # numeric order
    assert states(nodes) == {"10.0.0.1": "established", "10.0.0.2": "failed", "10.0.0.10": "pending"}
    assert nodes[0].label == "Established" and nodes[0].vtep_ip == "10.255.0.1" and nodes[0].fqdn == "n1"
    assert nodes[1].detail == "ssh: refused" and nodes[1].css == "st-down"
    running = views.fabric_nodes(IPS, latest("running", nodes=[jn("10.0.0.1")]), None)
    assert states(running) == {"10.0.0.1": "established", "10.0.0.2": "applying", "10.0.0.10": "applying"}
    gone = views.fabric_nodes(
        {"10.0.0.1": "n1"}, latest(nodes=[jn("10.0.0.1")], job_type="fabric_teardown"), None
    )
    assert states(gone) == {"10.0.0.1": "removed"}


def test_a_newer_drift_check_overrides_the_job_and_names_bgp_or_evpn():
    bgp = NodeDriftView(
        node_ip="10.0.0.1", drifted=True, findings=[DriftFinding(kind="bgp session", message="Idle")]
    )
    evpn = NodeDriftView(
        node_ip="10.0.0.2", drifted=True, findings=[DriftFinding(kind="evpn", message="no VNI 100")]
    )
    clean = NodeDriftView(node_ip="10.0.0.10", drifted=False)
    job = latest(updated=T1, nodes=[jn(ip) for ip in IPS])
    newer = views.fabric_nodes(IPS, job, drift(T2, bgp, evpn, clean))
    assert states(newer) == {"10.0.0.1": "bgp_down", "10.0.0.2": "evpn_down", "10.0.0.10": "established"}
    assert newer[0].detail == "bgp session: Idle"
    older = views.fabric_nodes(IPS, job, drift(T0, bgp, evpn, clean))  # the apply came after the check
    assert set(states(older).values()) == {"established"}
    assert states(views.fabric_nodes({}, None, drift(T0, bgp))) == {"10.0.0.1": "bgp_down"}  # no job yet


def preflight(nodes: dict[str, int], outliers: list[str]) -> FabricPreflightResult:
    return FabricPreflightResult(
        underlay_cidr="198.18.0.0/24",
        nodes=[
            PreflightNodeView(node_ip=ip, fqdn=f"f{ip[-1]}", mode="reuse", bridge_mtu=m)
            for ip, m in nodes.items()
        ],
        matched_bridges=["br0"],
        underlay_mtu=0,
        mtu_drift=[MtuDriftView(node_ip=ip, bridge="br0", bridge_mtu=m) for ip, m in nodes.items()],
        mtu_outliers=[MtuDriftView(node_ip=ip, bridge="br0", bridge_mtu=nodes[ip]) for ip in outliers],
        vtep_pool=VtepPoolHeadroom(
            router_id_base="10.255.0.1",
            router_id_prefix_len=24,
            capacity=254,
            expected_nodes=3,
            headroom=251,
            overalloc_warn=False,
        ),
        ready=True,
    )


def test_preflight_mtu_drift_is_noted_on_the_outlier_node_only():
    pf = preflight({"10.0.0.1": 9000, "10.0.0.2": 9000, "10.0.0.3": 1500}, outliers=["10.0.0.3"])
    nodes = {n.node_ip: n for n in views.fabric_nodes({}, None, None, pf)}
    assert nodes["10.0.0.3"].mtu_note == "MTU 1500 ≠ 9000"
    assert nodes["10.0.0.1"].mtu_note == "" and nodes["10.0.0.1"].fqdn == "f1"  # named by the preflight
    assert all(n.state == "pending" for n in nodes.values())


@pytest.mark.parametrize("n", [0, 1, 3, 6, 7, 13])
def test_topology_places_every_node_under_the_route_reflector_inside_the_picture(n):
    nodes = views.fabric_nodes({f"10.0.0.{i + 1}": "" for i in range(n)}, None, None)
    topo = views.topology(nodes, "rr", "198.18.0.1")
    assert len(topo.nodes) == n and topo.rr.x == topo.width // 2
    points = [p for _, p in topo.nodes]
    assert len({(p.x, p.y) for p in points}) == n  # no two nodes drawn on each other
    half = 80  # the node box's half width in the template
    assert all(half <= p.x <= topo.width - half and topo.rr.y < p.y <= topo.height - 90 for p in points)
    rows = {p.y for p in points}
    assert len(rows) == -(-n // views.PER_ROW)
    for y in rows:  # each row is centred under the route reflector
        xs = [p.x for p in points if p.y == y]
        assert abs((min(xs) + max(xs)) / 2 - topo.rr.x) <= 1


def test_diff_lines_classify_a_unified_diff():
    text = (
        "--- a/frr.conf\n+++ b/frr.conf\n@@ -1,2 +1,2 @@\n"
        " router bgp 65000\n- neighbor 10.0.0.1\n+ neighbor 10.0.0.2"
    )
    assert [c for c, _ in views.diff_lines(text)] == ["d-file", "d-file", "d-hunk", "", "d-del", "d-add"]
    assert views.diff_lines(text)[4][1] == "- neighbor 10.0.0.1"
    assert views.diff_lines("") == []
