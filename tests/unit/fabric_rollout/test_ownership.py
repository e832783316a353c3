"""What Karios created on a node (issue 23 item 9): what an apply records, what a teardown
deletes, the rule for nodes without a record, and the rollback keeping what was there before."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from karios.fabric_worker.rollout.facts import (
    RECORD_NAME,
    RECORD_PATH,
    Interface,
    NodeFacts,
    facts_from_dict,
    facts_to_dict,
    parse_facts,
)
from karios.fabric_worker.rollout.ownership import (
    MARKER,
    foreign_devices,
    ownership,
    record_after_apply,
    teardown_message,
    teardown_plan,
    with_record,
)
from karios.fabric_worker.rollout.plan import (
    DesiredNetwork,
    FrrAction,
    baseline_network,
    commit_script,
    frr_plan,
    frr_rollback_plan,
    network_commands,
)
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from tests.unit.fabric_rollout.lab import lab_intent

FIX = Path(__file__).parent / "fixtures"
FRESH = dataclasses.replace(parse_facts((FIX / "discover_node1_fresh.txt").read_text()), boot_id="boot-a")
APPLIED = dataclasses.replace(parse_facts((FIX / "discover_node2_applied.txt").read_text()), boot_id="boot-a")
VTEP = "198.19.1.2"
VNIS = (100, 200)


def _with(facts: NodeFacts, *ifaces: Interface, **changes) -> NodeFacts:
    return dataclasses.replace(facts, interfaces=facts.interfaces | {i.name: i for i in ifaces}, **changes)


def _bridge(name: str) -> Interface:
    return Interface(name=name, kind="bridge", mtu=1500, up=True)


def _vxlan(vni: int, master: str = "", local: str = VTEP) -> Interface:
    return Interface(f"vxlan{vni}", "vxlan", 1450, True, master=master, vxlan_id=vni, vxlan_local=local)


# The operator's own devices on a node before Karios's first apply: a VXLAN device on the very
# address Karios will use as VTEP (the old apply deleted it as "not wanted") and a bridge named
# like Karios's for VNI 100.
HAND_MADE = (_vxlan(999, "br999"), _bridge("br999"), _bridge("br100"))
BEFORE = _with(FRESH, *HAND_MADE)
FILES = {"daemons": f"# {MARKER}.\n", "frr.conf": f"! {MARKER}\n", "vtysh.conf": "service x\n"}


def _want(facts: NodeFacts, vnis=VNIS) -> DesiredNetwork:
    """As the apply builds it (`NodeRollout._desired`)."""
    return DesiredNetwork(
        vtep_ip=VTEP, vnis=vnis, overlay_mtu=1450, managed_vnis=vnis, keep=foreign_devices(facts, vnis)
    )


def _applied_from(before: NodeFacts, vnis=VNIS) -> tuple[NodeFacts, list[str], dict]:
    """The node after an apply of `vnis`: its facts (devices, files, record) and the commit."""
    net = network_commands(before, _want(before, vnis))
    plan = with_record(frr_plan(before, FILES), before, vnis, net)
    record = plan.state[RECORD_NAME]
    deleted = {c.split()[3] for c in net if c.startswith("ip link del ")}
    ifs = {n: i for n, i in before.interfaces.items() if n not in deleted}
    ifs |= {"vtep0": Interface("vtep0", "veth", 1500, True, ipv4=(f"{VTEP}/32",))}
    for v in vnis:
        ifs[f"br{v}"] = ifs.get(f"br{v}") or _bridge(f"br{v}")
        ifs[f"vxlan{v}"] = _vxlan(v, f"br{v}")
    after = dataclasses.replace(
        before, interfaces=ifs, files=dict(FILES), record=record, frr_pids={"zebra": 1, "bgpd": 2}
    )
    return after, net, json.loads(record or "")


# -- what an apply records ----------------------------------------------------------------------


def test_an_apply_records_only_the_devices_it_creates_and_leaves_hand_made_ones_alone() -> None:
    after, net, rec = _applied_from(BEFORE)
    assert not [c for c in net if "999" in c]  # the hand-made VXLAN on our VTEP address stays
    old = network_commands(BEFORE, dataclasses.replace(_want(BEFORE), keep=frozenset()))
    assert "ip link del vxlan999" in old  # what the apply did before (the bug)
    assert rec["devices"] == ["br200", "vtep0", "vxlan100", "vxlan200"]  # not br100: it was there
    assert rec["files"] == {"daemons": None, "frr.conf": None, "vtysh.conf": None}
    assert (rec["boot_id"], rec["frr_was_running"], rec["version"]) == ("boot-a", False, 1)
    assert ownership(after, VNIS).devices == {"br200", "vtep0", "vxlan100", "vxlan200"}


def test_a_later_apply_keeps_what_karios_made_before_and_drops_what_it_removes() -> None:
    after, _, _ = _applied_from(BEFORE)
    again, net, rec = _applied_from(after, (200, 300))
    # VNI 100 left the intent: Karios's vxlan100 goes, the operator's br100 stays.
    assert "ip link del vxlan100" in net and "ip link del br100" not in net
    assert rec["devices"] == ["br200", "br300", "vtep0", "vxlan200", "vxlan300"]
    # A no-op apply writes no record at all; one that commits keeps the earlier entries.
    assert ownership(again, (200, 300)).devices == set(rec["devices"])


def test_an_operators_frr_files_and_running_frr_are_remembered_not_claimed() -> None:
    before = dataclasses.replace(
        BEFORE, files=BEFORE.files | {"vtysh.conf": "! mine\n"}, frr_pids={"watchfrr": 1, "zebra": 2}
    )
    after, _, rec = _applied_from(before)
    assert rec["files"] == {"daemons": None, "frr.conf": None, "vtysh.conf": "! mine\n"}
    assert rec["frr_was_running"] is True
    # The next apply keeps the original, not what Karios wrote over it.
    changed = dataclasses.replace(after, files=after.files | {"frr.conf": "old\n"})
    rec2 = json.loads(record_after_apply(changed, VNIS, [], {"frr.conf": "new\n"}))
    assert rec2["files"]["vtysh.conf"] == "! mine\n" and rec2["frr_was_running"] is True


def test_recorded_devices_count_only_in_the_boot_that_made_them() -> None:
    after, _, _ = _applied_from(BEFORE)
    rebooted = dataclasses.replace(after, boot_id="boot-b")  # same names, made by someone else now
    own = ownership(rebooted, VNIS)
    assert own.devices == frozenset() and own.files == {n: None for n in FILES}
    assert teardown_plan(rebooted, VNIS).net == (f"rm -f {RECORD_PATH}",)


# -- nodes without a record (an older version applied them) -------------------------------------


def test_no_record_falls_back_to_exact_names_and_the_intents_vnis_only_with_karios_header() -> None:
    legacy = _with(APPLIED, _vxlan(999, "br999"), _bridge("br999"), _bridge("br300"))
    own = ownership(legacy, (100, 300))
    assert (own.source, own.devices) == ("legacy", {"vtep0", "vxlan100", "br100"})
    assert own.files == {"daemons": None, "frr.conf": None, "vtysh.conf": None}
    assert ownership(legacy, (200,)).devices == {"vtep0"}  # other VNIs: not Karios's by this rule
    unmarked = dataclasses.replace(legacy, files={"daemons": None, "frr.conf": "mine\n", "vtysh.conf": None})
    assert ownership(unmarked, (100,)).devices == frozenset()
    corrupt = dataclasses.replace(legacy, record="{not json")
    assert ownership(corrupt, (100,)).source == "legacy"


def test_the_first_apply_on_an_old_node_records_the_old_devices_as_karios() -> None:
    rec = json.loads(record_after_apply(APPLIED, (100,), [], ["frr.conf"]))
    assert rec["devices"] == ["br100", "vtep0", "vxlan100"]
    assert rec["files"] == {"daemons": None, "frr.conf": None, "vtysh.conf": None}
    assert rec["frr_was_running"] is False  # Karios started the FRR it found running


# -- teardown -----------------------------------------------------------------------------------


def test_teardown_deletes_only_recorded_devices_and_puts_nothing_else_at_risk() -> None:
    after, _, _ = _applied_from(BEFORE)
    plan = teardown_plan(after, VNIS)
    assert plan.net == (
        "ip link del vxlan100",
        "ip link del vxlan200",
        "ip link del br200",
        "ip link del vtep0",
        f"rm -f {RECORD_PATH}",
    )
    assert plan.steps == (
        "frr_stopped",
        "frr_config_removed",
        "vxlan100_removed",
        "vxlan200_removed",
        "br200_removed",
        "vtep0_removed",
    )
    assert plan.kept == ("br100", "vxlan999", "br999")
    assert (plan.frr.action, plan.frr.writes) == (FrrAction.STOP, {n: None for n in FILES})
    assert teardown_message(plan) == (
        "fabric removed from node; kept br100, vxlan999, br999 (not created by Karios)"
    )
    script, _ = commit_script(plan.frr, plan.net, net_first=False)
    lines = script.splitlines()
    assert lines[1].endswith("frrinit.sh stop") and lines[-1] == f"rm -f {RECORD_PATH}"
    assert lines.index("ip link del vxlan100") > max(i for i, x in enumerate(lines) if "frr.conf" in x)


def test_teardown_puts_the_operators_file_back_and_restarts_the_frr_it_found() -> None:
    before = dataclasses.replace(
        BEFORE, files=BEFORE.files | {"vtysh.conf": "! mine\n"}, frr_pids={"zebra": 1}
    )
    after, _, _ = _applied_from(before)
    plan = teardown_plan(after, VNIS)
    assert plan.frr.writes == {"daemons": None, "frr.conf": None, "vtysh.conf": "! mine\n"}
    assert plan.frr.action is FrrAction.RESTART
    assert (
        plan.steps[:2] == ("frr_config_removed", "frr_config_restored") and plan.steps[-1] == "frr_restarted"
    )
    script, data = commit_script(plan.frr, plan.net, net_first=False)
    assert "! mine" in data and "! mine" not in script  # content over stdin, never argv


def test_teardown_of_a_node_karios_never_touched_changes_nothing_not_even_its_frr() -> None:
    node = dataclasses.replace(_with(FRESH, *HAND_MADE), frr_pids={"zebra": 1, "bgpd": 2})
    plan = teardown_plan(node, VNIS)
    assert (plan.net, plan.steps, plan.frr.writes, plan.frr.action) == ((), (), {}, FrrAction.NONE)
    assert (
        teardown_message(plan)
        == "nothing was configured; kept br100, vxlan999, br999 (not created by Karios)"
    )


def test_teardown_without_record_says_it_used_the_name_and_vni_rule() -> None:
    plan = teardown_plan(_with(APPLIED, _vxlan(999)), (100,))
    assert plan.net == ("ip link del vxlan100", "ip link del br100", "ip link del vtep0")
    assert "its devices by name and VNI" in teardown_message(plan) and plan.kept == ("vxlan999",)


# -- rollback and discovery ---------------------------------------------------------------------


def test_rollback_keeps_devices_that_were_there_and_restores_the_record() -> None:
    after, _, _ = _applied_from(BEFORE)
    cmds = network_commands(after, baseline_network(BEFORE, VNIS))
    assert cmds == ["ip link del vxlan100", "ip link del vxlan200", "ip link del br200", "ip link del vtep0"]
    plan = frr_rollback_plan(BEFORE, after)
    assert plan.state == {RECORD_NAME: None} and plan.action is FrrAction.STOP
    script, _ = commit_script(plan)
    assert f"rm -f {RECORD_PATH}" in script


def test_discovery_reads_the_boot_id_and_the_record_and_a_baseline_keeps_them() -> None:
    out = (
        (FIX / "discover_node1_fresh.txt")
        .read_text()
        .replace("@@karios:end", "@@karios:boot_id\nb-1\n@@karios:record\neyJ2ZXJzaW9uIjogMX0=\n@@karios:end")
    )
    facts = parse_facts(out)
    assert (facts.boot_id, facts.record) == ("b-1", '{"version": 1}')
    assert facts_from_dict(json.loads(json.dumps(facts_to_dict(facts)))) == facts
    assert parse_facts((FIX / "discover_node1_fresh.txt").read_text()).record is None


def test_rendered_files_carry_the_header_the_no_record_rule_looks_for() -> None:
    files = render_node_files(
        lab_intent(), NodeRenderInput(hostname="n1", vtep_ip=VTEP, underlay_iface="br0")
    )
    assert MARKER in files.frr_conf.splitlines()[0] and MARKER in files.daemons.splitlines()[0]
