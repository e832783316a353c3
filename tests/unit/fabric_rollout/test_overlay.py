"""The post-deploy overlay checks (issue 23 item 3): the rules on FRR 8.4 output recorded in the lab
(3 nodes, VNIs 100 and 200, VTEPs 198.19.1.1-3; fixtures/overlay/), and the node apply failing
with the reason when a check does not pass."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from karios.fabric_worker.rollout.errors import FabricVerifyFailed
from karios.fabric_worker.rollout.facts import overlay_of
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.node import NodeRollout, RolloutOptions
from karios.fabric_worker.rollout.overlay import (
    OverlayView,
    ProbePlan,
    RolledOut,
    RolledOutVtep,
    imet_seen,
    overlay_loop_script,
    overlay_verdict,
    parse_overlay,
    plan_probe,
    probe_message,
    probe_rtt_ms,
    probe_script,
    settle_deadline,
)
from tests.unit.fabric_rollout.lab import OVERLAY_FIXTURES, overlay_line
from tests.unit.fabric_rollout.test_noop_verify import (
    INTENT,
    VTEP,
    RecordingSession,
    _applied_discovery,
    _summary,
)

VNIS = (100, 200)
ALL = {"198.19.1.1", "198.19.1.2", "198.19.1.3"}


def _others(own: str) -> set[str]:
    return ALL - {own}


def test_a_rolled_out_node_passes_with_every_vni_up_and_every_imet_route_in() -> None:
    for name, own in (("overlay_node1", "198.19.1.1"), ("overlay_node2", "198.19.1.2")):
        view = parse_overlay(overlay_line(name))
        assert view.zebra_vnis == {100: "vxlan100", 200: "vxlan200"}
        assert view.bgp_vnis == {100: frozenset({"65000:100"}), 200: frozenset({"65000:200"})}
        assert imet_seen(view) == {100: ALL, 200: ALL}  # its own IMET route included
        assert overlay_verdict(view, VNIS, _others(own)) is None
        assert view.link_locals["br100"].startswith("fe80::")


def test_a_vni_removed_by_hand_is_named() -> None:
    view = parse_overlay(overlay_line("overlay_node2_no_vxlan200_on_node2"))
    assert overlay_verdict(view, VNIS, set()) == "VNI 200: no VXLAN device with VNI 200"
    assert overlay_verdict(view, (100,), _others("198.19.1.2")) is None  # VNI 100 is still fine


def test_a_vxlan_device_down_is_named() -> None:
    view = parse_overlay(overlay_line("overlay_node2_vxlan100_down"))
    assert overlay_verdict(view, (100,), set()) == "VNI 100: vxlan100 is down"


def test_the_others_miss_the_imet_route_of_the_vni_it_lost_naming_vtep_and_vni() -> None:
    for name in ("overlay_node1_no_vxlan200_on_node2", "overlay_node3_no_vxlan200_on_node2"):
        view = parse_overlay(overlay_line(name))
        assert overlay_verdict(view, VNIS, {"198.19.1.2"}) == (
            "VNI 200: no IMET (type-3) route from VTEP 198.19.1.2"
        )
    view = parse_overlay(overlay_line("overlay_node1_no_vxlan200_on_node2"))
    # A VTEP nobody rolled out yet (not expected) is not asked for.
    assert overlay_verdict(view, VNIS, {"198.19.1.3"}) is None
    assert overlay_verdict(view, VNIS, {"198.19.1.2", "198.19.1.9"}) == (
        "VNI 100: no IMET (type-3) route from VTEP 198.19.1.9; "
        "VNI 200: no IMET (type-3) route from VTEP 198.19.1.2, 198.19.1.9"
    )


def test_frr_down_is_a_reason_not_a_crash() -> None:
    view = parse_overlay(overlay_line("overlay_node2_frr_stopped"))
    assert view.zebra_vnis is None and view.imets is None
    assert overlay_verdict(view, VNIS, set()) == (
        "FRR's EVPN VNI tables could not be read (zebra/bgpd not answering)"
    )
    assert overlay_verdict(parse_overlay(""), VNIS, set()) is not None


def test_without_advertise_all_vni_only_the_vxlan_devices_count() -> None:
    """No ``advertise-all-vni``: FRR holds no VNI and advertises no IMET route."""
    view = parse_overlay(overlay_line("overlay_node2"))
    bare = OverlayView(None, None, None, view.links, view.link_locals)
    assert overlay_verdict(bare, VNIS, {"198.19.1.9"}, evpn=False) is None
    assert overlay_verdict(bare, VNIS, set()) is not None  # with EVPN the FRR tables are required
    down = parse_overlay(overlay_line("overlay_node2_vxlan100_down"))
    assert overlay_verdict(down, (100,), set(), evpn=False) == "VNI 100: vxlan100 is down"
    node1 = RolledOutVtep("198.18.0.11", "node1", "198.19.1.1", "fe80::1", 8950)
    assert "advertise-all-vni off" in str(plan_probe((node1,), VNIS, 8950, "fe80::2", evpn=False))


def test_an_imet_route_belongs_to_the_vni_importing_its_route_target() -> None:
    view = parse_overlay(overlay_line("overlay_node1"))
    # Import RTs unknown (none printed): FRR's auto RT <AS>:<VNI> decides.
    no_rts = OverlayView(
        view.zebra_vnis,
        dict.fromkeys(view.bgp_vnis or {}, frozenset()),
        view.imets,
        view.links,
        view.link_locals,
    )
    assert imet_seen(no_rts) == {100: ALL, 200: ALL}
    # A route target imported by neither VNI counts for neither.
    other = OverlayView(
        view.zebra_vnis, {100: frozenset({"65000:999"})}, view.imets, view.links, view.link_locals
    )
    assert imet_seen(other) == {100: set()}


def test_the_apply_discovery_carries_the_same_view() -> None:
    text = (OVERLAY_FIXTURES / "discover_node2.txt").read_text()
    line = overlay_of(text)
    assert line is not None
    view = parse_overlay(line)
    assert overlay_verdict(view, VNIS, _others("198.19.1.2")) is None
    assert overlay_of(text.replace(line.split("\t")[0], "")) is None  # bgpd down: no section


def test_the_loop_prints_one_tab_separated_line_per_poll(tmp_path: Path) -> None:
    for tool, doc in (("vtysh", '{\n  "100":{"vni":100}\n}\n{"x":1}\n{}'), ("ip", '[{"ifname":"lo"}]\n')):
        (tmp_path / tool).write_text(f"#!/bin/sh\nprintf '%s' '{doc}'\n")
        (tmp_path / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["sh", "-c", overlay_loop_script(0.01, 3)], env=env, capture_output=True, text=True, timeout=10
    )
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 3
    view = parse_overlay(lines[0])
    assert view.zebra_vnis == {100: ""} and view.bgp_vnis == {} and view.imets == ()
    assert "lo" in view.links


def test_rolled_out_vteps_and_the_settle_deadline() -> None:
    a = RolledOutVtep("198.18.0.11", "node1", "198.19.1.1", "fe80::1", 8950, since=100.0)
    b = RolledOutVtep("198.18.0.12", "node2", "198.19.1.2", "", 8950, since=105.0)
    r = RolledOut((a,))
    r.add(b)
    assert r.others("198.18.0.11", "198.19.1.1") == (b,)
    assert r.others("198.18.0.13", "198.19.1.3") == (a, b)
    r.discard("198.18.0.12")
    assert r.others("198.18.0.13", "198.19.1.3") == (a,)
    assert settle_deadline(90.0, (a,), 10) == 110.0  # a counted after the check began
    assert settle_deadline(120.0, (a, b), 10) == 130.0
    assert settle_deadline(120.0, (), 10) == 130.0


def test_the_probe_runs_at_the_smaller_overlay_mtu_of_the_pair() -> None:
    node3 = RolledOutVtep("198.18.0.13", "node3 (198.18.0.13)", "198.19.1.3", "fe80::3", 1450)
    no_ll = RolledOutVtep("198.18.0.12", "node2", "198.19.1.2", "", 8950)
    plan = plan_probe((no_ll, node3), VNIS, 8950, "fe80::1")
    assert isinstance(plan, ProbePlan)
    assert (plan.target, plan.bridge, plan.mtu, plan.payload) == (node3, "br100", 1450, 1402)
    script = probe_script(plan, deadline_s=18)
    assert "$(ping -6 -n -c 1 -i 0.2 -w 3 -M do -s 1402 fe80::3%br100 2>&1)" in script
    assert "while [ $i -lt 6 ]" in script  # 18 s in rounds of 3 s
    none = plan_probe((no_ll,), VNIS, 8950, "fe80::1")
    assert none == "no other VTEP with an overlay address rolled out yet"
    assert "no IPv6 link-local" in str(plan_probe((node3,), VNIS, 8950, ""))
    assert plan_probe((node3,), (), 8950, "fe80::1") == "no VNI configured"


def test_ping_output_gives_the_rtt_or_none() -> None:
    pings = re.split(r"\n(?=ping )", (OVERLAY_FIXTURES / "ping_outputs.txt").read_text())
    ok = next(p for p in pings if "-s 8902" in p)
    assert probe_rtt_ms(ok) == 0.113
    lost = next(p for p in pings if "100% packet loss" in p)
    assert probe_rtt_ms(lost) is None
    plan = ProbePlan(RolledOutVtep("x", "node2 (198.18.0.12)", "198.19.1.2", "fe80::2", 8950), "br100", 8950)
    assert probe_message(plan, 0.113, 0.31) == (
        "DF ping 8950 B over br100 to node2 (198.18.0.12) (fe80::2): rtt 0.113 ms, answered after 0.31 s"
    )
    assert probe_message(plan, None, 6.0).endswith("no reply after 6.0 s")


# -- the node apply: a failing check fails the node with the reason ------------------------------


def _rollout(rolled_out: RolledOut | None = None) -> NodeRollout:
    target = NodeTarget(node_ip="198.18.0.12", fqdn="node2", password="x")
    opts = RolloutOptions(verify_timeout=5, verify_interval=0.1, settle_timeout=0.01)
    assert VTEP == "198.19.1.2"
    return NodeRollout(target, INTENT, VTEP, options=opts, rolled_out=rolled_out)


async def test_a_node_missing_a_vni_fails_naming_node_and_vni() -> None:
    run = _rollout()
    assert INTENT.vnis == (100,)  # node2's recorded discovery: nothing to change for VNI 100
    bad = overlay_line("overlay_node2_vxlan100_down")
    s = RecordingSession(_applied_discovery(None), polls=[_summary("Established")], overlay=[bad, bad])
    with pytest.raises(FabricVerifyFailed) as exc:
        await run._apply_with(s, None)
    assert exc.value.message == "node2 (198.18.0.12): VNI 100: vxlan100 is down after 0 s"


async def test_a_node_missing_the_imet_route_of_a_rolled_out_vtep_fails_naming_it() -> None:
    node1 = RolledOutVtep("198.18.0.11", "node1 (198.18.0.11)", "198.19.1.1", "", 8950)
    ghost = RolledOutVtep("198.18.0.19", "node9 (198.18.0.19)", "198.19.1.9", "", 8950)
    run = _rollout(RolledOut((node1, ghost)))
    s = RecordingSession(_applied_discovery(None), polls=[_summary("Established")])  # node2's view
    with pytest.raises(FabricVerifyFailed) as exc:
        await run._apply_with(s, None)
    assert exc.value.message == (
        "node2 (198.18.0.12): VNI 100: no IMET (type-3) route from VTEP 198.19.1.9 after 0 s"
    )


async def test_a_passing_node_is_counted_rolled_out_and_says_what_it_checked() -> None:
    rolled = RolledOut()
    run = _rollout(rolled)
    s = RecordingSession(_applied_discovery(None), polls=[_summary("Established")])
    await run._apply_with(s, None)
    assert run.result.steps[-3:] == ["verified", "overlay_checked", "probe_skipped"]
    assert run.result.checks[0].startswith("1 VNI(s) up (100); no other VTEP rolled out yet after")
    assert run.result.checks[1] == (
        "dataplane probe skipped: no other VTEP with an overlay address rolled out yet"
    )
    (me,) = rolled.others("198.18.0.99", "198.19.1.99")
    assert (me.node_ip, me.vtep_ip) == ("198.18.0.12", "198.19.1.2")
    assert me.link_local == "fe80::1c37:8cff:fe6b:932b"  # br100's, from node2's recorded loop line
