"""The ack gate for every NOS × underlay × route-reflector placement: it asks for a switch change
exactly when the switch configuration Karios renders changes (comments aside), names the fields
that changed it, and the snippet turns the configuration the switch runs into the new one
(issue 13 item 1; issue 23 item 6). The FRR snippets are pasted on a real FRR in
tests/integration/fabric_rollout/test_switch_snippets_lab.py."""

from __future__ import annotations

import json
import re

import pytest

from karios.common.contracts.fabric import FabricConfigFields, FabricConfigInput, SwitchReconfigAckRequired
from karios.fabric_worker.config import ackgate
from karios.fabric_worker.config.render import SWITCH_NOS, render_switch_config, switch_context

PLACEMENTS = {
    # name: (switch AS, external_route_reflector)
    "switch-rr": (65000, True),
    "gw-rr": (65000, False),
    "ebgp": (65100, False),
}
POOL_MOVE = {"router_id_base": "10.254.0.1", "router_id_prefix_len": 23}
MGMT_MOVE = {"management_cidr": "192.168.110.0/23"}


def _cfg(nos: str, underlay: str, placement: str) -> FabricConfigFields:
    switch_as, rr = PLACEMENTS[placement]
    return FabricConfigFields.model_validate(
        {
            "as": 65000,
            "fabric_switch_as": switch_as,
            "fabric_switch_nos": nos,
            "external_route_reflector": rr,
            "ospf_enabled": underlay == "ospf",
            "management_cidr": "192.168.111.0/24",
            "router_id_base": "10.255.0.1",
            "router_id_prefix_len": 24,
            "fabric_switch_peering_ip": "10.255.0.254" if underlay == "ospf" else "192.168.111.254",
        }
    )


def _gate(stored: FabricConfigFields, change: dict, **ack) -> dict | None:
    merged = FabricConfigFields.model_validate({**stored.model_dump(by_alias=True), **change})
    try:
        assert (
            ackgate.evaluate(
                stored, merged, FabricConfigInput(**change, **ack), caller="c", caller_role="operator"
            )
            is None
        )
    except SwitchReconfigAckRequired as exc:
        return exc.details
    return None


def _listen_lines(cfg: FabricConfigFields) -> list[str]:
    text = render_switch_config(switch_context(cfg))
    return [
        line.strip()
        for line in text.splitlines()
        # NX-OS spells a listen range as a prefix neighbor (`neighbor 10.255.0.0/24`).
        if "listen range" in line or "listen-range" in line or re.match(r"\s*neighbor [\d.]+/\d+$", line)
    ]


@pytest.mark.parametrize("nos", SWITCH_NOS)
@pytest.mark.parametrize("underlay", ["ospf", "bgp"])
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("move", ["pool", "mgmt"])
def test_gate_fires_exactly_when_the_rendered_listen_range_moves(
    nos: str, underlay: str, placement: str, move: str
) -> None:
    stored = _cfg(nos, underlay, placement)
    change = POOL_MOVE if move == "pool" else MGMT_MOVE
    merged = FabricConfigFields.model_validate({**stored.model_dump(by_alias=True), **change})
    switch_changes = _listen_lines(stored) != _listen_lines(merged)
    details = _gate(stored, change)
    assert (details is not None) == switch_changes, (_listen_lines(stored), _listen_lines(merged))
    switch_bgp = placement != "gw-rr"
    listens_on_pool = underlay == "ospf"
    expect = switch_bgp and (move == "pool") == listens_on_pool
    assert switch_changes == expect
    if details is not None:
        old = "10.255.0.0/24" if move == "pool" else "192.168.111.0/24"
        new = "10.254.0.0/23" if move == "pool" else "192.168.110.0/23"
        assert (details["old_listen_range"], details["new_listen_range"]) == (old, new)
        snippet = next(s for s in details["snippets"] if s["nos"] == nos)["snippet"]
        assert old in snippet and new in snippet
        # The range it removes is the one the rendered switch configuration holds.
        assert any(old in line for line in _listen_lines(stored))


def _snippet(details: dict, nos: str) -> str:
    return next(s for s in details["snippets"] if s["nos"] == nos)["snippet"]


def test_snippet_removes_the_bgp_instance_the_switch_runs_before_the_new_one() -> None:
    stored = _cfg("eos", "ospf", "ebgp")
    details = _gate(stored, {**POOL_MOVE, "fabric_switch_as": 65200})
    assert details is not None
    eos = _snippet(details, "eos")
    assert eos.startswith("no router bgp 65100\nrouter bgp 65200\n")
    assert "   bgp listen range 10.254.0.0/23 peer-group KARIOS-VTEPS remote-as 65000" in eos
    assert details["changed_fields"] == ["fabric_switch_as", "router_id_base", "router_id_prefix_len"]


# Every change the outside tester found accepted without an ack (issue 23, item 6):
# name: (underlay, placement, change, changed_fields).
CHANGES = {
    "as": ("ospf", "switch-rr", {"as": 65001, "fabric_switch_as": 65001}, ["as", "fabric_switch_as"]),
    "node_as_ebgp": ("ospf", "ebgp", {"as": 65001}, ["as"]),
    "fabric_switch_as": ("ospf", "switch-rr", {"fabric_switch_as": 65100}, ["fabric_switch_as"]),
    "peering_ip": ("ospf", "switch-rr", {"fabric_switch_peering_ip": "10.255.0.253"},
                   ["fabric_switch_peering_ip"]),
    "rr_true_to_false": ("ospf", "switch-rr", {"external_route_reflector": False},
                         ["external_route_reflector"]),
    "rr_false_to_true": ("bgp", "gw-rr", {"external_route_reflector": True}, ["external_route_reflector"]),
    "bgp_to_ospf": (
        "bgp",
        "switch-rr",
        {"ospf_enabled": True, "fabric_switch_peering_ip": "10.255.0.254"},
        ["fabric_switch_peering_ip", "ospf_enabled"],
    ),
    "ospf_to_bgp": ("ospf", "gw-rr", {"ospf_enabled": False}, ["ospf_enabled"]),
    "management_cidr": ("bgp", "switch-rr", {"management_cidr": "192.168.110.0/23"}, ["management_cidr"]),
    "bfd": ("ospf", "switch-rr", {"bfd_enabled": True}, ["bfd_enabled"]),
    "ospf_auth": ("ospf", "gw-rr", {"ospf_auth_type": "message-digest", "ospf_auth_key_id": 3},
                  ["ospf_auth_key_id", "ospf_auth_type"]),
    "hello_dead": ("ospf", "gw-rr", {"ospf_hello_interval": 5, "ospf_dead_interval": 20},
                   ["ospf_dead_interval", "ospf_hello_interval"]),
}  # fmt: skip


@pytest.mark.parametrize("nos", SWITCH_NOS)
@pytest.mark.parametrize("name", list(CHANGES))
def test_every_change_of_the_switch_configuration_needs_the_ack(nos: str, name: str) -> None:
    underlay, placement, change, fields = CHANGES[name]
    stored = _cfg(nos, underlay, placement)
    details = _gate(stored, change)
    assert details is not None, f"{name} changes the {nos} switch configuration"
    if name == "ospf_auth" and nos == "cumulus":
        fields = ["ospf_auth_type"]  # NVUE sets the key id only with an auth type
    if name == "ospf_auth" and nos == "other":
        fields = ["ospf_auth_type"]
    assert sorted(details["changed_fields"]) == sorted(fields) or set(details["changed_fields"]) <= set(
        fields
    )
    assert details["switch_nos"] == nos
    mine = next(s for s in details["snippets"] if s["nos"] == nos)
    assert mine["snippet"] and mine["diff"] and mine["switch_snippet_hash"] == details["switch_snippet_hash"]
    # The hash is bound to the NOS and the change: an ack for another change never matches.
    assert len({s["switch_snippet_hash"] for s in details["snippets"]}) == len(SWITCH_NOS)
    assert _gate(stored, change) == details  # deterministic
    stale = _gate(stored, change, switch_acked=True, acked_by="ann", switch_snippet_hash="0" * 64)
    assert stale == details  # a wrong hash gets the same 409 again
    merged = FabricConfigFields.model_validate({**stored.model_dump(by_alias=True), **change})
    record = ackgate.evaluate(
        stored,
        merged,
        FabricConfigInput(
            **change, switch_acked=True, acked_by="ann", switch_snippet_hash=mine["switch_snippet_hash"]
        ),
        caller="c",
        caller_role="operator",
    )  # fmt: skip
    assert record is not None and record.switch_snippet_hash == mine["switch_snippet_hash"]


def test_bgp_to_ospf_snippet_brings_ospf_and_the_loopback() -> None:
    details = _gate(_cfg("other", "bgp", "switch-rr"), CHANGES["bgp_to_ospf"][2])
    assert details is not None
    frr = _snippet(details, "other")
    for line in (
        "interface swp1\n no ip address 192.168.111.254/24\n",
        "interface lo\n ip address 10.255.0.254/32\n ip ospf area 0.0.0.0\n ip ospf passive\nexit\n",
        "router ospf\n ospf router-id 10.255.0.254\nexit\n",
        " no bgp listen range 192.168.111.0/24 peer-group KARIOS-VTEPS\n",
        " bgp listen range 10.255.0.0/24 peer-group KARIOS-VTEPS\n",
        " address-family ipv4 unicast\n",
        "  no network 192.168.111.254/32\n",
    ):
        assert line in frr, (line, frr)


def test_rr_switch_to_gateway_removes_bgp_on_every_nos() -> None:
    stored = _cfg("other", "ospf", "switch-rr")
    details = _gate(stored, {"external_route_reflector": False})
    assert details is not None and (details["old_listen_range"], details["new_listen_range"]) == (
        "10.255.0.0/24",
        "",
    )
    assert _snippet(details, "other").endswith("no router bgp 65000\n")
    assert "no router bgp 65000\nno nv overlay evpn\nno feature bgp\n" in _snippet(details, "nxos")
    assert "no router bgp 65000\n" in _snippet(details, "eos")
    cumulus = _snippet(details, "cumulus")
    assert "nv unset vrf default router bgp dynamic-neighbor listen-range 10.255.0.0/24\n" in cumulus
    assert "nv unset router bgp autonomous-system\n" in cumulus and cumulus.endswith("nv config apply -y\n")


def test_management_move_moves_the_port_address_on_every_nos() -> None:
    details = _gate(_cfg("eos", "bgp", "switch-rr"), MGMT_MOVE)
    assert details is not None
    assert "   no ip address 192.168.111.254/24\n   ip address 192.168.111.254/23\n" in _snippet(
        details, "eos"
    )
    assert "  no ip address 192.168.111.254/24\n  ip address 192.168.111.254/23\n" in _snippet(
        details, "nxos"
    )
    assert "  no neighbor 192.168.111.0/24\n  neighbor 192.168.110.0/23\n    inherit peer KARIOS-VTEPS\n" in (
        _snippet(details, "nxos")
    )
    cumulus = _snippet(details, "cumulus")
    assert "nv unset interface swp1 ip address 192.168.111.254/24\n" in cumulus
    assert "nv set interface swp1 ip address 192.168.111.254/23\n" in cumulus
    sonic = _snippet(details, "sonic")
    patch = json.loads(sonic.split("apply-patch karios-fabric-patch.json\n")[1].split("\n# 2) FRR")[0])
    assert patch == [
        {"op": "remove", "path": "/INTERFACE/Ethernet0|192.168.111.254~124"},
        {"op": "add", "path": "/INTERFACE/Ethernet0|192.168.111.254~123", "value": {}},
    ]
    assert " no bgp listen range 192.168.111.0/24 peer-group KARIOS-VTEPS\n" in sonic


def test_secrets_are_removed_without_a_value_and_added_as_placeholders() -> None:
    stored = _cfg("eos", "ospf", "gw-rr")
    on = {"ospf_auth_type": "message-digest", "ospf_auth_key_id": 3}
    details = _gate(stored, on)
    assert details is not None and "   ip ospf message-digest-key 3 md5 0 <ospf-auth-key>\n" in _snippet(
        details, "eos"
    )
    stored_md5 = FabricConfigFields.model_validate({**stored.model_dump(by_alias=True), **on})
    details = _gate(stored_md5, {"ospf_auth_type": ""})
    assert details is not None
    assert "   no ip ospf message-digest-key 3\n" in _snippet(details, "eos")
    assert " no ip ospf message-digest-key 3\n" in _snippet(details, "other")
    assert "nv unset interface swp1 router ospf authentication md5-key\n" in _snippet(details, "cumulus")


def test_bfd_off_removes_bfd_from_the_peer_group_not_only_its_profile() -> None:
    stored = FabricConfigFields.model_validate(
        {**_cfg("other", "ospf", "switch-rr").model_dump(by_alias=True), "bfd_enabled": True}
    )
    details = _gate(stored, {"bfd_enabled": False})
    assert details is not None
    frr = _snippet(details, "other")
    assert " no neighbor KARIOS-VTEPS bfd\n" in frr and frr.endswith("no bfd\n")


def test_comment_only_changes_need_no_ack_but_a_configured_name_does() -> None:
    stored = _cfg("other", "ospf", "switch-rr")
    assert _gate(stored, {"fabric_switch_name": "leaf-09"}) is None  # a comment in FRR
    assert _gate(stored, {"vxlan_mtu": 9000}) is None  # a hint in the FRR reference, no setting
    details = _gate(stored, {"fabric_switch_name": "leaf-09"}, switch_nos="cumulus")
    assert details is not None and details["changed_fields"] == ["fabric_switch_name"]
    assert _snippet(details, "cumulus") == "nv set system hostname leaf-09\nnv config apply -y\n"
    details = _gate(_cfg("eos", "ospf", "gw-rr"), {"vxlan_mtu": 9000})
    assert details is not None and "   mtu 9000\n" in _snippet(details, "eos")


def test_changes_elsewhere_need_no_ack() -> None:
    stored = _cfg("eos", "ospf", "switch-rr")
    assert _gate(stored, {"expected_vms": 500, "advertise_all_vni": False}) is None


def _secret_gate(stored: FabricConfigFields, secrets: ackgate.SecretChange) -> dict | None:
    try:
        got = ackgate.evaluate(
            stored, stored, FabricConfigInput(), caller="c", caller_role="operator", secrets=secrets
        )
    except SwitchReconfigAckRequired as exc:
        return exc.details
    assert got is None
    return None


@pytest.mark.parametrize("nos", SWITCH_NOS)
def test_a_bgp_password_set_cleared_or_changed_needs_the_ack_where_the_switch_runs_bgp(nos: str) -> None:
    """Secrets are placeholders: a password set, cleared or given a new value leaves the rest of
    the text alone, but the switch must be told — the gate names bgp_password and the snippet
    carries the password line (never a value)."""
    stored = _cfg(nos, "ospf", "switch-rr")
    set_ = _secret_gate(stored, ackgate.SecretChange(False, True))
    cleared = _secret_gate(stored, ackgate.SecretChange(True, False))
    revalued = _secret_gate(stored, ackgate.SecretChange(True, True, ("bgp_password",)))
    for details in (set_, cleared, revalued):
        assert details is not None and details["changed_fields"] == ["bgp_password"]
        snippet = next(s for s in details["snippets"] if s["nos"] == nos)["snippet"]
        assert "password" in snippet
    assert "<bgp-password>" in next(s for s in set_["snippets"] if s["nos"] == nos)["snippet"]
    assert "<bgp-password>" not in next(s for s in cleared["snippets"] if s["nos"] == nos)["snippet"]
    # The same password kept (a write of other fields): nothing for the switch.
    assert _secret_gate(stored, ackgate.SecretChange(True, True)) is None
    # The switch runs no BGP (route reflector on the gateway node): its password is not the switch's.
    assert _secret_gate(_cfg(nos, "ospf", "gw-rr"), ackgate.SecretChange(False, True)) is None


def test_a_new_ospf_key_needs_the_ack_only_with_ospf_authentication() -> None:
    plain = _cfg("frr", "ospf", "switch-rr")
    assert _secret_gate(plain, ackgate.SecretChange(value_changed=("ospf_auth_key",))) is None
    md5 = plain.model_copy(update={"ospf_auth_type": "message-digest", "ospf_auth_key_id": 1})
    details = _secret_gate(md5, ackgate.SecretChange(value_changed=("ospf_auth_key",)))
    assert details is not None and details["changed_fields"] == ["ospf_auth_key"]
    frr = next(s for s in details["snippets"] if s["nos"] == "frr")["snippet"]
    assert (
        "no ip ospf message-digest-key 1" in frr and "ip ospf message-digest-key 1 md5 <ospf-auth-key>" in frr
    )
