"""The ack gate for every NOS × underlay × route-reflector placement: it asks for a switch change
exactly when the switch configuration Karios renders changes its BGP listen range, and the
snippet moves the range that configuration really holds (issue 13, item 1)."""

from __future__ import annotations

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


def _gate(stored: FabricConfigFields, change: dict) -> dict | None:
    merged = FabricConfigFields.model_validate({**stored.model_dump(by_alias=True), **change})
    try:
        assert (
            ackgate.evaluate(stored, merged, FabricConfigInput(**change), caller="c", caller_role="operator")
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


def test_snippet_uses_the_as_the_switch_runs_now() -> None:
    stored = _cfg("eos", "ospf", "ebgp")
    details = _gate(stored, {**POOL_MOVE, "fabric_switch_as": 65200})
    assert details is not None
    eos = next(s for s in details["snippets"] if s["nos"] == "eos")["snippet"]
    assert eos.startswith("router bgp 65100\n")
