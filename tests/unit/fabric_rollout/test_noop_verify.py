"""A no-op re-apply verifies each node from its discovery exec: the apply's discovery carries the
EVPN summary (when bgpd runs), so a node with nothing to change and the session Established with
routes sent needs no second SSH exec. Anything else still goes through the verify loop."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from karios.fabric_worker.rollout.errors import FabricVerifyFailed
from karios.fabric_worker.rollout.facts import (
    APPLY_DISCOVER_SCRIPT,
    DISCOVER_SCRIPT,
    evpn_summary_of,
    parse_facts,
)
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.node import NodeRollout, RolloutOptions
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from karios.fabric_worker.rollout.ssh import CommandResult
from karios.fabric_worker.rollout.verify import VERIFY_NO_SESSION
from tests.unit.fabric_rollout.lab import discovery_overlay_section, lab_intent, merged_polls, overlay_line

FIX = Path(__file__).parent / "fixtures"
APPLIED_OUT = (FIX / "discover_node2_applied.txt").read_text()
APPLIED = parse_facts(APPLIED_OUT)
SUMMARY = json.loads((FIX / "evpn_summary_node2.json").read_text())
VTEP = APPLIED.vtep_ip or ""
INTENT = lab_intent(
    vxlan_mtu=APPLIED.interfaces[f"vxlan{APPLIED.vxlan_vnis()[0]}"].mtu + 50,
    vnis=list(APPLIED.vxlan_vnis()),
    frr_log_file="/run/frr/frr.log",
)


def _summary(state: str) -> str:
    doc = json.loads(json.dumps(SUMMARY))
    doc["peers"]["198.18.0.1"]["state"] = state
    return json.dumps(doc)


def _applied_discovery(evpn: str | None) -> str:
    """node2's recorded discovery with today's rendered files (nothing to change) and, as the
    apply's discovery prints it, the EVPN summary section and (with it: bgpd runs) the overlay
    section recorded on node2 with its VNIs up and every IMET route in."""
    files = render_node_files(
        INTENT, NodeRenderInput(hostname="node2", vtep_ip=VTEP, underlay_iface="br-underlay")
    ).as_dict()
    out = APPLIED_OUT
    for name, content in files.items():
        out = re.sub(
            rf"(@@karios:file:{re.escape(name)}\n)[^\n]*\n",
            lambda m, c=content: m.group(1) + base64.b64encode(c.encode()).decode() + "\n",
            out,
        )
    evpn_section = "@@karios:evpn\n" + (f"{evpn}\n" if evpn is not None else "")
    overlay = "@@karios:overlay\n" + (f"{discovery_overlay_section()}\n" if evpn is not None else "")
    return out.replace("@@karios:end", evpn_section + overlay + "@@karios:end")


class RecordingSession:
    """Stands in for an SSH session: answers the discovery, records every exec."""

    def __init__(self, discovery: str, polls: list[str], overlay: list[str] | None = None) -> None:
        self.discovery, self.polls, self.execs = discovery, polls, []
        self.overlay = [overlay_line()] if overlay is None else overlay

    async def run(self, command: str, *, input=None, limit_s: float = 60.0, check: bool = True):
        self.execs.append(command)
        assert command == APPLY_DISCOVER_SCRIPT, command[:80]
        return CommandResult(0, self.discovery, "")

    async def lines(self, command: str, *, limit_s: float = 60.0):
        self.execs.append(command)
        merged = merged_polls(command, self.polls, self.overlay)
        for line in (
            merged if merged is not None else self.overlay if "show evpn vni json" in command else self.polls
        ):
            yield line


def _rollout() -> NodeRollout:
    target = NodeTarget(node_ip="198.18.0.12", fqdn="node2", password="x")
    return NodeRollout(target, INTENT, VTEP, options=RolloutOptions(verify_timeout=5, verify_interval=0.1))


async def test_unchanged_established_node_is_verified_by_its_discovery_alone() -> None:
    run = _rollout()
    s = RecordingSession(_applied_discovery(_summary("Established")), polls=[])
    await run._apply_with(s, None)
    assert run.result.steps == ["frr_present", "unchanged", "verified", "overlay_checked"]
    assert not run.result.changed
    assert s.execs == [APPLY_DISCOVER_SCRIPT]  # one SSH exec for the whole no-op


@pytest.mark.parametrize("evpn", [None, _summary("Active")], ids=["bgpd-down", "not-established"])
async def test_unchanged_node_not_yet_established_still_runs_the_verify_loop(evpn: str | None) -> None:
    run = _rollout()
    s = RecordingSession(_applied_discovery(evpn), polls=[_summary("Connect"), _summary("Established")])
    await run._apply_with(s, None)
    assert run.result.steps == ["frr_present", "unchanged", "verified", "overlay_checked", "probe_skipped"]
    # The verify and the overlay checks: ONE exec (a loop whose every poll is one vtysh run).
    assert len(s.execs) == 2 and "show bgp l2vpn evpn summary json" in s.execs[1]
    assert "show bgp l2vpn evpn route type multicast json" in s.execs[1]
    assert s.execs[1].count("vtysh ") == 1


def _fake_node(tmp: Path, *, bgpd_alive: bool) -> tuple[str, dict[str, str]]:
    """APPLY_DISCOVER_SCRIPT against `tmp` standing in for /run/frr and /etc/frr, with a vtysh
    that prints the summary over several lines, as the real one does."""
    (tmp / "run").mkdir()
    (tmp / "etc").mkdir()
    if bgpd_alive:
        (tmp / "run" / "bgpd.pid").write_text(f"{os.getpid()}\n")
    (tmp / "vtysh").write_text(f"#!/bin/sh\ncat {tmp}/summary.json\n")
    (tmp / "vtysh").chmod(0o755)
    (tmp / "summary.json").write_text(json.dumps(SUMMARY, indent=2))
    script = APPLY_DISCOVER_SCRIPT.replace("/run/frr", str(tmp / "run")).replace("/etc/frr", str(tmp / "etc"))
    return script, {**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}"}


@pytest.mark.parametrize("bgpd_alive", [True, False])
def test_apply_discovery_adds_one_summary_line_only_while_bgpd_runs(tmp_path: Path, bgpd_alive: bool) -> None:
    script, env = _fake_node(tmp_path, bgpd_alive=bgpd_alive)
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0
    parse_facts(out.stdout)  # the facts parse as from DISCOVER_SCRIPT
    evpn = evpn_summary_of(out.stdout)
    if bgpd_alive:
        assert evpn is not None and json.loads(evpn) == SUMMARY
    else:
        assert evpn is None
    assert DISCOVER_SCRIPT.rstrip().endswith("@@karios:end'")  # the other users' discovery is unchanged


async def test_a_verify_that_never_saw_a_bgp_tcp_session_says_so() -> None:
    run = _rollout()
    s = RecordingSession(_applied_discovery(None), polls=[VERIFY_NO_SESSION] * 3)
    with pytest.raises(FabricVerifyFailed, match=r"not Established \(no TCP session to port 179\)"):
        await run._apply_with(s, None)
