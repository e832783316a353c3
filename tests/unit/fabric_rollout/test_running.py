"""Issue 23 item 4: an apply compares FRR's RUNNING configuration with the rendered file, not only
the file on disk, and repairs what differs (a `vtysh` change, devices deleted by hand).

Fixtures (`fixtures/running/`): rendered ``frr.conf`` of each template variant and the
``show running-config`` FRR 8.4.4 printed after loading it (recorded in the fabric lab)."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

import pytest

from karios.fabric_worker.rollout.facts import (
    APPLY_DISCOVER_SCRIPT,
    RUNNING_CONFIG_COMMAND,
    parse_facts,
    running_config_of,
)
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.node import NodeRollout, RolloutOptions
from karios.fabric_worker.rollout.plan import VTEP_CREATE, FrrAction, FrrPlan
from karios.fabric_worker.rollout.running import (
    RunningDiff,
    config_lines,
    devices_differ,
    repair_plan,
    repairs,
    running_diff,
)
from karios.fabric_worker.rollout.ssh import CommandResult
from tests.unit.fabric_rollout.lab import merged_polls, overlay_line
from tests.unit.fabric_rollout.test_noop_verify import INTENT, VTEP, _applied_discovery, _summary

RUN = Path(__file__).parent / "fixtures" / "running"
VARIANTS = ["base", "ospf_md5_bfd_pw", "ebgp_bfd", "noadv"]
SHUT = " neighbor 198.18.0.1 timers connect 1\n"


def _pair(name: str) -> tuple[str, str]:
    return (RUN / f"{name}.conf").read_text(), (RUN / f"{name}.running").read_text()


@pytest.mark.parametrize("variant", VARIANTS)
def test_frr_running_its_own_rendered_file_is_no_difference(variant: str) -> None:
    """FRR reorders lines, adds its banner/version/forwarding lines and hides defaults (OSPF hello
    10, BFD profile timers, auto-cost 100000): none of that is a difference."""
    conf, running = _pair(variant)
    assert not running_diff(conf, running), running_diff(conf, running)


def test_a_neighbor_shutdown_typed_by_hand_is_named() -> None:
    conf, running = _pair("base")
    hand = running.replace(SHUT, SHUT + " neighbor 198.18.0.1 shutdown\n")
    d = running_diff(conf, hand)
    assert d.added == (("router bgp 65000", "neighbor 198.18.0.1 shutdown"),) and not d.missing
    assert d.message() == "running config differed: neighbor 198.18.0.1 shutdown (added by hand) → reloaded"


def test_a_rendered_line_the_daemons_do_not_run_is_missing_but_a_hidden_default_is_not() -> None:
    conf, running = _pair("base")
    d = running_diff(conf, running.replace("  advertise-all-vni\n", ""))
    assert d.missing == (("router bgp 65000", "address-family l2vpn evpn", "advertise-all-vni"),)
    assert "address-family l2vpn evpn › advertise-all-vni (missing)" in d.describe()
    ospf_conf, ospf_running = _pair("ospf_md5_bfd_pw")
    assert "ip ospf hello-interval 10" in ospf_conf and "hello-interval" not in ospf_running
    # A value changed by hand shows: the non-default line is in the running config, not the file.
    d = running_diff(
        ospf_conf, ospf_running.replace(" ip ospf dead-interval 40\n", " ip ospf dead-interval 7\n")
    )
    assert d.added == (("interface br-underlay", "ip ospf dead-interval 7"),)


def test_a_whole_section_counts_once_and_secrets_never_show() -> None:
    conf, running = _pair("ebgp_bfd")
    hand = running.replace(" neighbor 198.18.0.1 password pw1\n", " neighbor 198.18.0.1 password other\n")
    hand += "router ospf\n ospf router-id 1.2.3.4\n passive-interface default\nexit\n"
    d = running_diff(conf, hand)
    assert d.added == (("router bgp 65000", "neighbor 198.18.0.1 password other"), ("router ospf",))
    assert d.missing == (("router bgp 65000", "neighbor 198.18.0.1 password pw1"),)
    text = d.describe(["pw1"])
    assert "pw1" not in text and "other" not in text and "<redacted>" in text
    assert "ospf router-id" not in text  # inside the added section: named once, by its header


def test_context_keeps_equal_lines_of_different_sections_apart() -> None:
    lines = config_lines(
        "router bgp 1\n address-family ipv4 unicast\n  neighbor x activate\n exit-address-family\n"
    )
    assert ("router bgp 1", "address-family ipv4 unicast", "neighbor x activate") in lines
    assert ("neighbor x activate",) not in lines


def test_repair_plan_reloads_only_when_files_are_right_and_frr_runs_something_else() -> None:
    conf, running = _pair("base")
    stale = running_diff(conf, running.replace(SHUT, SHUT + " neighbor 198.18.0.1 shutdown\n"))
    assert repair_plan(FrrPlan({}, FrrAction.NONE), stale).action is FrrAction.RELOAD
    assert repair_plan(FrrPlan({}, FrrAction.NONE), running_diff(conf, running)).action is FrrAction.NONE
    assert repair_plan(FrrPlan({"daemons": "x"}, FrrAction.RESTART), stale).action is FrrAction.RESTART


def test_devices_differ_names_the_devices_deleted_by_hand() -> None:
    facts = parse_facts(_applied_discovery(None))
    gone = {k: v for k, v in facts.interfaces.items() if k != "vtep0"}
    cmds = [VTEP_CREATE, f"ip addr add {VTEP}/32 dev vtep0", "ip link set vtep0 up"]
    assert devices_differ(cmds, dataclasses.replace(facts, interfaces=gone)) == (
        "devices differed: vtep0 missing → restored"
    )
    assert devices_differ([], facts) == ""


# -- the node apply (recorded discovery, a session that records every exec) ----------------------


class Session:
    """Answers the apply's discovery with `running` as FRR's running config, then every
    `show running-config` with `after` (the config once reloaded); records every exec."""

    def __init__(self, running: str, after: str) -> None:
        self.running, self.after, self.execs = running, after, []

    async def run(self, command: str, *, input=None, limit_s: float = 60.0, check: bool = True):
        self.execs.append(command)
        if command == APPLY_DISCOVER_SCRIPT:
            out = _applied_discovery(_summary("Established")).replace(
                "@@karios:end",
                "@@karios:running\n" + base64.b64encode(self.running.encode()).decode() + "\n@@karios:end",
            )
            assert running_config_of(out) == self.running
            return CommandResult(0, out, "")
        if command == RUNNING_CONFIG_COMMAND:
            return CommandResult(0, self.after, "")
        return CommandResult(0, "", "")

    async def lines(self, command: str, *, limit_s: float = 60.0):
        self.execs.append(command)
        merged = merged_polls(command, [_summary("Established")], [overlay_line()])
        for line in merged or [
            overlay_line() if "show evpn vni json" in command else _summary("Established")
        ]:
            yield line


def _rendered_running() -> str:
    """What FRR prints for node2's rendered file (node1's recording, node2's names)."""
    _, running = _pair("base")
    return running.replace("node1", "node2").replace("198.19.1.1", VTEP)


def _rollout() -> NodeRollout:
    target = NodeTarget(node_ip="198.18.0.12", fqdn="node2", password="x")
    events: list[tuple[str, str]] = []
    run = NodeRollout(target, INTENT, VTEP, options=RolloutOptions(verify_timeout=5, verify_interval=0.1))

    async def progress(e) -> None:
        events.append((e.state, e.message))

    run._progress = progress
    run.events = events  # type: ignore[attr-defined]
    return run


async def test_running_config_equal_to_the_file_stays_a_one_exec_noop() -> None:
    run = _rollout()
    s = Session(_rendered_running(), after="")
    await run._apply_with(s, None)
    assert run.result.steps == ["frr_present", "unchanged", "verified", "overlay_checked"]
    assert not run.result.changed
    assert s.execs == [APPLY_DISCOVER_SCRIPT]
    assert ("node_unchanged", "files, running config and devices equal the intent") in run.events


async def test_a_hand_made_shutdown_is_reloaded_away_although_the_file_is_right() -> None:
    run = _rollout()
    fine = _rendered_running()
    s = Session(fine.replace(SHUT, SHUT + " neighbor 198.18.0.1 shutdown\n"), after=fine)
    await run._apply_with(s, None)
    r = run.result
    assert r.changed and r.frr_action == "reload" and "repaired" in r.steps
    assert r.repaired == ["running config differed: neighbor 198.18.0.1 shutdown (added by hand) → reloaded"]
    commit = next(c for c in s.execs if "frrinit.sh reload" in c)
    assert "/etc/frr/frr.conf" not in commit.replace(".karios-created.json", "")  # no file rewritten
    assert s.execs.count(RUNNING_CONFIG_COMMAND) == 1 and not any("frrinit.sh restart" in c for c in s.execs)
    committing = dict(run.events)["node_committing"]
    assert "neighbor 198.18.0.1 shutdown (added by hand) → reloaded" in committing


async def test_a_reload_that_does_not_take_is_followed_by_a_restart() -> None:
    run = _rollout()
    hand = _rendered_running().replace(SHUT, SHUT + " neighbor 198.18.0.1 shutdown\n")
    s = Session(hand, after=hand)  # frr-reload could not apply the delta
    await run._apply_with(s, None)
    assert run.result.frr_action == "restart"
    assert any("frrinit.sh restart" in c for c in s.execs)
    assert run.result.repaired[-1] == "a reload left neighbor 198.18.0.1 shutdown (added by hand) → restarted"


def test_repairs_are_named_only_when_no_file_is_written() -> None:
    facts = parse_facts(_applied_discovery(None))
    stopped = dataclasses.replace(facts, frr_pids={})
    assert repairs(FrrPlan({}, FrrAction.START), [], stopped, RunningDiff(), []) == [
        "FRR was not running → started"
    ]
    assert (
        repairs(
            FrrPlan({"frr.conf": "x"}, FrrAction.RELOAD), ["ip link set vtep0 up"], facts, RunningDiff(), []
        )
        == []
    )
