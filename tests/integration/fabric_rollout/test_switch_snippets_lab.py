"""The ack gate's switch snippets, pasted on a real FRR route reflector (issue 13, item 1).

The lab's route reflector is started with the switch configuration Karios renders for the
stored fabric config (``render_switch_config(switch_context(cfg))``: the "other" reference and
SONiC are FRR syntax). A change is run through the ack gate; the 409's snippet is pasted as
given (``configure terminal`` + its lines), must apply without an error, and the snippet's
verify command must show the new range and no longer the old one. Where nothing on the switch
changes, the gate must ask for nothing. EOS, NX-OS and Cumulus NVUE snippets cannot be run on
FRR; their text is covered by the unit tests.

Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import os
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


def _skip_without_lab() -> None:
    reason = fabric_lab.skip_reason()
    if reason:
        if CI:
            pytest.fail(f"fabric lab required in CI: {reason}", pytrace=False)
        pytest.skip(reason)


def _rr(cfg: FabricConfigFields) -> fabric_lab.FabricLab:
    """A one-node lab whose route reflector runs Karios's switch configuration for `cfg`."""
    daemons = ("bgpd", "ospfd") if cfg.ospf_enabled else ("bgpd",)
    return fabric_lab.FabricLab(
        n_nodes=1,
        prefix="ks",
        host_link=False,
        rr_config=render_switch_config(switch_context(cfg)),
        rr_daemons=daemons,
    )


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


@pytest.mark.parametrize("case", ["ospf_ibgp_rr", "ospf_ebgp_route_server"])
def test_pool_move_snippet_applies_on_frr_and_verify_shows_the_new_range(case: str) -> None:
    _skip_without_lab()
    stored = FabricConfigFields.model_validate(OSPF if case == "ospf_ibgp_rr" else EBGP)
    with _rr(stored) as lab:
        merged, details = _gate(stored, {"router_id_base": "10.254.0.1", "router_id_prefix_len": 23})
        assert details is not None, "an OSPF underlay listens on the pool: the switch must change"
        assert (details["old_listen_range"], details["new_listen_range"]) == (
            "10.255.0.0/24",
            "10.254.0.0/23",
        )
        by_nos = {s["nos"]: s["snippet"] for s in details["snippets"]}
        assert by_nos["sonic"] == by_nos["other"]  # one FRR syntax
        shown = _paste_and_verify(lab, details, "other")
        assert "10.254.0.0/23" in shown and "10.255.0.0/24" not in shown
        # The switch now runs what Karios renders for the new config (listen range included).
        running = lab.rr_vtysh("show running-config")
        assert _listen_lines(running) == _listen_lines(render_switch_config(switch_context(merged)))


def test_bgp_underlay_pool_move_needs_no_ack_and_a_subnet_move_applies_on_frr() -> None:
    _skip_without_lab()
    stored = FabricConfigFields.model_validate(BGP)
    with _rr(stored) as lab:
        before = lab.rr_vtysh("show running-config")
        assert _listen_lines(before) == ["bgp listen range 198.18.0.0/24 peer-group KARIOS-VTEPS"]
        _, details = _gate(stored, {"router_id_base": "10.254.0.1", "router_id_prefix_len": 23})
        assert details is None, "the switch listens on the management subnet: a pool move changes nothing"
        assert "10.254.0." not in before and "10.255.0." not in before

        merged, details = _gate(stored, {"management_cidr": "198.18.0.0/23"})
        assert details is not None
        shown = _paste_and_verify(lab, details, "other")
        assert "198.18.0.0/23" in shown and "198.18.0.0/24" not in shown
        running = lab.rr_vtysh("show running-config")
        assert _listen_lines(running) == _listen_lines(render_switch_config(switch_context(merged)))
