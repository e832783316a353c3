"""The ack gate's switch snippets, pasted on a real FRR "switch" (issue 13 item 1, issue 23 item 6).

The lab's route reflector is the switch: started with the switch configuration Karios renders
for the stored fabric config (``render_switch_config(switch_context(cfg))``, the FRR reference
``other``), with a node-facing port ``swp1``. A change is run through the ack gate; the 409's
snippet is pasted as given (``configure terminal`` + its lines) and must apply without an
error; the switch's running configuration must then equal what Karios renders for the new
config — section by section against the rendered text, and against a fresh FRR started with
that text. Where nothing on the switch changes, the gate must ask for nothing. EOS, NX-OS and
Cumulus NVUE snippets cannot be run on FRR; their text is covered by the unit tests.

Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from karios.common.contracts.fabric import (
    FabricConfigFields,
    FabricConfigInput,
    SwitchReconfigAckRequired,
)
from karios.fabric_worker.config import ackgate
from karios.fabric_worker.config.render import render_switch_config, switch_context

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
import fabric_lab

pytestmark = pytest.mark.lab
CI = os.environ.get("CI", "").lower() == "true"

SWITCH = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_name": "rr",
    "fabric_switch_nos": "other",
    "fabric_switch_role": "leaf",
    "external_route_reflector": True,
    "management_cidr": "198.18.0.0/24",
    "router_id_base": "10.255.0.1",
    "router_id_prefix_len": 24,
    "vxlan_mtu": 9000,
}
OSPF = {**SWITCH, "ospf_enabled": True, "ospf_area": "0.0.0.0", "fabric_switch_peering_ip": "10.255.0.254"}
BGP = {**SWITCH, "ospf_enabled": False, "fabric_switch_peering_ip": fabric_lab.FABRIC_IP}
EBGP = {**OSPF, "fabric_switch_as": 65100, "external_route_reflector": False}
# A switch runs every routing daemon (the snippet may start OSPF or BFD on it).
DAEMONS = ("bgpd", "ospfd", "bfdd")


def _skip_without_lab() -> None:
    fabric_lab.require_lab()


def _load(lab: fabric_lab.FabricLab, cfg: FabricConfigFields) -> None:
    """(Re)start the lab's "switch" with Karios's switch configuration for `cfg`."""
    lab.rr.stop()
    lab.rr.start(render_switch_config(switch_context(cfg)), DAEMONS, loaded=_marker(cfg))


def _gate(stored: FabricConfigFields, change: dict) -> tuple[FabricConfigFields, dict | None]:
    merged = FabricConfigFields.model_validate({**stored.model_dump(by_alias=True), **change})
    try:
        ackgate.evaluate(stored, merged, FabricConfigInput(**change), caller="t", caller_role="operator")
    except SwitchReconfigAckRequired as exc:
        return merged, exc.details
    return merged, None


def _paste_and_verify(lab: fabric_lab.FabricLab, details: dict, nos: str) -> str:
    snippet = next(s for s in details["snippets"] if s["nos"] == nos)
    res = lab.rr_paste(snippet["snippet"])
    assert res.returncode == 0 and "%" not in res.stdout + res.stderr, (snippet["snippet"], res)
    shown = lab.rr_shell(snippet["verify"])
    assert shown.returncode == 0, shown
    return shown.stdout


def _listen_lines(text: str) -> list[str]:
    return sorted(line.strip() for line in text.splitlines() if "bgp listen range" in line)


# Lines of a running configuration that are no part of what Karios renders (FRR's own header,
# the lab namespace's forwarding sysctls).
_FRR_OWN = (
    "frr version",
    "frr defaults",
    "hostname",
    "log ",
    "service integrated-vtysh-config",
    "no ip forwarding",
    "no ipv6 forwarding",
)
_CLOSE = {"exit", "exit-address-family", "end", "Building configuration...", "Current configuration:"}
# Lines FRR does not show because they are its defaults (`frr defaults datacenter`, OSPF timers).
_DEFAULTS = {
    "bgp log-neighbor-changes",
    "no bgp ebgp-requires-policy",
    "ip ospf hello-interval 10",
    "ip ospf dead-interval 40",
    "ip ospf network broadcast",
    "auto-cost reference-bandwidth 100000",
    "receive-interval 300",
    "transmit-interval 300",
    "detect-multiplier 3",
}
# FRR 8.4 does not show this one in `address-family l2vpn evpn` (it does in ipv4 unicast).
_HIDDEN_IN_EVPN = "neighbor KARIOS-VTEPS attribute-unchanged next-hop"


def _sections(text: str) -> set[tuple[str, ...]]:
    """The configuration as (block header…, line) paths: comments, FRR's header and defaults
    dropped; an `interface` block without a line is no configuration."""
    paths: set[tuple[str, ...]] = set()
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("!") or line in _CLOSE or line.startswith(_FRR_OWN):
            continue
        depth = len(raw) - len(raw.lstrip())
        while stack and stack[-1][0] >= depth:
            stack.pop()
        path = (*(h for _, h in stack), line)
        if line not in _DEFAULTS and path[-2:] != ("address-family l2vpn evpn", _HIDDEN_IN_EVPN):
            paths.add(path)
        stack.append((depth, line))
    blocks = {p[:-1] for p in paths if len(p) > 1}
    # FRR shows `neighbor PG bfd profile P` as `neighbor PG bfd` + `neighbor PG bfd profile P`.
    implied = {(*p[:-1], p[-1].split(" profile ")[0]) for p in paths if " bfd profile " in p[-1]}
    return {
        p for p in paths - implied if not (len(p) == 1 and p[0].startswith("interface ") and p not in blocks)
    }


def _marker(cfg: FabricConfigFields) -> str:
    return "bgp listen range" if switch_context(cfg).switch_bgp else "router ospf"


def _assert_runs_the_rendered_config(lab: fabric_lab.FabricLab, merged: FabricConfigFields) -> None:
    """The switch's running configuration equals what Karios renders for `merged`: its sections
    equal the rendered text's, and those of a fresh FRR loading that text."""
    rendered = render_switch_config(switch_context(merged))
    pasted = lab.rr_vtysh("show running-config")
    assert _sections(pasted) == _sections(rendered), (
        sorted(_sections(pasted) - _sections(rendered)),
        sorted(_sections(rendered) - _sections(pasted)),
    )
    lab.rr.stop()
    lab.rr.start(rendered, DAEMONS, loaded=_marker(merged))
    assert _sections(lab.rr_vtysh("show running-config")) == _sections(pasted)


@pytest.fixture(scope="module")
def switch_lab():
    """A one-node lab whose route reflector is the "switch": FRR in the fabric namespace with a
    node-facing port `swp1` (a veth: a snippet may remove an address from it, which FRR only
    does on a port that exists). Each test loads the configuration it starts from."""
    _skip_without_lab()
    with fabric_lab.FabricLab(
        n_nodes=1, prefix="ks", host_link=False, rr_config=render_switch_config(switch_context(
            FabricConfigFields.model_validate(OSPF))), rr_daemons=DAEMONS
    ) as lab:  # fmt: skip
        port = switch_context(FabricConfigFields.model_validate(OSPF)).port
        for cmd in (
            f"link add {port} type veth peer name {port}p",
            f"link set {port} up",
            f"link set {port}p up",
        ):
            subprocess.run(["ip", "netns", "exec", lab.fabric_netns, "ip", *cmd.split()], check=True)
        yield lab


PEER2 = "10.255.0.253"
CHANGES = {
    # case: (stored, change)
    "underlay_bgp_to_ospf": (BGP, {"ospf_enabled": True, "fabric_switch_peering_ip": "10.255.0.254"}),
    "underlay_ospf_to_bgp": (OSPF, {"ospf_enabled": False, "fabric_switch_peering_ip": fabric_lab.FABRIC_IP}),
    "rr_switch_to_gateway": (OSPF, {"external_route_reflector": False}),
    "rr_gateway_to_switch": ({**OSPF, "external_route_reflector": False}, {"external_route_reflector": True}),
    "as_change": (OSPF, {"as": 65001, "fabric_switch_as": 65001}),
    "switch_as_ibgp_to_ebgp": (OSPF, {"fabric_switch_as": 65100}),
    "ebgp_to_ibgp_rr": (EBGP, {"fabric_switch_as": 65000, "external_route_reflector": True}),
    "peering_ip": (OSPF, {"fabric_switch_peering_ip": PEER2}),
    "peering_ip_bgp_underlay": (BGP, {"fabric_switch_peering_ip": "198.18.0.250"}),
    "pool_move": (OSPF, {"router_id_base": "10.254.0.1", "router_id_prefix_len": 23}),
    "pool_move_ebgp": (EBGP, {"router_id_base": "10.254.0.1", "router_id_prefix_len": 23}),
    "management_move_bgp_underlay": (BGP, {"management_cidr": "198.18.0.0/23"}),
    "bfd_on": (OSPF, {"bfd_enabled": True}),
    "bfd_off": ({**OSPF, "bfd_enabled": True}, {"bfd_enabled": False}),
    "ospf_md5": (OSPF, {"ospf_auth_type": "message-digest", "ospf_auth_key_id": 1}),
    "ospf_md5_off": (
        {**OSPF, "ospf_auth_type": "message-digest", "ospf_auth_key_id": 1},
        {"ospf_auth_type": ""},
    ),
    "ospf_timers": (OSPF, {"ospf_hello_interval": 5, "ospf_dead_interval": 20}),
    "ospf_area_and_ref_bw": (OSPF, {"ospf_area": "0.0.0.1", "ospf_auto_ref_bw": 200000}),
}


@pytest.mark.parametrize("case", list(CHANGES))
def test_the_gate_snippet_turns_the_running_switch_into_the_new_config(switch_lab, case: str) -> None:
    """Every change of the rendered switch configuration is gated, and its FRR snippet, pasted
    on the switch running the stored config, leaves it running exactly the new one."""
    stored_doc, change = CHANGES[case]
    stored = FabricConfigFields.model_validate(stored_doc)
    switch_lab.rr.stop()
    switch_lab.rr.start(render_switch_config(switch_context(stored)), DAEMONS, loaded=_marker(stored))
    merged, details = _gate(stored, change)
    assert details is not None, f"{case}: the switch configuration changes, the gate must ask"
    assert details["changed_fields"], details
    _paste_and_verify(switch_lab, details, "other")
    _assert_runs_the_rendered_config(switch_lab, merged)


@pytest.mark.parametrize("case", ["ospf_ibgp_rr", "ospf_ebgp_route_server"])
def test_pool_move_snippet_applies_on_frr_and_verify_shows_the_new_range(switch_lab, case: str) -> None:
    stored = FabricConfigFields.model_validate(OSPF if case == "ospf_ibgp_rr" else EBGP)
    _load(switch_lab, stored)
    merged, details = _gate(stored, {"router_id_base": "10.254.0.1", "router_id_prefix_len": 23})
    assert details is not None, "an OSPF underlay listens on the pool: the switch must change"
    assert (details["old_listen_range"], details["new_listen_range"]) == ("10.255.0.0/24", "10.254.0.0/23")
    assert details["changed_fields"] == ["router_id_base", "router_id_prefix_len"]
    shown = _paste_and_verify(switch_lab, details, "other")
    assert "10.254.0.0/23" in shown and "10.255.0.0/24" not in shown
    # The switch now runs what Karios renders for the new config (listen range included).
    running = switch_lab.rr_vtysh("show running-config")
    assert _listen_lines(running) == _listen_lines(render_switch_config(switch_context(merged)))


def test_bgp_underlay_pool_move_needs_no_ack_and_a_subnet_move_applies_on_frr(switch_lab) -> None:
    stored = FabricConfigFields.model_validate(BGP)
    _load(switch_lab, stored)
    before = switch_lab.rr_vtysh("show running-config")
    assert _listen_lines(before) == ["bgp listen range 198.18.0.0/24 peer-group KARIOS-VTEPS"]
    _, details = _gate(stored, {"router_id_base": "10.254.0.1", "router_id_prefix_len": 23})
    assert details is None, "the switch listens on the management subnet: a pool move changes nothing"
    assert "10.254.0." not in before and "10.255.0." not in before

    merged, details = _gate(stored, {"management_cidr": "198.18.0.0/23"})
    assert details is not None and details["changed_fields"] == ["management_cidr"]
    shown = _paste_and_verify(switch_lab, details, "other")
    assert "198.18.0.0/23" in shown and "198.18.0.0/24" not in shown
    assert f"ip address {fabric_lab.FABRIC_IP}/23" in shown  # the port's address moves too
    _assert_runs_the_rendered_config(switch_lab, merged)


def test_a_change_the_switch_does_not_see_needs_no_ack(switch_lab) -> None:
    """Route reflector on the gateway node: the switch carries only the underlay, so a pool
    move (with the peering address, the gateway node's) changes nothing on it."""
    stored = FabricConfigFields.model_validate({**OSPF, "external_route_reflector": False})
    _, details = _gate(
        stored,
        {
            "router_id_base": "10.254.0.1",
            "router_id_prefix_len": 23,
            "fabric_switch_peering_ip": "10.254.1.254",
        },
    )
    assert details is None
