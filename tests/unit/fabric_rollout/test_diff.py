"""Apply preview (pure): file diffs from redacted copies, link changes classified, the VTEP an
apply would allocate — from the same plan the apply runs (``frr_plan`` / ``network_commands``)."""

from __future__ import annotations

import dataclasses

import pytest
from faststream.nats import TestNatsBroker

from karios.common.bus.envelope import wrap
from karios.common.contracts.base import Reply
from karios.common.contracts.fabric_diff import FabricDiffQuery
from karios.common.settings import KariosSettings
from karios.fabric_worker.app import create_app
from karios.fabric_worker.config.pool import VtepPool
from karios.fabric_worker.rollout.diff import (
    SECRET_ONLY,
    file_diffs,
    link_changes,
    planned_vteps,
    redact_text,
)
from karios.fabric_worker.rollout.facts import Interface, NodeFacts
from karios.fabric_worker.rollout.plan import DesiredNetwork, frr_plan, network_commands, overlay_mtu
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from tests.unit.fabric_rollout.lab import lab_intent

BGP_PW = "s3cr3t-bgp-Pw"
OSPF_KEY = "ospfKEY9"
INTENT = lab_intent(
    bgp_password=BGP_PW,
    underlay="ospf",
    ospf_auth_type="message-digest",
    ospf_auth_key=OSPF_KEY,
    ospf_auth_key_id=7,
)
VTEP = "198.19.1.2"
OVERLAY = overlay_mtu(9000, 9000)
UNDERLAY = Interface("br0", "bridge", 9000, True, ipv4=("198.18.0.11/24",))


def _files() -> dict[str, str]:
    return render_node_files(INTENT, NodeRenderInput("node1", VTEP, "br0")).as_dict()


def _empty() -> NodeFacts:
    return NodeFacts(
        "node1", {"br0": UNDERLAY}, True, {}, dict.fromkeys(("daemons", "frr.conf", "vtysh.conf"))
    )


def _synced() -> NodeFacts:
    ifs = [
        UNDERLAY,
        Interface("vtep0", "dummy", 1500, True, ipv4=(f"{VTEP}/32",)),
        Interface("br100", "bridge", OVERLAY, True),
        Interface("vxlan100", "vxlan", OVERLAY, True, master="br100", vxlan_id=100, vxlan_local=VTEP),
    ]
    return NodeFacts("node1", {i.name: i for i in ifs}, True, {"zebra": 1, "bgpd": 2}, dict(_files()))


def _want() -> DesiredNetwork:
    return DesiredNetwork(vtep_ip=VTEP, vnis=(100,), overlay_mtu=OVERLAY, managed_vnis=(100,))


def test_secrets_are_redacted_by_value_and_by_frr_syntax() -> None:
    text = _files()["frr.conf"]
    assert BGP_PW in text and OSPF_KEY in text  # the rendered file holds both
    red = redact_text(text, INTENT.secrets())
    assert BGP_PW not in red and OSPF_KEY not in red
    assert "password <redacted>" in red and "md5 <redacted>" in red
    # A key on the node that is not the intent's (an old one) is redacted by its keyword.
    old = "router bgp 1\n neighbor 10.0.0.1 password oldSecret\n key-string k1\n"
    assert "oldSecret" not in redact_text(old, []) and "k1" not in redact_text(old, [])


def test_an_empty_node_shows_every_file_created_and_vtep0_to_create() -> None:
    facts = _empty()
    plan = frr_plan(facts, _files())
    diffs = file_diffs(facts, plan, INTENT.secrets())
    assert [(d.name, d.change) for d in diffs] == [
        ("daemons", "create"),
        ("frr.conf", "create"),
        ("vtysh.conf", "create"),
    ]
    conf = diffs[1].diff
    assert conf.startswith("--- /dev/null\n+++ b/etc/frr/frr.conf\n")
    assert "+router bgp 65000\n" in conf and "+ neighbor 198.18.0.1 password <redacted>\n" in conf
    assert all(BGP_PW not in d.diff and OSPF_KEY not in d.diff for d in diffs)
    links = link_changes(network_commands(facts, _want()), facts)
    assert [(c.device, c.action) for c in links][:3] == [
        ("vtep0", "create"),
        ("vtep0", "address"),
        ("vtep0", "up"),
    ]
    assert links[1].detail == f"{VTEP}/32"
    created = {c.device: c.detail for c in links if c.action == "create"}
    assert created["br100"] == f"bridge mtu {OVERLAY}"
    assert created["vxlan100"] == f"vxlan mtu {OVERLAY}, VNI 100, local {VTEP}"


def test_a_node_in_sync_has_no_diff() -> None:
    facts = _synced()
    plan = frr_plan(facts, _files())
    assert not plan.changed and file_diffs(facts, plan, INTENT.secrets()) == []
    assert network_commands(facts, _want()) == []


def test_a_hand_edited_line_is_exactly_the_diff() -> None:
    facts = _synced()
    conf = facts.files["frr.conf"]
    edited = conf.replace(
        " bgp log-neighbor-changes\n",
        " bgp log-neighbor-changes\n no bgp default ipv4-unicast\n! by hand\n",
        1,
    )
    assert edited != conf
    facts = dataclasses.replace(facts, files={**facts.files, "frr.conf": edited})
    (d,) = file_diffs(facts, frr_plan(facts, _files()), INTENT.secrets())
    removed = [ln for ln in d.diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in d.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert (d.change, added) == ("modify", [])
    assert removed == ["- no bgp default ipv4-unicast", "-! by hand"]


def test_only_a_changed_secret_says_so_without_either_value() -> None:
    facts = _synced()
    old = facts.files["frr.conf"].replace(BGP_PW, "previousPw1")
    facts = dataclasses.replace(facts, files={**facts.files, "frr.conf": old})
    (d,) = file_diffs(facts, frr_plan(facts, _files()), INTENT.secrets())
    assert d.diff == SECRET_ONLY


def test_mtu_changes_name_the_old_and_new_value() -> None:
    facts = _synced()
    ifs = {**facts.interfaces, "br100": dataclasses.replace(facts.interfaces["br100"], mtu=1500)}
    facts = dataclasses.replace(facts, interfaces=ifs)
    (c,) = link_changes(network_commands(facts, _want()), facts)
    assert (c.device, c.action, c.detail, c.command) == (
        "br100",
        "mtu",
        f"mtu 1500 → {OVERLAY}",
        f"ip link set br100 mtu {OVERLAY}",
    )


def test_deleted_devices_and_an_unknown_command() -> None:
    facts = _synced()
    gone = network_commands(facts, DesiredNetwork(vtep_ip=None, managed_vnis=(100,)))
    assert [(c.device, c.action) for c in link_changes(gone, facts)] == [
        ("vxlan100", "delete"),
        ("br100", "delete"),
        ("vtep0", "delete"),
    ]
    with pytest.raises(ValueError, match="unclassified"):
        link_changes(["rm -rf /"], facts)


def test_planned_vteps_follow_the_allocation_rule_without_writing() -> None:
    pool = VtepPool.of("198.19.1.1", 24, ["198.19.1.2"])
    assert planned_vteps(pool, {}, ["a", "b"]) == {"a": "198.19.1.1", "b": "198.19.1.3"}
    # A node keeps its own address; one outside the pool gets the lowest free one.
    got = planned_vteps(pool, {"b": "198.19.1.1", "c": "10.0.0.1"}, ["a", "b", "c"])
    assert got == {"a": "198.19.1.3", "b": "198.19.1.1", "c": "198.19.1.4"}
    full = VtepPool.of("198.19.1.254", 24)
    assert planned_vteps(full, {}, ["a", "b"]) == {"a": "198.19.1.254", "b": ""}


async def test_the_diff_query_is_wired_and_a_bad_node_ip_is_422_before_any_lookup() -> None:
    settings = KariosSettings(
        _env_file=None,  # type: ignore[call-arg]
        dev_mode=True,
        nats_url="nats://127.0.0.1:1",
        bus_prefix="unit",
        log_json=False,
    )
    bus = create_app(settings).state.runtime.bus
    body = wrap(FabricDiffQuery(node_ip="not-an-ip"), source="test").model_dump_json()
    async with TestNatsBroker(bus.broker) as br:
        reply = Reply.model_validate_json((await br.request(body, bus.subjects.query("fabric", "diff"))).body)
    assert not reply.ok and reply.error is not None
    assert (reply.error.code, reply.error.field) == ("VALIDATION_FAILED", "node_ip")
