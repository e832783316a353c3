"""Golden files for every NOS × underlay mode × route-reflector placement.

Regenerate after an intended template change with ``UPDATE_GOLDEN=1`` and review the diff.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.common.contracts.fabric import FabricPlanRequest
from karios.fabric_worker.config.plan import plan_fabric
from karios.fabric_worker.config.render import SWITCH_NOS, render_for_nos, switch_snippet
from tests.fixtures.golden import assert_golden

GOLDEN = Path(__file__).parent / "golden"
CASES = [
    (nos, underlay, rr) for nos in SWITCH_NOS for underlay in ("ospf", "bgp") for rr in ("switch-rr", "gw-rr")
]


def _request(nos: str, underlay: str, rr: str, **extra) -> FabricPlanRequest:
    return FabricPlanRequest(
        fabric_switch_nos=nos,
        fabric_switch_name="leaf-01",
        fabric_switch_role="leaf",
        management_cidr="192.168.111.0/24",
        vxlan_mtu=9216,
        expected_nodes=16,
        underlay_mode=underlay,
        external_route_reflector=rr == "switch-rr",
        bfd_enabled=True,
        bgp_password_set=True,
        ospf_auth_type="message-digest" if underlay == "ospf" else "",
        ospf_auth_key_id=1,
        ospf_fabric_interface="eth1",
        **extra,
    )


def _check_golden(name: str, text: str) -> None:
    assert_golden(GOLDEN / name, text)


@pytest.mark.parametrize(("nos", "underlay", "rr"), CASES, ids=["-".join(c) for c in CASES])
def test_switch_config_matches_golden(nos, underlay, rr):
    cfg = plan_fabric(_request(nos, underlay, rr)).switch_config
    _check_golden(f"{nos}-{underlay}-{rr}.txt", cfg)


@pytest.mark.parametrize("nos", SWITCH_NOS)
def test_ebgp_and_hmac_variant_matches_golden(nos):
    req = _request(nos, "ospf", "gw-rr", local_as=65000, fabric_switch_as=65100)
    req = req.model_copy(
        update={"ospf_auth_type": "hmac-sha-256", "bfd_enabled": False, "bgp_password_set": False}
    )
    _check_golden(f"{nos}-ospf-ebgp-hmac.txt", plan_fabric(req).switch_config)


@pytest.mark.parametrize(("nos", "underlay", "rr"), CASES, ids=["-".join(c) for c in CASES])
def test_no_secret_and_every_configured_feature_is_rendered(nos, underlay, rr):
    text = plan_fabric(_request(nos, underlay, rr)).switch_config
    assert "<bgp-password>" in text if rr == "switch-rr" else "<bgp-password>" not in text
    if underlay == "ospf":
        assert "<ospf-auth-key>" in text and "10.255.0.254" in text
    assert re.search(r"\bmtu\b.*9216", text, re.IGNORECASE)
    if rr == "switch-rr":
        listen = "10.255.0.0/24" if underlay == "ospf" else "192.168.111.0/24"
        assert listen in text and "bfd" in text.lower()
    if nos == "sonic":
        json.loads(text.split("# 1) CONFIG_DB patch")[1].split("\n", 1)[1].split("# repeat")[0])


def test_switch_snippet_hash_changes_with_the_change_and_the_nos():
    def cfg(prefix_len: int) -> SimpleNamespace:
        return SimpleNamespace(**{**_SWITCH, "router_id_prefix_len": prefix_len})

    def snip(nos: str, old: int, new: int) -> dict:
        return switch_snippet(nos, render_for_nos(cfg(old), nos), render_for_nos(cfg(new), nos))

    a, b, c = snip("eos", 24, 23), snip("eos", 24, 22), snip("nxos", 24, 23)
    assert len({a["switch_snippet_hash"], b["switch_snippet_hash"], c["switch_snippet_hash"]}) == 3
    assert snip("eos", 24, 23) == a
    assert a["snippet"] == (
        "router bgp 65000\n"
        "   no bgp listen range 10.255.0.0/24 peer-group KARIOS-VTEPS remote-as 65000\n"
        "   bgp listen range 10.255.0.0/23 peer-group KARIOS-VTEPS remote-as 65000\n"
        "exit\n"
    )
    assert c["snippet"].splitlines()[1:4] == [
        "  no neighbor 10.255.0.0/24",
        "  neighbor 10.255.0.0/23",
        "    inherit peer KARIOS-VTEPS",
    ]
    assert snip("other", 24, 24)["snippet"] == "" and snip("other", 24, 24)["diff"] == ""


_SWITCH = {
    "as_": 65000,
    "bfd_enabled": False,
    "external_route_reflector": True,
    "fabric_switch_as": 65000,
    "fabric_switch_name": "leaf-01",
    "fabric_switch_nos": "eos",
    "fabric_switch_peering_ip": "10.255.0.254",
    "fabric_switch_role": "leaf",
    "management_cidr": "192.168.111.0/24",
    "ospf_area": "",
    "ospf_auth_type": "",
    "ospf_auth_key_id": 0,
    "ospf_auto_ref_bw": 0,
    "ospf_dead_interval": 0,
    "ospf_enabled": True,
    "ospf_hello_interval": 0,
    "router_id_base": "10.255.0.1",
    "router_id_prefix_len": 24,
    "vxlan_mtu": 9216,
}
