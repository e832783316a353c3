"""Drift judgement (pure): a node in sync has no finding; each hand-made change is named."""

from __future__ import annotations

import dataclasses
import json

from karios.fabric_worker.rollout.drift import (
    judge_drift,
    parse_remote_vteps,
    remote_vteps_command,
    sha256,
    unreachable,
)
from karios.fabric_worker.rollout.drift_rules import attribute
from karios.fabric_worker.rollout.facts import Interface, NodeFacts
from karios.fabric_worker.rollout.plan import overlay_mtu
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from tests.unit.fabric_rollout.lab import lab_intent

INTENT = lab_intent(
    bgp_password="hunter2",
)
VTEP = "198.19.1.2"
OVERLAY = overlay_mtu(9000, 9000)


def _summary(state: str = "Established", pfx: int = 1) -> str:
    peer = {"state": state, "pfxRcd": pfx, "pfxSnt": pfx}
    return json.dumps({"peers": {"198.18.0.1": peer}})


def _synced() -> NodeFacts:
    files = render_node_files(INTENT, NodeRenderInput("node1", VTEP, "br0")).as_dict()
    ifs = [
        Interface("br0", "bridge", 9000, True, ipv4=("198.18.0.11/24",)),
        Interface("vtep0", "dummy", 1500, True, ipv4=(f"{VTEP}/32",)),
        Interface("br100", "bridge", OVERLAY, True),
        Interface("vxlan100", "vxlan", OVERLAY, True, master="br100", vxlan_id=100, vxlan_local=VTEP),
    ]
    return NodeFacts(
        hostname="node1",
        interfaces={i.name: i for i in ifs},
        frr_installed=True,
        frr_pids={"zebra": 10, "bgpd": 11},
        files=dict(files),
    )


def _judge(facts: NodeFacts, summary: str | None = None):
    return judge_drift("198.18.0.11", facts, summary or _summary(), INTENT, vtep_ip=VTEP)


def test_a_node_in_sync_has_no_drift_and_equal_hashes() -> None:
    d = _judge(_synced())
    assert not d.drifted, d.findings
    assert d.frr_config_sha256 == d.intent_sha256 != ""
    assert d.fqdn == "node1"


def test_a_hand_edited_frr_conf_is_frr_config_drift_without_its_contents() -> None:
    facts = _synced()
    edited = facts.files["frr.conf"] + "! edited by hand\n"
    d = _judge(dataclasses.replace(facts, files={**facts.files, "frr.conf": edited}))
    assert d.kinds == ("frr config",)
    assert d.frr_config_sha256 == sha256(edited) != d.intent_sha256
    assert all("hunter2" not in f.message for f in d.findings)


def test_a_deleted_vtep0_is_vtep0_missing() -> None:
    facts = _synced()
    ifs = {k: v for k, v in facts.interfaces.items() if k != "vtep0"}
    d = _judge(dataclasses.replace(facts, interfaces=ifs))
    assert "vtep0 missing" in d.kinds
    assert next(f for f in d.findings if f.kind == "vtep0 missing").message == "vtep0 missing"


def test_a_session_down_is_bgp_session_drift_once() -> None:
    d = _judge(_synced(), _summary(state="Active", pfx=0))
    assert d.kinds == ("bgp session",)
    assert "198.18.0.1" in d.findings[0].message


def test_overlay_mtu_and_missing_vxlan_devices_are_named() -> None:
    facts = _synced()
    mtu = {**facts.interfaces, "br100": dataclasses.replace(facts.interfaces["br100"], mtu=1500)}
    assert _judge(dataclasses.replace(facts, interfaces=mtu)).kinds == ("mtu",)
    gone = {k: v for k, v in facts.interfaces.items() if k != "vxlan100"}
    assert _judge(dataclasses.replace(facts, interfaces=gone)).kinds == ("vxlan",)


def test_frr_stopped_and_unreachable_are_findings() -> None:
    d = judge_drift("198.18.0.11", dataclasses.replace(_synced(), frr_pids={}), "", INTENT, vtep_ip=VTEP)
    assert "frr not running" in d.kinds and "bgp session" in d.kinds
    u = unreachable("198.18.0.12", "node2", "connection refused")
    assert u.drifted and u.kinds == ("unreachable",)


def test_remote_vteps_are_parsed_from_both_frr_shapes_and_missing_ones_named() -> None:
    out = "\n".join(
        [
            "@@karios:vni:100",
            json.dumps({"vni": 100, "numRemoteVteps": ["198.19.1.3", "198.19.1.4"]}),  # FRR 8.4
            "@@karios:vni:200",
            json.dumps({"vni": 200, "remoteVteps": [{"ip": "198.19.1.3"}]}),  # later releases
            "@@karios:vni:300",
            "% VNI 300 does not exist",
        ]
    )
    seen = parse_remote_vteps(out)
    assert seen == {100: {"198.19.1.3", "198.19.1.4"}, 200: {"198.19.1.3"}, 300: set()}
    assert "vtysh -c 'show evpn vni 100 json'" in remote_vteps_command((100, 200))

    expected = {"198.19.1.3", "198.19.1.4"}
    assert not _judge_vteps(_synced(), {100: expected}, expected).drifted
    d = _judge_vteps(_synced(), {100: {"198.19.1.3"}}, expected)
    assert (
        d.kinds == ("vteps",) and "198.19.1.4" in d.findings[0].message and "VNI 100" in d.findings[0].message
    )


def _judge_vteps(facts: NodeFacts, seen: dict[int, set[str]], expected: set[str]):
    return judge_drift(
        "198.18.0.11", facts, _summary(), INTENT, vtep_ip=VTEP, remote_vteps=seen, expected_vteps=expected
    )


def test_a_vtep_missing_because_its_node_drifted_is_named_on_that_node_only() -> None:
    facts = _synced()
    seen_by_1 = _judge_vteps(facts, {100: {"198.19.1.4"}}, {"198.19.1.3", "198.19.1.4"})
    node2 = judge_drift(
        "198.18.0.12",
        dataclasses.replace(facts, interfaces={k: v for k, v in facts.interfaces.items() if k != "vtep0"}),
        _summary(),
        INTENT,
        vtep_ip="198.19.1.3",
    )
    vtep_of = {"198.18.0.11": VTEP, "198.18.0.12": "198.19.1.3"}
    one, two = attribute([seen_by_1, node2], vtep_of)
    assert seen_by_1.kinds == ("vteps",) and not one.drifted  # node2's fault, not node1's
    assert "vtep0 missing" in two.kinds
    # A VTEP missing while its node looks fine stays a finding where it is seen.
    (alone,) = attribute([seen_by_1], vtep_of)
    assert alone.kinds == ("vteps",)
