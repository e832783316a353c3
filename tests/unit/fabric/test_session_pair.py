"""The pair agrees (issue 23, item 1): for every cell of the configuration matrix, the nodes'
``frr.conf`` and the hub's FRR configuration, both rendered by Karios from one stored config,
describe the same BGP session and the same OSPF adjacency.

Read from the rendered texts (not from the model they came from): a node's session source
must be inside the hub's listen range, each side's remote AS must be the other's AS, the
address the node peers with must be one the hub owns, loopback-to-loopback on both ends or
on neither, and the OSPF interface settings (network type, timers, area, authentication)
must match. The real-FRR version of this is ``tests/integration/fabric_rollout/test_matrix_lab.py``.
On today's code before the fix the OSPF cells failed here: the node peered from its underlay
address while the switch listened on the VTEP pool.
"""

from __future__ import annotations

import ipaddress
import re

import pytest

from karios.fabric_worker.rollout.intent import allocate_vteps
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files
from tests.fixtures.fabric_matrix import Addressing, Cell, cell_config, cells, hub_config, node_intent

ADDR = Addressing()
NODES = ["198.18.0.11", "198.18.0.12"]
PORT = "swp1"


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("!")]


def _block(text: str, header: str) -> list[str]:
    """The lines of the first `header` block (up to its `exit`)."""
    out: list[str] = []
    inside = False
    for ln in _lines(text):
        if ln == header:
            inside = True
            continue
        if inside:
            if ln == "exit":
                break
            out.append(ln)
    return out


def _one(pattern: str, lines: list[str]) -> str | None:
    found = [m.group(1) for ln in lines if (m := re.fullmatch(pattern, ln))]
    assert len(found) <= 1, (pattern, found)
    return found[0] if found else None


def _ospf_if(lines: list[str]) -> dict[str, str | None]:
    return {
        "network": _one(r"ip ospf network (\S+)", lines),
        "area": _one(r"ip ospf area (\S+)", lines),
        "hello": _one(r"ip ospf hello-interval (\d+)", lines),
        "dead": _one(r"ip ospf dead-interval (\d+)", lines),
        # a key chain's name is local to each router; its key id must match (checked below)
        "auth": re.sub(r"key-chain \S+", "key-chain", _one(r"ip ospf authentication\s*(.*)", lines) or "")
        or None,
        "md5_key_id": _one(r"ip ospf message-digest-key (\d+) md5 \S+", lines),
        "bfd": _one(r"ip ospf (bfd)", lines),
    }


@pytest.mark.parametrize("cell", cells(passwords=True), ids=lambda c: c.id)
def test_node_and_hub_configurations_describe_the_same_sessions(cell: Cell) -> None:
    cfg = cell_config(cell)
    intent = node_intent(cfg, cell)
    hub = hub_config(cfg, cell, PORT)
    hub_lines = _lines(hub)
    vteps = allocate_vteps(intent, NODES)

    hub_as = _one(r"router bgp (\d+)", hub_lines)
    assert hub_as, "the hub must run BGP: the nodes' one EVPN session ends there"
    listen = _one(r"bgp listen range (\S+) peer-group KARIOS-VTEPS", hub_lines)
    assert listen
    hub_remote_as = _one(r"neighbor KARIOS-VTEPS remote-as (\d+)", hub_lines)
    hub_source = _one(r"neighbor KARIOS-VTEPS update-source (\S+)", hub_lines)
    hub_multihop = _one(r"neighbor KARIOS-VTEPS ebgp-multihop (\d+)", hub_lines)
    hub_addresses = {
        ipaddress.IPv4Interface(a).ip for a in re.findall(r"^ ip address (\S+)$", hub, flags=re.M)
    }

    for node_ip, vtep in vteps.items():
        conf = render_node_files(intent, NodeRenderInput(f"n{node_ip[-1]}", vtep, "br-underlay")).frr_conf
        lines = _lines(conf)
        node_as = _one(r"router bgp (\d+)", lines)
        peer = _one(r"neighbor (\S+) remote-as \d+", lines)
        remote_as = _one(r"neighbor \S+ remote-as (\d+)", lines)
        source_dev = _one(r"neighbor \S+ update-source (\S+)", lines)
        # The session's two ends.
        assert ipaddress.IPv4Address(peer) in hub_addresses, (peer, hub_addresses)
        assert (node_as, remote_as) == (hub_remote_as, hub_as)
        source = vtep if source_dev == "vtep0" else node_ip
        assert ipaddress.IPv4Address(source) in ipaddress.IPv4Network(listen), (source, listen)
        assert (source_dev == "vtep0") == (hub_source == "lo"), (
            "loopback to loopback on both ends, or neither"
        )
        if node_as != hub_as:
            # FRR sends nothing to an eBGP peer without a policy (RFC 8212) unless told not to;
            # every node shares one AS, so routes of the others carry it back (allowas-in).
            assert "no bgp ebgp-requires-policy" in lines and "no bgp ebgp-requires-policy" in hub_lines
            assert _one(r"neighbor \S+ allowas-in (\d+)", _block(conf, "address-family l2vpn evpn")) == "1"
            assert "neighbor KARIOS-VTEPS attribute-unchanged next-hop" in _block(
                hub, "address-family l2vpn evpn"
            )
        if node_as != hub_as:  # eBGP between loopbacks needs a TTL above 1 on both ends
            node_multihop = _one(r"neighbor \S+ ebgp-multihop (\d+)", lines)
            if source_dev == "vtep0":
                assert node_multihop and int(node_multihop) >= 2 and hub_multihop and int(hub_multihop) >= 2
        assert bool(_one(r"neighbor \S+ (bfd)", lines)) == cell.bfd
        assert bool(_one(r"neighbor KARIOS-VTEPS (bfd) profile karios", hub_lines)) == cell.bfd
        assert bool(_one(r"neighbor \S+ password (\S+)", lines)) == cell.password
        assert _one(r"neighbor \S+ password (\S+)", lines) == _one(
            r"neighbor KARIOS-VTEPS password (\S+)", hub_lines
        )
        # The underlay that carries it.
        if cell.ospf:
            assert ipaddress.IPv4Address(peer) in ipaddress.IPv4Network(
                f"{ADDR.router_id_base}/{ADDR.router_id_prefix_len}", strict=False
            ), "the hub's loopback is routed by OSPF inside the VTEP pool"
            node_if = _ospf_if(_block(conf, "interface br-underlay"))
            hub_if = _ospf_if(_block(hub, f"interface {PORT}"))
            assert node_if == hub_if, (node_if, hub_if)
            assert node_if["network"] == "broadcast"
            if cell.underlay == "ospf-hmac":
                assert _one(r"key (\d+)", _lines(conf)) == _one(r"key (\d+)", hub_lines) == "3"
            assert _block(conf, "interface vtep0") and "ip ospf passive" in _block(conf, "interface vtep0")
            assert "ip ospf passive" in _block(hub, "interface lo")
        else:
            assert ipaddress.IPv4Address(peer) in ipaddress.IPv4Network(ADDR.management_cidr), (
                "without OSPF only the shared underlay subnet is routed before BGP is up"
            )
            assert _one(r"network (\S+)", _block(conf, "address-family ipv4 unicast")) == f"{vtep}/32"
            assert (
                not _block(hub, f"interface {PORT}") or not _ospf_if(_block(hub, f"interface {PORT}"))["area"]
            )


def test_the_switch_never_claims_the_gateway_route_reflectors_address() -> None:
    """With the software route reflector, the peering address is the gateway node's: the
    switch's configuration must not put it on a port or loopback (an address conflict)."""
    for cell in cells():
        if cell.hub != "gateway-rr":
            continue
        from karios.fabric_worker.config.render import render_switch_config, switch_context

        cfg = cell_config(cell)
        for nos in ("other", "sonic", "eos", "nxos", "cumulus"):
            text = render_switch_config(switch_context(cfg.model_copy(update={"fabric_switch_nos": nos})))
            owned = [ln for ln in text.splitlines() if cfg.fabric_switch_peering_ip in ln and "address" in ln]
            owned = [ln for ln in owned if not ln.lstrip().startswith(("!", "#"))]
            assert owned == [], (nos, cell.id, owned)


@pytest.mark.parametrize("cell", cells(passwords=True), ids=lambda c: c.id)
def test_every_matrix_cell_is_a_configuration_the_api_stores(cell: Cell) -> None:
    """The matrix covers what an operator can store, nothing the rules refuse (an FRR switch as
    route reflector is NOS ``frr``; ``other`` stays the reference, which may not host the RR)."""
    from karios.fabric_worker.config import rules

    cfg = cell_config(cell)
    ctx = rules.RuleContext(frr_hmac_sha_capable=True, ospf_auth_key_set=True)
    assert rules.violations(cfg, ctx) == []
    if cell.hub == "switch-rr":
        refused = rules.violations(cfg.model_copy(update={"fabric_switch_nos": "other"}), ctx)
        assert [v.field for v in refused] == ["fabric_switch_nos"]
