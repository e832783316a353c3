"""Issue 13 (fabric day 2), the pure parts: preflight's judgement (outliers, largest vxlan_mtu,
blockers), interruptible steps, apply progress that counts the node it reports, the verify
error naming its node, the per-instance FRR log path and the default VNI set."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path

import pytest

from karios.fabric_worker.rollout import judge
from karios.fabric_worker.rollout.facts import parse_facts
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.jobs import ApplyJob, RolloutEvent
from karios.fabric_worker.rollout.node import NodeEvent, NodeResult
from karios.fabric_worker.rollout.preflight import PreflightNode, resolve_node, summarize
from karios.fabric_worker.rollout.render import NodeRenderInput, frr_log_path, render_node_files
from karios.fabric_worker.rollout.steps import (
    FENCED_EXIT,
    INTERRUPT_STEP_SCRIPT,
    STEP_DIR,
    STEP_PIDFILE,
    STEP_PIDFILE_NO_FRR,
    interrupt_step_script,
    step_command,
)
from karios.fabric_worker.settings import FabricWorkerSettings
from tests.unit.fabric_rollout.lab import lab_intent

FIX = Path(__file__).parent / "fixtures"
FRESH = parse_facts((FIX / "discover_node1_fresh.txt").read_text())
INTENT = lab_intent()


def _node(i: int, mtu: int, mode: str = "reuse") -> judge.NodeSeen:
    return judge.NodeSeen(
        node_ip=f"198.18.0.{10 + i}", fqdn=f"node{i}", mode=mode, bridge="br-underlay", bridge_mtu=mtu
    )


# -- judgement ------------------------------------------------------------------------------


def test_the_1500_node_is_the_outlier_and_bounds_the_vxlan_mtu() -> None:
    nodes = [_node(1, 9000), _node(2, 9000), _node(3, 1500)]
    assert [(n.fqdn, n.bridge_mtu) for n in judge.mtu_outliers(nodes)] == [("node3", 1500)]
    assert judge.max_vxlan_mtu(nodes) == 1500
    found = judge.blockers(nodes, vxlan_mtu=9000)
    assert [(b.kind, b.field, b.node_ip, b.mtu) for b in found] == [("mtu", "vxlan_mtu", "198.18.0.13", 1500)]
    assert found[0].message == "node3 (198.18.0.13) underlay br-underlay MTU 1500 is below vxlan_mtu 9000"
    assert judge.blockers(nodes, vxlan_mtu=1500) == []


def test_a_tie_names_the_smaller_mtus_and_agreement_names_nobody() -> None:
    assert [n.fqdn for n in judge.mtu_outliers([_node(1, 9000), _node(2, 1500)])] == ["node2"]
    assert judge.mtu_outliers([_node(1, 9000), _node(2, 9000)]) == []
    assert judge.max_vxlan_mtu([_node(1, 0, "unreachable")]) == 0


def test_unreachable_unresolved_nodes_and_a_full_pool_are_blockers() -> None:
    down = _node(4, 0, "unreachable").model_copy(update={"reason": "SSH connect timed out after 5 s"})
    odd = _node(5, 0, "needs_override").model_copy(update={"reason": "no interface in 198.18.0.0/24"})
    found = judge.blockers([down, odd], vxlan_mtu=9000, capacity=2, needed=5, prefix_len=30)
    assert [(b.kind, b.node_ip) for b in found] == [
        ("unreachable", "198.18.0.14"),
        ("needs_override", "198.18.0.15"),
        ("pool_headroom", ""),
    ]
    assert "node4 (198.18.0.14) was unreachable in preflight: SSH connect timed out" in found[0].message
    assert found[2].message.startswith("the VTEP pool /30 holds 2 addresses, 3 fewer than the 5 nodes")
    text = judge.headline(found, 1500)
    assert text.startswith("apply refused by the last preflight (3 blocker(s))") and "force" in text


def test_a_refusal_of_a_large_fabric_names_the_first_blockers_and_counts_them_all() -> None:
    # Issue 28: 1,000 unreachable nodes made a 448 KB 409 (every message twice). The count is
    # exact, the message and details.blockers are bounded, the largest vxlan_mtu is kept.
    found = judge.blockers([_node(i, 0, "unreachable") for i in range(1000)], vxlan_mtu=9000)
    text = judge.headline(found, 1500)
    details = judge.refusal_details(found, 1500)
    assert text.startswith("apply refused by the last preflight (1000 blocker(s))")
    assert f"and {1000 - judge.NAMED_IN_MESSAGE} more (details.blockers)" in text
    assert "node0 (198.18.0.10)" in text and f"node{judge.NAMED_IN_MESSAGE} " not in text
    assert details["blockers_total"] == 1000 and details["max_vxlan_mtu"] == 1500
    assert [b["node_ip"] for b in details["blockers"]] == [
        b.node_ip for b in found[: judge.LISTED_IN_DETAILS]
    ]
    assert len(text) < 2_000 and len(str(details)) < 40_000
    # A few blockers are all named and listed, as before.
    few = found[:3]
    assert all(b.message in judge.headline(few, 0) for b in few) and "more" not in judge.headline(few, 0)
    assert judge.refusal_details(few, 0)["blockers_total"] == 3


def test_preflight_summary_names_outliers_largest_mtu_and_blockers_keeping_the_seed_fields() -> None:
    a = resolve_node(NodeTarget(node_ip="198.18.0.11", fqdn="node1"), FRESH, "198.18.0.0/24", None)
    b = a.model_copy(update={"node_ip": "198.18.0.12", "fqdn": "node2"})
    c = a.model_copy(update={"node_ip": "198.18.0.13", "fqdn": "node3", "bridge_mtu": 1500})
    r = summarize(
        [a, b, c],
        underlay_cidr="198.18.0.0/24",
        overrides=[],
        router_id_base="198.19.1.1",
        router_id_prefix_len=24,
        expected_nodes=0,
        vxlan_mtu=9000,
    )
    # The seed's contract: disagreement → underlay_mtu 0 and every pair in mtu_drift.
    assert r.underlay_mtu == 0 and len(r.mtu_drift) == 3
    assert not r.ready  # every node is reuse, but node3's MTU blocks the apply (issue 23 item 10)
    assert r.max_vxlan_mtu == 1500
    assert [(o.fqdn, o.bridge_mtu) for o in r.mtu_outliers] == [("node3", 1500)]
    assert [(b.kind, b.node_ip, b.mtu) for b in r.blockers] == [("mtu", "198.18.0.13", 1500)]
    unjudged = summarize(
        [a, c],
        underlay_cidr="198.18.0.0/24",
        overrides=[],
        router_id_base="198.19.1.1",
        router_id_prefix_len=24,
        expected_nodes=0,
    )
    assert unjudged.blockers == [] and unjudged.max_vxlan_mtu == 1500


def test_an_unreachable_node_in_preflight_is_a_blocker() -> None:
    down = PreflightNode(node_ip="198.18.0.99", mode="unreachable", reason="SSH connect timed out")
    r = summarize(
        [down],
        underlay_cidr="198.18.0.0/24",
        overrides=[],
        router_id_base="198.19.1.1",
        router_id_prefix_len=24,
        expected_nodes=0,
        vxlan_mtu=9000,
    )
    assert [(b.kind, b.node_ip) for b in r.blockers] == [("unreachable", "198.18.0.99")]


# -- interruptible steps --------------------------------------------------------------------


def _local(script: str, tmp_path: Path) -> str:
    """The node-side script with its pid files under `tmp_path` (never the host's /run)."""
    script = script.replace(STEP_PIDFILE, str(tmp_path / "step.pid"))
    script = script.replace(STEP_PIDFILE_NO_FRR, str(tmp_path / "no-frr.pid"))
    return script.replace(f"[ -d {STEP_DIR} ]", f"[ -d {tmp_path} ]")


def test_a_step_keeps_stdin_and_exit_status_and_clears_its_pidfile(tmp_path: Path) -> None:
    pidfile = tmp_path / "step.pid"
    wrapped = _local(step_command("cat > " + str(tmp_path / "out") + " && exit 3"), tmp_path)
    res = subprocess.run(["sh", "-c", wrapped], input="hello\n", text=True, capture_output=True, timeout=10)
    assert res.returncode == 3
    assert (tmp_path / "out").read_text() == "hello\n"
    assert not pidfile.exists()
    # Before FRR is installed (no /run/frr) the step records itself in /run instead.
    assert step_command("true").startswith(f"f={STEP_PIDFILE}; [ -d {STEP_DIR} ] || f={STEP_PIDFILE_NO_FRR};")


def test_interrupt_kills_the_running_step_and_reports_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "step.pid"
    wrapped = _local(step_command("sleep 30"), tmp_path)
    proc = subprocess.Popen(["sh", "-c", wrapped], start_new_session=True)  # as sshd: own session
    try:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        reaper = threading.Thread(target=proc.wait)  # as sshd reaps its child (no zombie)
        reaper.start()
        script = _local(INTERRUPT_STEP_SCRIPT, tmp_path)
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
        assert out.stdout.strip() == "interrupted"
        reaper.join(timeout=5)
        assert proc.returncode not in (None, 0)
        assert not pidfile.exists()
        again = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
        assert again.stdout.strip() == ""  # nothing running: nothing to interrupt
    finally:
        proc.kill()


def test_a_step_that_starts_after_the_rollback_looked_for_it_does_not_run(tmp_path: Path) -> None:
    # sshd may fork a step the client sent just before the cancel only after the rollback ran its
    # interrupt: with the apply's fence token written first, that late step exits untouched.
    done = tmp_path / "changed"
    interrupt = _local(interrupt_step_script("run-a"), tmp_path)
    out = subprocess.run(["sh", "-c", interrupt], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and out.stdout.strip() == ""
    late = subprocess.run(
        ["sh", "-c", _local(step_command(f"touch {done}", fence="run-a"), tmp_path)],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert late.returncode == FENCED_EXIT and "fenced" in late.stderr
    assert not done.exists()
    # The rollback's own steps (no token) and a later apply (another token) run normally.
    for cmd in (step_command(f"touch {done}"), step_command(f"touch {done}.b", fence="run-b")):
        assert subprocess.run(["sh", "-c", _local(cmd, tmp_path)], timeout=10).returncode == 0
    assert done.exists() and (tmp_path / "changed.b").exists()


def test_a_package_install_step_is_waited_for_never_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "step.pid"
    done = tmp_path / "done"
    wrapped = _local(step_command(f"sleep 0.6 && touch {done}", killable=False), tmp_path)
    proc = subprocess.Popen(["sh", "-c", wrapped], start_new_session=True)
    try:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        reaper = threading.Thread(target=proc.wait)
        reaper.start()
        out = subprocess.run(
            ["sh", "-c", _local(INTERRUPT_STEP_SCRIPT, tmp_path)], capture_output=True, text=True, timeout=10
        )
        assert out.stdout.strip() == "interrupted"
        assert done.exists(), "the interrupt returned before the install step finished"
        reaper.join(timeout=5)
        assert proc.returncode == 0
    finally:
        proc.kill()


# -- apply progress -------------------------------------------------------------------------


class _FakeRollout:
    """Stands in for NodeRollout: reports node_ready the way the real one does."""

    def __init__(self, target: NodeTarget, progress) -> None:  # type: ignore[no-untyped-def]
        self.target = target
        self.vtep_ip = "198.19.1.1"
        self._progress = progress
        self.result = NodeResult(node_ip=target.node_ip, fqdn=target.fqdn)

    async def apply(self, _abort: asyncio.Event | None = None) -> NodeResult:
        self.result.ok = True
        await self._progress(NodeEvent(self.target.node_ip, self.target.fqdn, "node_ready"))
        return self.result

    async def rollback(self) -> None:
        return None

    def needs_recheck(self) -> bool:
        return False

    async def release(self) -> None:
        return None


async def test_node_ready_event_counts_its_own_node_in_progress() -> None:
    targets = [NodeTarget(node_ip=f"198.18.0.{10 + i}", fqdn=f"node{i}") for i in (1, 2, 3, 4)]
    events: list[RolloutEvent] = []

    async def sink(e: RolloutEvent) -> None:
        events.append(e)

    job = ApplyJob(INTENT, targets, {}, concurrency=1, sink=sink)
    job._node = lambda t: _FakeRollout(t, job._on_node)  # type: ignore[method-assign]
    summary = await job.run()
    assert summary.job_status == "completed"
    assert [e.progress for e in events if e.state == "node_ready"] == [25, 50, 75, 100]


# -- defaults -------------------------------------------------------------------------------


def test_frr_log_path_is_per_instance_by_default() -> None:
    s = FabricWorkerSettings(_env_file=None)
    assert frr_log_path(s.frr_log_file, "node2") == "/var/log/frr/frr-node2.log"
    files = render_node_files(
        INTENT, NodeRenderInput(hostname="node2", vtep_ip="198.19.1.2", underlay_iface="br0")
    )
    assert "log file /var/log/frr/frr-node2.log informational" in files.frr_conf
    assert frr_log_path("/run/frr/frr.log", "node2") == "/run/frr/frr.log"  # a fixed path stays fixed


def test_default_vni_set_is_the_first_vni_of_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KARIOS_FABRIC_VNIS", raising=False)
    assert FabricWorkerSettings(_env_file=None).vni_list() == (10000,)
    monkeypatch.setenv("KARIOS_FABRIC_VNIS", "")
    assert FabricWorkerSettings(_env_file=None).vni_list() == ()
