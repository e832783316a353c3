"""Switch configuration rendering (pure): a :class:`SwitchContext` in, NOS text out.

Every line of output comes from a Jinja2 template under ``templates/``; Python only decides
the values. Secrets are never rendered: ``<bgp-password>`` / ``<ospf-auth-key>`` placeholders
stand where the operator types them on the switch.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Protocol

from jinja2 import Environment, PackageLoader, StrictUndefined

from karios.common.devicetext import guard_render_values
from karios.fabric_worker.config import switchdiff
from karios.fabric_worker.config.sessions import OSPF_NETWORK, evpn_sessions

SWITCH_NOS = ("sonic", "cumulus", "nxos", "eos", "frr", "other")
PEER_GROUP = "KARIOS-VTEPS"
KEY_CHAIN = "KARIOS-OSPF"
# The node-facing port each template shows (the operator repeats it for every port).
DEFAULT_PORT = {
    "sonic": "Ethernet0",
    "cumulus": "swp1",
    "nxos": "Ethernet1/1",
    "eos": "Ethernet1",
    "frr": "swp1",
    "other": "swp1",
}
# The command that shows the switch's running configuration (the ack gate's "verify").
VERIFY = {
    "sonic": 'vtysh -c "show running-config"; show runningconfiguration all',
    "other": 'vtysh -c "show running-config"',
    "frr": 'vtysh -c "show running-config"',
    "cumulus": "nv config show -o commands",
    "nxos": "show running-config",
    "eos": "show running-config",
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
    switch_ip: str
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
    hub_update_source: str = ""
    hub_multihop: int = 0
    ospf_network: str = OSPF_NETWORK
    peer_group: str = PEER_GROUP
    key_chain: str = KEY_CHAIN


def ospf_area_dotted(area: str) -> str:
    if not area:
        return "0.0.0.0"
    if area.isdigit():
        return str(ipaddress.IPv4Address(int(area)))
    return area


def switch_context(cfg: FabricLike, *, bgp_password_set: bool = False, port: str = "") -> SwitchContext:
    """Decide every value the templates show, from a stored or planned config. The BGP side
    (hub, AS numbers, listen range, source addresses) comes from the one sessions model the
    nodes' ``frr.conf`` is rendered from too. `port`: the node-facing port's name (default: the
    NOS's usual first port; the operator repeats its lines for every node-facing port)."""
    nos = cfg.fabric_switch_nos or "other"
    sessions = evpn_sessions(cfg)
    mgmt = ipaddress.IPv4Network(cfg.management_cidr, strict=False) if cfg.management_cidr else None
    auth = cfg.ospf_auth_type if cfg.ospf_auth_type not in ("", "none") else ""
    return SwitchContext(
        nos=nos,
        name=cfg.fabric_switch_name,
        role=cfg.fabric_switch_role,
        asn=sessions.hub_asn,
        node_as=sessions.node_asn,
        bgp_mode="ebgp" if sessions.ebgp else "ibgp",
        underlay=sessions.underlay,
        rr_on_switch=sessions.hub == "switch-rr",
        switch_bgp=sessions.hub_is_switch,
        peering_ip=cfg.fabric_switch_peering_ip,
        # The address the switch owns: none when the peering address is the gateway node's RR.
        switch_ip=cfg.fabric_switch_peering_ip if sessions.hub_is_switch else "",
        listen_range=sessions.listen_range,
        management_prefix_len=mgmt.prefixlen if mgmt else 24,
        gw_rr_ip=sessions.hub_ip if sessions.hub == "gateway-rr" else "",
        port=port or DEFAULT_PORT[nos],
        mtu=cfg.vxlan_mtu or 1500,
        ospf_area=ospf_area_dotted(cfg.ospf_area),
        hello=cfg.ospf_hello_interval or 10,
        dead=cfg.ospf_dead_interval or 40,
        ospf_ref_bw=cfg.ospf_auto_ref_bw,
        auth_type=auth,
        auth_key_id=cfg.ospf_auth_key_id or 1,
        bfd=cfg.bfd_enabled,
        bgp_password=bgp_password_set,
        overlay_hub={
            "switch-rr": "this switch (route reflector)",
            "route-server": "this switch (eBGP route server)",
            "gateway-rr": "the gateway node (route reflector)",
        }[sessions.hub],
        hub_update_source=sessions.hub_update_source,
        hub_multihop=sessions.hub_multihop,
    )


def route_reflector_context(
    cfg: FabricLike, *, bgp_password_set: bool = False, port: str = ""
) -> SwitchContext:
    """The software route reflector on the gateway node (``external_route_reflector`` false,
    iBGP): the same sessions, with the gateway node as their hub. It is a Linux node running
    FRR, so it is rendered in FRR syntax; its underlay (OSPF on its uplink, its loopback) is
    the one a switch would run."""
    ctx = switch_context(cfg, bgp_password_set=bgp_password_set, port=port or "eth0")
    if ctx.switch_bgp:
        raise ValueError("the route reflector is on the fabric switch: render the switch configuration")
    return replace(
        ctx,
        nos="other",
        name="gateway node",
        role="route reflector",
        rr_on_switch=True,
        switch_bgp=True,
        switch_ip=ctx.peering_ip,
        overlay_hub="this node (software route reflector)",
    )


def render_route_reflector_config(ctx: SwitchContext) -> str:
    return _env().get_template("route_reflector.j2").render(sw=_values(ctx))


# Template variable → the configuration field it comes from (named in a refusal).
_FIELD_OF = {"name": "fabric_switch_name", "role": "fabric_switch_role", "nos": "fabric_switch_nos"}


def _values(ctx: SwitchContext) -> dict:
    values = asdict(ctx)
    guard_render_values(values, _FIELD_OF)  # no value may end a line of the configuration
    return values


def render_switch_config(ctx: SwitchContext) -> str:
    return _env().get_template(f"switch/{ctx.nos}.j2").render(sw=_values(ctx))


# -- ack gate: what the switch must be told --------------------------------------------------
def render_for_nos(cfg: FabricLike, nos: str, *, bgp_password_set: bool = False) -> str:
    """The switch configuration of `cfg` as NOS `nos` renders it (whatever `cfg` names)."""
    ctx = switch_context(cfg, bgp_password_set=bgp_password_set)
    return render_switch_config(replace(ctx, nos=nos, port=DEFAULT_PORT[nos]))


def switch_snippet(nos: str, before: str, after: str) -> dict[str, str]:
    """The paste-able change from `before` to `after` (two renderings for `nos`), the diff of
    their configuration lines, the verify command and the hash (NOS, both texts, snippet)."""
    snippet = switchdiff.change(nos, before, after)
    old, new = switchdiff.config_lines(nos, before), switchdiff.config_lines(nos, after)
    diff = "\n".join(difflib.unified_diff(old, new, "running", "after", lineterm="", n=2))
    digest = hashlib.sha256("\n".join([nos, "\n".join(old), "\n".join(new), snippet]).encode()).hexdigest()
    return {
        "nos": nos,
        "diff": diff + "\n" if diff else "",
        "snippet": snippet,
        "verify": VERIFY[nos],
        "switch_snippet_hash": digest,
    }
