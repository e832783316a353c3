"""Pure core of the rollout: discovery parsing, diff/rollback planning, verify and
post-deploy verdicts, VTEP allocation, preflight resolution, job summary, redaction."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from karios.fabric_worker.config.pool import VtepPool
from karios.fabric_worker.rollout.facts import Interface, parse_facts
from karios.fabric_worker.rollout.intent import (
    FabricIntent,
    NodeOverride,
    NodeTarget,
    VtepPoolExhausted,
    allocate_vteps,
    vtep_pool_capacity,
)
from karios.fabric_worker.rollout.plan import (
    DesiredNetwork,
    FrrAction,
    baseline_network,
    frr_plan,
    frr_rollback_plan,
    network_commands,
    overlay_mtu,
    write_file_command,
)
from karios.fabric_worker.rollout.preflight import resolve_node, summarize
from karios.fabric_worker.rollout.ssh import redact
from karios.fabric_worker.rollout.summary import (
    JobNode,
    JobStatus,
    JobSummary,
    JobType,
    RolloutStatus,
    finalize,
    record_node,
)
from karios.fabric_worker.rollout.verify import (
    StepStatus,
    parse_evpn_summary,
    postdeploy_checklist,
    verify_verdict,
)
from tests.unit.fabric_rollout.lab import lab_intent

FIX = Path(__file__).parent / "fixtures"
FRESH = parse_facts((FIX / "discover_node1_fresh.txt").read_text())
APPLIED = parse_facts((FIX / "discover_node2_applied.txt").read_text())
SUMMARY = (FIX / "evpn_summary_node2.json").read_text()
INTENT = lab_intent()


# -- discovery ------------------------------------------------------------------------------


def test_fresh_lab_node_has_bridge_but_no_frr() -> None:
    assert FRESH.hostname == "node1"
    br = FRESH.interfaces["br-underlay"]
    assert (br.kind, br.mtu, br.ipv4) == ("bridge", 9000, ("198.18.0.11/24",))
    assert FRESH.frr_installed and not FRESH.frr_running
    assert FRESH.files == {"daemons": None, "frr.conf": None, "vtysh.conf": None}
    assert FRESH.vtep_ip is None


def test_applied_node_shows_vtep_vxlan_and_running_frr() -> None:
    assert APPLIED.frr_running and APPLIED.vtep_ip == "198.19.1.2"
    vx = APPLIED.interfaces["vxlan100"]
    assert (vx.kind, vx.vxlan_id, vx.vxlan_local, vx.master) == ("vxlan", 100, "198.19.1.2", "br100")
    assert "router bgp 65000" in (APPLIED.files["frr.conf"] or "")


def test_truncated_discovery_output_is_an_error_not_an_empty_node() -> None:
    with pytest.raises(ValueError, match="truncated"):
        parse_facts("@@karios:hostname\nnode1\n")


# -- diff -----------------------------------------------------------------------------------


def _want(vtep: str | None = "198.19.1.2", mtu: int = 1450) -> DesiredNetwork:
    return DesiredNetwork(vtep_ip=vtep, vnis=(100,), overlay_mtu=mtu, managed_vnis=(100,))


def test_applied_node_needs_no_network_change() -> None:
    assert network_commands(APPLIED, _want()) == []


def test_fresh_node_gets_vtep_and_vxlan_devices() -> None:
    cmds = network_commands(FRESH, _want("198.19.1.1", 8950))
    joined = "\n".join(cmds)
    assert "ip addr add 198.19.1.1/32 dev vtep0" in joined
    assert (
        "ip link add vxlan100 mtu 8950 type vxlan id 100 local 198.19.1.1 dstport 4789 nolearning" in joined
    )
    assert "ip link set vxlan100 master br100" in joined


def test_changed_vtep_address_recreates_the_vxlan_device() -> None:
    cmds = network_commands(APPLIED, _want("198.19.1.9"))
    assert "ip -4 addr flush dev vtep0" in cmds
    assert "ip link del vxlan100" in cmds


def test_removed_vni_deletes_only_its_devices() -> None:
    cmds = network_commands(APPLIED, DesiredNetwork(vtep_ip="198.19.1.2", vnis=(), overlay_mtu=1450))
    assert cmds == ["ip link del vxlan100", "ip link del br100"]


def test_overlay_mtu_follows_the_smaller_of_fabric_and_node_mtu() -> None:
    assert overlay_mtu(9000, 9000) == 8950
    assert overlay_mtu(9000, 1500) == 1450
    assert overlay_mtu(1500, 9000) == 1450


def test_unchanged_files_and_running_frr_mean_no_reload() -> None:
    assert frr_plan(APPLIED, dict(APPLIED.files)).action is FrrAction.NONE  # type: ignore[arg-type]
    assert not frr_plan(APPLIED, dict(APPLIED.files)).changed  # type: ignore[arg-type]


def test_changed_frr_conf_reloads_and_changed_daemons_restart() -> None:
    files = dict(APPLIED.files)
    assert frr_plan(APPLIED, files | {"frr.conf": "x"}).action is FrrAction.RELOAD  # type: ignore[operator]
    assert frr_plan(APPLIED, files | {"daemons": "x"}).action is FrrAction.RESTART  # type: ignore[operator]
    assert frr_plan(FRESH, {"frr.conf": "x"}).action is FrrAction.START


# -- rollback -------------------------------------------------------------------------------


def test_rollback_to_an_empty_baseline_stops_frr_and_removes_everything() -> None:
    plan = frr_rollback_plan(FRESH, APPLIED)
    assert plan.action is FrrAction.STOP
    assert plan.writes == {"daemons": None, "frr.conf": None, "vtysh.conf": None}
    cmds = network_commands(APPLIED, baseline_network(FRESH, (100,)))
    assert cmds == ["ip link del vxlan100", "ip link del br100", "ip link del vtep0"]


def test_rollback_to_a_configured_baseline_restores_files_and_restarts() -> None:
    current = dataclasses.replace(APPLIED, files=APPLIED.files | {"frr.conf": "new"})
    plan = frr_rollback_plan(APPLIED, current)
    assert plan.writes == {"frr.conf": APPLIED.files["frr.conf"]}
    assert plan.action is FrrAction.RESTART
    assert network_commands(APPLIED, baseline_network(APPLIED, (100,))) == []


def test_rollback_of_an_untouched_node_is_a_no_op() -> None:
    assert not frr_rollback_plan(APPLIED, APPLIED).changed


def test_file_content_goes_over_stdin_never_the_command_line() -> None:
    cmd = write_file_command("frr.conf", "neighbor x password hunter2\n")
    assert "hunter2" not in cmd and "cat >" in cmd
    assert write_file_command("frr.conf", None) == "rm -f /etc/frr/frr.conf"


# -- verify / post-deploy -----------------------------------------------------------------


def test_verify_passes_on_recorded_established_summary() -> None:
    peer = parse_evpn_summary(SUMMARY, "198.18.0.1")
    assert peer is not None and peer.state == "Established"
    assert verify_verdict(peer, "198.18.0.1", expect_routes=True) is None


def test_verify_reason_names_the_neighbor() -> None:
    assert verify_verdict(None, "10.0.0.1", True) == "BGP neighbor 10.0.0.1 not configured for l2vpn evpn"
    peer = parse_evpn_summary('{"peers": {"10.0.0.1": {"state": "Active"}}}', "10.0.0.1")
    assert verify_verdict(peer, "10.0.0.1", True) == "BGP neighbor 10.0.0.1 not Established (state Active)"
    assert parse_evpn_summary("% BGP instance not found", "10.0.0.1") is None


def test_postdeploy_all_green_on_applied_node_except_mtu_drift() -> None:
    steps = postdeploy_checklist(
        APPLIED, SUMMARY, peer_ip="198.18.0.1", vnis=(100,), vxlan_mtu=9000, underlay_iface="br-underlay"
    )
    status = {s.step_id: s.status for s in steps}
    assert status == {
        "frr_installed": StepStatus.PASSED,
        "vtep0_up": StepStatus.PASSED,
        "bgp_established": StepStatus.PASSED,
        "evpn_routes": StepStatus.PASSED,
        "mtu_consistent": StepStatus.FAILED,  # node2 was recorded with a 1500 underlay
    }
    mtu = next(s for s in steps if s.step_id == "mtu_consistent")
    assert mtu.message == "underlay br-underlay MTU 1500 is below the fabric vxlan_mtu 9000"
    assert all(s.progress == (100 if s.status is StepStatus.PASSED else 0) for s in steps)


def test_postdeploy_on_fresh_node_says_what_is_missing() -> None:
    steps = postdeploy_checklist(
        FRESH, "", peer_ip="198.18.0.1", vnis=(100,), vxlan_mtu=9000, underlay_iface="br-underlay"
    )
    msgs = {s.step_id: s.message for s in steps}
    assert msgs["frr_installed"] == "FRR installed but not running"
    assert msgs["vtep0_up"] == "vtep0 missing"
    assert msgs["mtu_consistent"] == "underlay MTU 9000, overlay MTU 8950"


# -- intent / VTEP pool -------------------------------------------------------------------


def test_vtep_allocation_is_deterministic_and_keeps_existing() -> None:
    a = allocate_vteps(INTENT, ["198.18.0.13", "198.18.0.11", "198.18.0.12"])
    assert a == {"198.18.0.11": "198.19.1.1", "198.18.0.12": "198.19.1.2", "198.18.0.13": "198.19.1.3"}
    b = allocate_vteps(INTENT, ["198.18.0.20", "198.18.0.12"], existing={"198.18.0.12": "198.19.1.2"})
    assert b == {"198.18.0.12": "198.19.1.2", "198.18.0.20": "198.19.1.1"}


def test_vtep_pool_exhaustion_is_reported() -> None:
    small = INTENT.model_copy(update={"router_id_base": "198.19.1.1", "router_id_prefix_len": 30})
    # The seed's rule (total_usable "excluding .0 and .255 per /24 block"): .1, .2 and .3.
    assert vtep_pool_capacity("198.19.1.1", 30) == 3
    with pytest.raises(VtepPoolExhausted, match=r"no free address for 198\.18\.0\.4"):
        allocate_vteps(small, ["198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4"])


@pytest.mark.parametrize(
    ("base", "prefix", "peer"),
    [
        ("198.19.1.1", 24, "198.19.1.254"),  # the switch's peering IP inside the pool
        ("10.255.0.0", 23, "10.0.0.1"),  # two /24 blocks: .255 and .0 in the middle
        ("10.255.0.200", 22, "10.255.1.0"),
        ("198.19.1.1", 30, "198.18.0.1"),
    ],
)
def test_preflight_headroom_and_vtep_pool_use_one_sizing_rule(base: str, prefix: int, peer: str) -> None:
    """Preflight's capacity, the allocator and GET /vtep-pool's total_usable are one number."""
    pool = VtepPool.of(base, prefix, [peer])
    result = summarize(
        [],
        underlay_cidr="198.18.0.0/24",
        overrides=[],
        router_id_base=base,
        router_id_prefix_len=prefix,
        expected_nodes=1,
        reserved=(peer,),
    )
    assert result.vtep_pool.capacity == pool.total_usable == vtep_pool_capacity(base, prefix, (peer,))
    intent = INTENT.model_copy(
        update={"router_id_base": base, "router_id_prefix_len": prefix, "peer_ip": peer}
    )
    nodes = [f"198.18.{i // 250}.{i % 250 + 1}" for i in range(pool.total_usable)]
    given = set(allocate_vteps(intent, nodes).values())
    assert given == {str(a) for a in pool.addresses()}
    assert not any(v.endswith((".0", ".255")) or v == peer for v in given)
    with pytest.raises(VtepPoolExhausted):
        allocate_vteps(intent, [*nodes, "198.18.200.1"])


@pytest.mark.parametrize(
    ("update", "match"),
    [
        ({"peer_ip": "not-an-ip"}, "IPv4 address"),
        ({"underlay_cidr": "10.0.0.0/33"}, "IPv4 CIDR"),
        ({"ospf_auth_type": "message-digest"}, "ospf_auth_key is required"),
        ({"ospf_auth_type": "message-digest", "ospf_auth_key": "x" * 17}, "at most 16"),
        ({"bgp_password": "two words"}, "whitespace"),
        ({"vnis": [0]}, "VNI 0"),
        ({"bgp_keepalive": 10, "bgp_holdtime": 20}, "3 x bgp_keepalive"),
    ],
)
def test_bad_intent_is_rejected_with_a_reason(update: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        FabricIntent(**(INTENT.model_dump() | update))


def test_secrets_never_appear_in_the_intent_repr() -> None:
    i = FabricIntent(**(INTENT.model_dump() | {"bgp_password": "hunter2"}))
    assert "hunter2" not in repr(i) and "hunter2" not in i.model_dump_json()
    assert i.secrets() == ["hunter2"]


def test_redact_scrubs_every_secret() -> None:
    assert redact("password hunter2 and hunter2x", ["hunter2", "hunter2x"]) == "password *** and ***"


# -- preflight ----------------------------------------------------------------------------


T1 = NodeTarget(node_ip="198.18.0.11", fqdn="node1")


def test_preflight_reuses_a_bridge_in_the_underlay_cidr() -> None:
    n = resolve_node(T1, FRESH, "198.18.0.0/24", None)
    assert (n.mode, n.bridge, n.bridge_mtu, n.underlay_ip) == ("reuse", "br-underlay", 9000, "198.18.0.11/24")


def test_preflight_needs_override_with_reason() -> None:
    n = resolve_node(T1, FRESH, "10.60.200.0/24", None)
    assert n.mode == "needs_override" and n.needs_override
    assert n.reason == "no interface has an IPv4 address in 10.60.200.0/24"
    non_bridge = dataclasses.replace(
        FRESH, interfaces={"eth1": Interface("eth1", "", 1500, True, ipv4=("10.60.200.5/24",))}
    )
    assert resolve_node(T1, non_bridge, "10.60.200.0/24", None).reason == (
        "10.60.200.5/24 is on eth1, which is not a bridge"
    )


def test_preflight_honours_node_override() -> None:
    o = NodeOverride(node_ip="198.18.0.11", underlay_iface_hint="eth0", underlay_ip="10.60.200.5/24")
    n = resolve_node(T1, FRESH, "10.60.200.0/24", o)
    assert (n.mode, n.bridge, n.underlay_ip) == ("reuse", "eth0", "10.60.200.5/24")
    assert "node_overrides" in n.reason


def test_preflight_summary_reports_mtu_drift_and_pool() -> None:
    a = resolve_node(T1, FRESH, "198.18.0.0/24", None)
    b = a.model_copy(update={"node_ip": "198.18.0.12", "bridge_mtu": 1500, "hmac_sha_capable": False})
    r = summarize(
        [a, b],
        underlay_cidr="198.18.0.0/24",
        overrides=[],
        router_id_base="198.19.1.1",
        router_id_prefix_len=30,
        expected_nodes=4,
    )
    assert r.underlay_mtu == 0
    # every node resolved, but 4 nodes do not fit the /30: a blocker, so not ready
    assert [b.kind for b in r.blockers] == ["pool_headroom"] and not r.ready
    assert [(d.node_ip, d.bridge_mtu) for d in r.mtu_drift] == [("198.18.0.11", 9000), ("198.18.0.12", 1500)]
    # .1-.3 of the /30 (the seed's rule: only .0/.255 of a /24 are never handed out)
    assert (r.vtep_pool.capacity, r.vtep_pool.headroom, r.vtep_pool.overalloc_warn) == (3, -1, True)
    assert r.frr_hmac_sha_capable is False
    same = summarize(
        [a],
        underlay_cidr="198.18.0.0/24",
        overrides=[],
        router_id_base="198.19.1.1",
        router_id_prefix_len=24,
        expected_nodes=0,
    )
    assert same.underlay_mtu == 9000 and same.mtu_drift == [] and same.frr_hmac_sha_capable is None


def test_preflight_not_ready_when_a_node_is_unreachable() -> None:
    a = resolve_node(T1, FRESH, "198.18.0.0/24", None)
    from karios.fabric_worker.rollout.preflight import PreflightNode

    down = PreflightNode(node_ip="198.18.0.99", mode="unreachable", reason="SSH connect timed out")
    r = summarize(
        [a, down],
        underlay_cidr="198.18.0.0/24",
        overrides=[],
        router_id_base="198.19.1.1",
        router_id_prefix_len=24,
        expected_nodes=0,
    )
    assert not r.ready and r.underlay_mtu == 9000


def test_preflight_is_not_ready_while_it_carries_a_blocker() -> None:
    """Issue 23 item 10: every node reuse, yet an MTU blocker: `ready` is derived, so false,
    in the worker's result and in the contract the gateway answers (whatever it is sent)."""
    from karios.common.contracts.fabric_rollout import FabricPreflightResult

    a = resolve_node(T1, FRESH, "198.18.0.0/24", None)  # bridge MTU 9000
    common = {
        "underlay_cidr": "198.18.0.0/24",
        "overrides": [],
        "router_id_base": "198.19.1.1",
        "router_id_prefix_len": 24,
        "expected_nodes": 0,
    }
    fits = summarize([a], **common, vxlan_mtu=9000)
    assert fits.ready and fits.blockers == []
    r = summarize([a], **common, vxlan_mtu=9216)
    assert all(n.mode == "reuse" for n in r.nodes)
    assert [b.kind for b in r.blockers] == ["mtu"] and r.ready is False
    dumped = r.model_dump(mode="json")
    assert dumped["ready"] is False
    view = FabricPreflightResult.model_validate({**dumped, "ready": True})  # a stale "ready" is ignored
    assert view.ready is False and view.model_dump(mode="json")["ready"] is False
    assert FabricPreflightResult.model_validate(fits.model_dump(mode="json")).ready is True
    assert summarize([], **common).ready is False  # no node: nothing is ready


# -- job summary ----------------------------------------------------------------------------


def _job(n: int = 3) -> JobSummary:
    return JobSummary(job_id="j", job_type=JobType.APPLY, total_nodes=n)


def test_summary_keeps_first_failure_verbatim() -> None:
    s = record_node(_job(), JobNode(node_ip="a", ok=True))
    s = record_node(s, JobNode(node_ip="b", ok=False, error="BGP neighbor 1.2.3.4 not Established"))
    s = record_node(s, JobNode(node_ip="c", ok=False, reachable=False, error="timeout"))
    assert (s.completed_nodes, s.failed_nodes, s.progress) == (1, 2, 100)
    assert (s.first_fail_node, s.first_fail_error) == ("b", "BGP neighbor 1.2.3.4 not Established")
    f = finalize(s, cancelled=False, aborted_by_strict=False)
    assert (f.job_status, f.rollout_status) == (JobStatus.PARTIAL, RolloutStatus.DEGRADED)


@pytest.mark.parametrize(
    ("oks", "cancelled", "strict", "expect"),
    [
        ([True, True], False, False, (JobStatus.COMPLETED, RolloutStatus.READY)),
        ([False, False], False, False, (JobStatus.FAILED, RolloutStatus.FAILED)),
        ([True, False], False, True, (JobStatus.FAILED, RolloutStatus.FAILED)),
        ([True, True], True, False, (JobStatus.CANCELLED, RolloutStatus.FAILED)),
    ],
)
def test_job_outcome(oks: list[bool], cancelled: bool, strict: bool, expect: tuple) -> None:
    s = _job(len(oks))
    for i, ok in enumerate(oks):
        s = record_node(s, JobNode(node_ip=str(i), ok=ok))
    f = finalize(s, cancelled=cancelled, aborted_by_strict=strict)
    assert (f.job_status, f.rollout_status) == expect


# -- what survives a worker restart -------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("discover_*.txt")))
def test_baseline_facts_roundtrip_through_json(name: str) -> None:
    import json

    from karios.fabric_worker.rollout.facts import facts_from_dict, facts_to_dict
    from karios.fabric_worker.rollout.plan import baseline_network, frr_rollback_plan

    facts = parse_facts((FIX / name).read_text())
    back = facts_from_dict(json.loads(json.dumps(facts_to_dict(facts))))
    assert back == facts
    # What a peer rolls back to is exactly what the original worker would have.
    assert baseline_network(back, (100,)) == baseline_network(facts, (100,))
    assert frr_rollback_plan(back, FRESH) == frr_rollback_plan(facts, FRESH)


def test_cancel_broadcast_subject_is_core_nats_only() -> None:
    from karios.common.bus.subjects import Subjects
    from karios.fabric_worker.rollout.access import baseline_context

    sub = Subjects("karios")
    subject = sub.broadcast("fabric", "cancel_apply")
    assert subject == "karios.bcast.fabric.cancel_apply"
    # Not captured by a stream (work-queue retention would hand it to one replica only).
    for stream_filter in (sub.all_commands, sub.all_events, sub.all_dead_letters):
        assert not subject.startswith(stream_filter.removesuffix(">"))
    assert baseline_context("j1", "10.0.0.1") != baseline_context("j1", "10.0.0.2")
