"""Issue 23 item 4: an apply repairs what drift finds, on real FRR (the fabric lab: 3 namespace
nodes with sshd + FRR, a route reflector). One test per kind of hand change on node2, each made
after a clean apply:

1. ``vtysh … neighbor <rr> shutdown`` (the file on disk still equals the rendered one),
2. vtep0 deleted,
3. a VXLAN device deleted.

Each: the change → the drift check (``drift.judge_drift`` on a read-only look at the node, as a
drift round makes it) reports it → a whole apply → completed (not partial), node2 repaired and
saying what it repaired, the other nodes unchanged → Established at the RR and the drift check
clean on every node → a second apply is a no-op again.

Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from karios.fabric_worker.rollout import ApplyJob, FabricIntent, NodeTarget, RolloutOptions, allocate_vteps
from karios.fabric_worker.rollout.drift import judge_drift, parse_remote_vteps, remote_vteps_command
from karios.fabric_worker.rollout.facts import DISCOVER_SCRIPT, EVPN_SUMMARY_COMMAND, parse_facts
from tests.fixtures.wait import wait_until_sync

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
OPTS = RolloutOptions(connect_timeout=5, verify_timeout=30, verify_interval=0.3)
INTENT = FabricIntent(
    asn=65000,
    peer_ip=fabric_lab.FABRIC_IP,
    router_id_base="198.19.1.1",
    router_id_prefix_len=24,
    underlay_cidr="198.18.0.0/24",
    vxlan_mtu=9000,
    vnis=[100, 200],
    frr_log_file="/run/frr/frr.log",
)
NODE2 = fabric_lab.underlay_ip(2)
SHUT = "vtysh -c 'configure terminal' -c 'router bgp 65000' -c 'neighbor {peer} shutdown'"


@pytest.fixture(scope="module")
def lab():
    fabric_lab.require_lab()
    with fabric_lab.FabricLab(n_nodes=3, prefix="kr4") as lab:
        yield lab


@pytest.fixture(scope="module")
def targets(lab) -> list[NodeTarget]:
    key = Path(lab.client_key_path).read_text()
    return [
        NodeTarget(node_ip=n.underlay_ip, fqdn=n.name, private_key=key, known_host_key=n.host_public_key)
        for n in lab.nodes
    ]


def vteps(targets: list[NodeTarget]) -> dict[str, str]:
    return allocate_vteps(INTENT, [t.node_ip for t in targets])


def sh(lab, node, cmd: str) -> str:
    return lab.node_exec(node, cmd).stdout


def drift_kinds(lab, targets: list[NodeTarget]) -> dict[str, set[str]]:
    """Every node's drift findings (their kinds), judged as a drift round judges them."""
    vtep = vteps(targets)
    out = {}
    for n in lab.nodes:
        facts = parse_facts(sh(lab, n, DISCOVER_SCRIPT))
        summary = sh(lab, n, EVPN_SUMMARY_COMMAND) if facts.frr_running else ""
        remote = parse_remote_vteps(sh(lab, n, remote_vteps_command(INTENT.vnis)))
        d = judge_drift(
            n.underlay_ip,
            facts,
            summary,
            INTENT,
            vtep_ip=vtep[n.underlay_ip],
            remote_vteps=remote,
            expected_vteps=set(vtep.values()) - {vtep[n.underlay_ip]},
        )
        out[n.name] = set(d.kinds)
    return out


def wait_drift(lab, targets, want, what: str) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}

    def check() -> bool:
        seen.update(drift_kinds(lab, targets))
        return want(seen)

    try:
        wait_until_sync(check, timeout=30, interval=0.5, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; drift seen: {seen}") from None
    return seen


async def apply(targets: list[NodeTarget], events: list | None = None):
    async def sink(e) -> None:
        if events is not None:
            events.append(e)

    return await ApplyJob(INTENT, targets, vteps(targets), options=OPTS, sink=sink).run()


def clean(seen: dict[str, set[str]]) -> bool:
    return all(not kinds for kinds in seen.values())


@pytest.fixture
async def applied(lab, targets):
    """A clean fabric before each test: applied, Established, no drift on any node."""
    summary = await apply(targets)
    assert summary.job_status == "completed", summary
    wait_drift(lab, targets, clean, "no drift after the apply")
    return targets


async def repaired_by_an_apply(lab, targets, change: str) -> str:
    """A whole apply after the hand change: completed, node2 repaired (its node_ready message is
    returned), the others unchanged; then Established at the RR, drift clean, a no-op re-apply."""
    events: list = []
    summary = await apply(targets, events)
    assert (summary.job_status, summary.completed_nodes) == ("completed", 3), summary
    changed = {n.node_ip for n in summary.nodes if n.changed}
    assert changed == {NODE2}, (change, summary.nodes)
    ready = [e.message for e in events if e.state == "node_ready" and e.node_ip == NODE2]
    assert wait_until_sync(
        lambda: set(lab.rr_evpn_peer_states().values()) == {"Established"},
        timeout=20,
        interval=0.3,
        what="every node Established at the RR",
    )
    wait_drift(lab, targets, clean, f"no drift after the apply that repaired {change}")
    again: list = []
    summary = await apply(targets, again)
    assert summary.job_status == "completed" and not any(n.changed for n in summary.nodes), summary.nodes
    assert "node_committing" not in [e.state for e in again]
    return ready[0]


async def test_a_neighbor_shutdown_typed_by_hand_is_reloaded_away(lab, applied) -> None:
    pids = sh(lab, 2, "cat /run/frr/zebra.pid /run/frr/bgpd.pid")
    conf = sh(lab, 2, "stat -c %Y.%i /etc/frr/frr.conf")
    assert lab.node_exec(2, SHUT.format(peer=fabric_lab.FABRIC_IP)).returncode == 0
    # "bgp session" (or "bgp shutdown", where drift names an administrative shutdown as such)
    seen = wait_drift(
        lab, applied, lambda s: s["node2"] & {"bgp session", "bgp shutdown"}, "drift: the session on node2"
    )
    assert "frr config" not in seen["node2"]  # the file on disk still equals the rendered one

    ready = await repaired_by_an_apply(lab, applied, "the shutdown")
    repaired, _, checked = ready.partition("; 2 VNI(s) up")  # then the post-deploy checks
    assert repaired == (
        "FRR reload; running config differed: neighbor 198.18.0.1 shutdown (added by hand) → reloaded"
    )
    assert checked, ready
    assert "shutdown" not in sh(lab, 2, "vtysh -c 'show running-config'")
    # Repaired by a reload: no daemon restarted, the file not rewritten.
    assert sh(lab, 2, "cat /run/frr/zebra.pid /run/frr/bgpd.pid") == pids
    assert sh(lab, 2, "stat -c %Y.%i /etc/frr/frr.conf") == conf


async def test_a_deleted_vtep0_is_recreated(lab, applied) -> None:
    assert lab.node_exec(2, "ip link del vtep0").returncode == 0
    wait_drift(lab, applied, lambda s: "vtep0 missing" in s["node2"], "drift: vtep0 missing on node2")

    ready = await repaired_by_an_apply(lab, applied, "vtep0")
    assert "devices differed: vtep0 missing → restored" in ready, ready
    assert "198.19.1.2/32" in sh(lab, 2, "ip -br addr show vtep0")


async def test_a_deleted_vxlan_device_and_bridge_are_recreated(lab, applied) -> None:
    assert lab.node_exec(2, "ip link del vxlan100 && ip link del br200").returncode == 0
    wait_drift(lab, applied, lambda s: "vxlan" in s["node2"], "drift: vxlan on node2")

    ready = await repaired_by_an_apply(lab, applied, "vxlan100 and br200")
    assert "vxlan100 missing" in ready and "br200 missing" in ready, ready
    assert "master br100" in sh(lab, 2, "ip -d link show vxlan100")
    assert "master br200" in sh(lab, 2, "ip -d link show vxlan200")
