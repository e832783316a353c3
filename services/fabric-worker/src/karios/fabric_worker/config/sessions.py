"""The fabric's BGP EVPN sessions as one model (pure): who peers with whom, from which source
address, in which listen range, over which underlay adjacency.

Both renderings read this model, so they cannot disagree: the switch (or gateway route
reflector) configuration (:func:`karios.fabric_worker.config.render.switch_context`) and every
compute node's ``frr.conf`` (:func:`karios.fabric_worker.rollout.access.intent_of` →
``FabricIntent.update_source``). The pair used to be decided twice: with an OSPF underlay the
switch listened on the VTEP pool and sourced from its loopback, while the nodes sourced from
their underlay address, so no session ever came up (issue 23, item 1).

The hub of the overlay (where every node's one EVPN session ends) is:

- ``switch-rr``: the fabric switch as iBGP route reflector (``external_route_reflector``);
- ``route-server``: the fabric switch in another AS (eBGP, it is then the route server whether
  or not ``external_route_reflector`` is set);
- ``gateway-rr``: the software route reflector on the gateway node (the seed's default).

In every case the nodes peer with ``fabric_switch_peering_ip`` (the seed: "Loopback IP = BGP
peer address"). The session's source follows the underlay: with OSPF the VTEP loopbacks are
routed, so sessions run loopback to loopback (node ``update-source vtep0``, hub ``update-source
lo``) and the hub listens on the VTEP pool; with a BGP underlay only the shared underlay subnet
is routed before BGP is up, so sessions run between underlay addresses and the hub listens on
the management subnet. OSPF runs as a broadcast network on both ends: every node's underlay
address is in the one management subnet, so the switch side is a shared segment (a VLAN
interface), not a point-to-point link per node — point-to-point over a shared segment never
gets past ExStart with more than one neighbour (seen on FRR 8.4 in the matrix lab).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal, Protocol

from karios.fabric_worker.config.pool import VtepPool

Hub = Literal["switch-rr", "route-server", "gateway-rr"]
NODE_LOOPBACK = "vtep0"  # the dummy device each node's VTEP address lives on
OSPF_NETWORK = "broadcast"
# eBGP between loopbacks one switch hop apart: TTL 2 (the node) / 3 (the switch, which also
# covers a node behind one more L3 hop); iBGP needs no TTL change.
NODE_EBGP_MULTIHOP = 2
HUB_EBGP_MULTIHOP = 3


class SessionInput(Protocol):
    as_: int
    external_route_reflector: bool
    fabric_switch_as: int
    fabric_switch_peering_ip: str
    management_cidr: str
    ospf_enabled: bool
    router_id_base: str
    router_id_prefix_len: int


@dataclass(frozen=True)
class EvpnSessions:
    hub: Hub
    hub_ip: str  # every node peers with this address
    hub_asn: int
    node_asn: int
    underlay: Literal["ospf", "bgp"]
    node_update_source: str  # "" = the kernel's choice (the underlay address toward hub_ip)
    hub_update_source: str  # "" likewise; "lo" = the hub's loopback (hub_ip)
    listen_range: str  # the subnet every node's source address is in ("" when unknown)
    node_multihop: int  # 0 = directly connected / iBGP
    hub_multihop: int

    @property
    def ebgp(self) -> bool:
        return self.hub_asn != self.node_asn

    @property
    def hub_is_switch(self) -> bool:
        return self.hub != "gateway-rr"

    @property
    def reflects(self) -> bool:
        """The hub reflects routes between its iBGP clients (else it is an eBGP route server)."""
        return not self.ebgp

    def node_source(self, vtep_ip: str, underlay_ip: str) -> str:
        """The address a node's session comes from: the hub must listen on it."""
        return vtep_ip if self.node_update_source == NODE_LOOPBACK else underlay_ip

    def accepts(self, source_ip: str) -> bool:
        return bool(self.listen_range) and ipaddress.IPv4Address(source_ip) in ipaddress.IPv4Network(
            self.listen_range
        )


def node_update_source(ospf: bool) -> str:
    """The one rule for a node's session source: its VTEP loopback when OSPF routes the
    loopbacks, else "" (the underlay address the kernel picks toward the hub)."""
    return NODE_LOOPBACK if ospf else ""


def evpn_sessions(cfg: SessionInput) -> EvpnSessions:
    node_asn = cfg.as_
    hub_asn = cfg.fabric_switch_as or node_asn
    ebgp = hub_asn != node_asn
    hub: Hub = "route-server" if ebgp else "switch-rr" if cfg.external_route_reflector else "gateway-rr"
    ospf = bool(cfg.ospf_enabled)
    pool = VtepPool.of(cfg.router_id_base, cfg.router_id_prefix_len) if cfg.router_id_base else None
    mgmt = ipaddress.IPv4Network(cfg.management_cidr, strict=False) if cfg.management_cidr else None
    listen = pool.subnet if ospf and pool else (mgmt if not ospf else None)
    return EvpnSessions(
        hub=hub,
        hub_ip=cfg.fabric_switch_peering_ip,
        hub_asn=hub_asn,
        node_asn=node_asn,
        underlay="ospf" if ospf else "bgp",
        node_update_source=node_update_source(ospf),
        hub_update_source="lo" if ospf else "",
        listen_range=str(listen) if listen else "",
        node_multihop=NODE_EBGP_MULTIHOP if ebgp else 0,
        hub_multihop=HUB_EBGP_MULTIHOP if ebgp else 0,
    )
