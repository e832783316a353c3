"""frr.conf / daemons rendering against golden files, and FRR's own parser on them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from karios.fabric_worker.rollout.intent import FabricIntent
from karios.fabric_worker.rollout.render import HMAC_SHA_PROBE_CONF, NodeRenderInput, render_node_files
from tests.fixtures.golden import assert_golden

GOLDEN = Path(__file__).parent / "golden"
NODE = NodeRenderInput(hostname="node1", vtep_ip="10.255.0.1", underlay_iface="br-underlay")
BASE = {
    "asn": 65000,
    "peer_ip": "10.60.200.254",
    "router_id_base": "10.255.0.1",
    "router_id_prefix_len": 24,
    "underlay_cidr": "10.60.200.0/24",
    "vnis": [100, 200],
}
CASES = {
    "bgp_underlay": {},
    "bgp_underlay_bfd_password": {"bfd_enabled": True, "bgp_password": "s3cr3t-bgp"},
    "ospf_underlay": {"underlay": "ospf", "ospf_hello_interval": 1, "ospf_dead_interval": 4},
    "ospf_md5_bfd": {
        "underlay": "ospf",
        "bfd_enabled": True,
        "ospf_auth_type": "message-digest",
        "ospf_auth_key": "md5key",
        "ospf_auth_key_id": 7,
        "ospf_auto_ref_bw": 100000,
    },
    "ospf_hmac_sha256": {"underlay": "ospf", "ospf_auth_type": "hmac-sha-256", "ospf_auth_key": "hmackey123"},
    "ebgp_no_advertise_all_vni": {"peer_asn": 65100, "advertise_all_vni": False},
}


def _render(case: str):
    return render_node_files(FabricIntent(**(BASE | CASES[case])), NODE)


@pytest.mark.parametrize("case", sorted(CASES))
def test_frr_conf_matches_golden(case: str) -> None:
    files = _render(case)
    for suffix, text in (("frr.conf", files.frr_conf), ("daemons", files.daemons)):
        assert_golden(GOLDEN / f"{case}.{suffix}", text)


def test_daemons_enable_only_what_the_intent_uses() -> None:
    assert "ospfd=no" in _render("bgp_underlay").daemons
    assert "bfdd=no" in _render("bgp_underlay").daemons
    d = _render("ospf_md5_bfd").daemons
    assert "ospfd=yes" in d and "bfdd=yes" in d


def test_bgp_underlay_advertises_the_vtep_and_ospf_does_not_use_bgp_for_it() -> None:
    assert "network 10.255.0.1/32" in _render("bgp_underlay").frr_conf
    ospf = _render("ospf_underlay").frr_conf
    assert "network 10.255.0.1/32" not in ospf
    assert "interface vtep0\n ip ospf area 0.0.0.0\n ip ospf passive" in ospf


def _vtysh_dryrun(text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    f = tmp_path / "candidate.conf"
    f.write_text(text)
    return subprocess.run(["vtysh", "-C", "-f", str(f)], capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(shutil.which("vtysh") is None, reason="FRR's vtysh not installed: cannot dry-run configs")
@pytest.mark.parametrize("case", sorted(CASES))
def test_installed_frr_accepts_rendered_config(case: str, tmp_path: Path) -> None:
    """FRR's own parser (`vtysh -C`) accepts every rendered config; HMAC-SHA only where
    the capability probe says this FRR supports it (FRR 8.4 does not)."""
    res = _vtysh_dryrun(_render(case).frr_conf, tmp_path)
    if case == "ospf_hmac_sha256":
        capable = _vtysh_dryrun(HMAC_SHA_PROBE_CONF, tmp_path).returncode == 0
        assert (res.returncode == 0) == capable, res.stdout + res.stderr
    else:
        assert res.returncode == 0, res.stdout + res.stderr
