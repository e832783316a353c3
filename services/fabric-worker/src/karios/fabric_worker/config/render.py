"""Switch configuration rendering (pure): a :class:`SwitchContext` in, NOS text out.

Every line of output comes from a Jinja2 template under ``templates/``; Python only decides
the values. Secrets are never rendered: ``<bgp-password>`` / ``<ospf-auth-key>`` placeholders
stand where the operator types them on the switch.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, Protocol

from jinja2 import Environment, PackageLoader, StrictUndefined

from karios.fabric_worker.config.pool import VtepPool

SWITCH_NOS = ("sonic", "cumulus", "nxos", "eos", "other")
PEER_GROUP = "KARIOS-VTEPS"
KEY_CHAIN = "KARIOS-OSPF"
# The node-facing port each template shows (the operator repeats it for every port).
DEFAULT_PORT = {
    "sonic": "Ethernet0",
    "cumulus": "swp1",
    "nxos": "Ethernet1/1",
    "eos": "Ethernet1",
    "other": "swp1",
}
LISTEN_TEMPLATE = {"sonic": "frr", "other": "frr", "cumulus": "cumulus", "nxos": "nxos", "eos": "eos"}
VERIFY = {
    "sonic": f'vtysh -c "show bgp peer-group {PEER_GROUP}"',
    "other": f'vtysh -c "show bgp peer-group {PEER_GROUP}"',
    "cumulus": "nv show vrf default router bgp dynamic-neighbor listen-range",
    "nxos": "show running-config bgp | include neighbor",
    "eos": f"show ip bgp peer-group {PEER_GROUP}",
}


@cache
def _env() -> Environment:
    return Environment(
        loader=PackageLoader("karios.fabric_worker.config", "templates"),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - renders switch CLI text, not HTML
    )


class FabricLike(Protocol):
    as_: int
    bfd_enabled: bool
    external_route_reflector: bool
    fabric_switch_as: int
    fabric_switch_name: str
    fabric_switch_nos: str
    fabric_switch_peering_ip: str
    fabric_switch_role: str
    management_cidr: str
    ospf_area: str
    ospf_auth_type: str
    ospf_auth_key_id: int
    ospf_auto_ref_bw: int
    ospf_dead_interval: int
    ospf_enabled: bool
    ospf_hello_interval: int
    router_id_base: str
    router_id_prefix_len: int
    vxlan_mtu: int


@dataclass(frozen=True)
class SwitchContext:
    nos: str
    name: str
    role: str
    asn: int
    node_as: int
    bgp_mode: str
    underlay: str
    rr_on_switch: bool
    switch_bgp: bool
    peering_ip: str
    listen_range: str
    management_prefix_len: int
    gw_rr_ip: str
    port: str
    mtu: int
    ospf_area: str
    hello: int
    dead: int
    ospf_ref_bw: int
    auth_type: str
    auth_key_id: int
    bfd: bool
    bgp_password: bool
    overlay_hub: str
    peer_group: str = PEER_GROUP
    key_chain: str = KEY_CHAIN


def ospf_area_dotted(area: str) -> str:
    if not area:
        return "0.0.0.0"
    if area.isdigit():
        return str(ipaddress.IPv4Address(int(area)))
    return area


def switch_context(cfg: FabricLike, *, bgp_password_set: bool = False) -> SwitchContext:
    """Decide every value the templates show, from a stored or planned config."""
    nos = cfg.fabric_switch_nos or "other"
    node_as = cfg.as_
    asn = cfg.fabric_switch_as or node_as
    ebgp = asn != node_as
    underlay = "ospf" if cfg.ospf_enabled else "bgp"
    pool = VtepPool.of(cfg.router_id_base, cfg.router_id_prefix_len) if cfg.router_id_base else None
    mgmt = ipaddress.IPv4Network(cfg.management_cidr, strict=False) if cfg.management_cidr else None
    rr_on_switch = cfg.external_route_reflector and not ebgp
    auth = cfg.ospf_auth_type if cfg.ospf_auth_type not in ("", "none") else ""
    return SwitchContext(
        nos=nos,
        name=cfg.fabric_switch_name,
        role=cfg.fabric_switch_role,
        asn=asn,
        node_as=node_as,
        bgp_mode="ebgp" if ebgp else "ibgp",
        underlay=underlay,
        rr_on_switch=rr_on_switch,
        # An eBGP switch is the EVPN route server even without the RR flag.
        switch_bgp=rr_on_switch or ebgp,
        peering_ip=cfg.fabric_switch_peering_ip,
        listen_range=str(pool.subnet if underlay == "ospf" and pool else mgmt or ""),
        management_prefix_len=mgmt.prefixlen if mgmt else 24,
        gw_rr_ip=str(pool.start) if pool and pool.start else "",
        port=DEFAULT_PORT[nos],
        mtu=cfg.vxlan_mtu or 1500,
        ospf_area=ospf_area_dotted(cfg.ospf_area),
        hello=cfg.ospf_hello_interval or 10,
        dead=cfg.ospf_dead_interval or 40,
        ospf_ref_bw=cfg.ospf_auto_ref_bw,
        auth_type=auth,
        auth_key_id=cfg.ospf_auth_key_id or 1,
        bfd=cfg.bfd_enabled,
        bgp_password=bgp_password_set,
        overlay_hub=(
            "this switch (route reflector)"
            if rr_on_switch
            else "this switch (eBGP route server)"
            if ebgp
            else "the gateway node (route reflector)"
        ),
    )


def render_switch_config(ctx: SwitchContext) -> str:
    return _env().get_template(f"switch/{ctx.nos}.j2").render(sw=asdict(ctx))


# -- ack gate: BGP listen-range moves ----------------------------------------------------------
def _listen(nos: str, values: dict[str, Any]) -> str:
    return _env().get_template(f"listen_range/{LISTEN_TEMPLATE[nos]}.j2").render(**values)


def listen_range_snippet(
    nos: str, *, asn: int, node_as: int, old_range: str, new_range: str
) -> dict[str, str]:
    """The paste-able change, its diff against the running config, the verify command, the hash."""
    common = {"asn": asn, "node_as": node_as, "peer_group": PEER_GROUP}
    snippet = _listen(nos, {**common, "old_range": old_range, "new_range": new_range})
    before = (
        _listen(nos, {**common, "old_range": "", "new_range": old_range}).splitlines() if old_range else []
    )
    after = _listen(nos, {**common, "old_range": "", "new_range": new_range}).splitlines()
    diff = "\n".join(difflib.unified_diff(before, after, "running", "after", lineterm="", n=1)) + "\n"
    digest = hashlib.sha256(f"{nos}\n{old_range}\n{new_range}\n{diff}\n{snippet}".encode()).hexdigest()
    return {
        "nos": nos,
        "diff": diff,
        "snippet": snippet,
        "verify": VERIFY[nos],
        "switch_snippet_hash": digest,
    }
