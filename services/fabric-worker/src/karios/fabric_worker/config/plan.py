"""The fabric planner (pure): a sketch of a fabric in, a complete reviewable plan out.

No I/O and no clock: the same request always gives the same plan and ``plan_hash``. The
algorithm is described step by step in ``docs/fabric.md``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json

from karios.common.contracts.fabric import FabricConfigFields, FabricPlan, FabricPlanRequest, PlannedConfig
from karios.common.errors import ValidationFailed
from karios.fabric_worker.config import rules
from karios.fabric_worker.config.pool import DEFAULT_BASE, VtepPool, auto_prefix
from karios.fabric_worker.config.render import SWITCH_NOS, render_switch_config, switch_context

DEFAULT_AS = 65000
VNI_START = 10000
MIN_VNI_COUNT = 4096
CUBE_MAX_NODES = 32
HEADROOM_WARN = 0.10


def _fail(field: str, reason: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {reason}", field=field)


def _last_host(net: ipaddress.IPv4Network) -> str:
    last = net.broadcast_address - 1 if net.prefixlen < 31 else net.broadcast_address
    if int(last) & 0xFF in (0, 255):
        last -= 1
    return str(last)


def _with_cidr(req: FabricPlanRequest) -> FabricPlanRequest:
    """``router_id_cidr`` (as on POST /fabric-config) decoded into base + prefix length."""
    if not req.router_id_cidr.strip():
        return req
    base, prefix = rules.resolve_router_id_cidr(
        req.router_id_cidr, req.router_id_base, req.router_id_prefix_len
    )
    return req.model_copy(
        update={"router_id_base": base, "router_id_prefix_len": prefix, "router_id_cidr": ""}
    )


def _check_request(req: FabricPlanRequest) -> None:
    nos = req.fabric_switch_nos.strip().lower()
    if not nos:
        raise _fail("fabric_switch_nos", f"required: one of {', '.join(SWITCH_NOS)}")
    if nos not in SWITCH_NOS:
        raise _fail("fabric_switch_nos", f"{req.fabric_switch_nos!r} is not one of {', '.join(SWITCH_NOS)}")
    if not req.management_cidr.strip():
        raise _fail("management_cidr", 'required, e.g. "192.168.111.0/24"')
    if rules.parse_ipv4_cidr(req.management_cidr) is None:
        raise _fail("management_cidr", f"{req.management_cidr!r} is not an IPv4 CIDR")
    if not req.vxlan_mtu:
        raise _fail("vxlan_mtu", "required (1500 default; 9216 for jumbo frames)")
    if req.underlay not in ("", "ospf", "bgp"):
        raise _fail("underlay_mode", f"{req.underlay_mode!r} is not ospf or bgp")
    if req.deployment_mode.strip().lower() not in ("", "cube", "dc"):
        raise _fail("deployment_mode", f"{req.deployment_mode!r} is not cube or dc")
    if req.node_as and not rules._asn_ok(req.node_as):
        raise _fail(req.node_as_field, f"{req.node_as} is not a 2- or 4-byte ASN (1..4294967295, not 23456)")
    sizing = rules.rule_sizing(
        FabricConfigFields(expected_nodes=req.expected_nodes, expected_vms=req.expected_vms),
        rules.RuleContext(),
    )
    if sizing:
        raise _fail(sizing[0].field, sizing[0].reason)
    if req.router_id_base and rules.parse_ipv4(req.router_id_base) is None:
        raise _fail("router_id_base", f"{req.router_id_base!r} is not an IPv4 address")


def plan_fabric(req: FabricPlanRequest) -> FabricPlan:
    """Size the VTEP pool, fill in suggestions, list risks and notes, render the switch config.
    The numbered steps are the algorithm of docs/fabric.md; notes and risks keep their order."""
    req = _with_cidr(req)
    _check_request(req)
    notes: list[str] = []
    risks: list[str] = []
    nos = req.fabric_switch_nos.strip().lower()
    underlay = req.underlay or "ospf"
    mgmt = ipaddress.IPv4Network(req.management_cidr.strip(), strict=False)
    base, prefix = _pool_size(req, notes)  # 1
    local_as, switch_as = _asns(req, notes)  # 2
    peering_ip = _peering_ip(req, underlay, VtepPool.of(base, prefix).subnet, mgmt, notes, risks)  # 3
    capacity = VtepPool.of(base, prefix, reserved=[peering_ip]).total_usable
    mode = _deployment_mode(req, notes)  # 4
    vni_end = _vni_end(req, notes)  # 5
    planned = PlannedConfig(
        advertise_all_vni=req.advertise_all_vni,
        as_=local_as,
        bfd_enabled=req.bfd_enabled,
        expected_nodes=req.expected_nodes,
        expected_vms=req.expected_vms,
        external_route_reflector=req.external_route_reflector,
        fabric_switch_as=switch_as,
        fabric_switch_name=req.fabric_switch_name.strip(),
        fabric_switch_nos=nos,
        fabric_switch_peering_ip=peering_ip,
        fabric_switch_role=req.fabric_switch_role.strip().lower(),
        management_cidr=str(mgmt),
        ospf_area=req.ospf_area.strip(),
        ospf_auth_type=req.ospf_auth_type.strip().lower(),
        ospf_auth_key_id=req.ospf_auth_key_id
        or (1 if req.ospf_auth_type.strip().lower() not in ("", "none") else 0),
        ospf_auto_ref_bw=req.ospf_auto_ref_bw,
        ospf_dead_interval=req.ospf_dead_interval,
        ospf_enabled=underlay == "ospf",
        ospf_fabric_interface=req.ospf_fabric_interface.strip(),
        ospf_hello_interval=req.ospf_hello_interval,
        public_mtu=req.public_mtu if mode == "dc" else 0,
        router_id_base=base,
        router_id_prefix_len=prefix,
        vxlan_mtu=req.vxlan_mtu,
    )
    _check_rules(planned, risks)
    _sizing_risks(req, prefix, capacity, mode, risks)  # 6
    _bgp_risks(req, planned, underlay, notes, risks)
    plan = FabricPlan(
        config=planned,
        bgp_mode="ibgp" if planned.fabric_switch_as == planned.as_ else "ebgp",
        underlay_mode=underlay,
        deployment_mode=mode,
        vtep_capacity=capacity,
        vni_start=VNI_START,
        vni_end=vni_end,
        risks=risks,
        notes=notes,
        switch_config=render_switch_config(switch_context(planned, bgp_password_set=req.bgp_password_set)),
    )
    plan.plan_hash = plan_hash(plan)
    return plan


def _pool_size(req: FabricPlanRequest, notes: list[str]) -> tuple[str, int]:
    """1. VTEP pool: the operator's prefix verbatim, else the smallest pool with 25 % headroom."""
    base = req.router_id_base.strip() or DEFAULT_BASE
    if req.router_id_prefix_len:
        prefix = req.router_id_prefix_len
        notes.append(f"VTEP pool prefix /{prefix} taken as given (not auto-sized)")
    else:
        prefix = auto_prefix(req.expected_nodes)
        if req.expected_nodes:
            notes.append(
                f"VTEP pool auto-sized to /{prefix} for {req.expected_nodes} nodes plus 25% headroom"
            )
        else:
            notes.append(f"expected_nodes unset: default VTEP pool /{prefix}")
    if not rules.MIN_VTEP_PREFIX <= prefix <= rules.MAX_VTEP_PREFIX:
        raise _fail(
            "router_id_prefix_len", f"/{prefix} is outside /{rules.MIN_VTEP_PREFIX}../{rules.MAX_VTEP_PREFIX}"
        )
    return base, prefix


def _asns(req: FabricPlanRequest, notes: list[str]) -> tuple[int, int]:
    """2. ASNs: one AS (iBGP) unless the operator gave two different ones."""
    local_as = req.node_as or req.fabric_switch_as or DEFAULT_AS
    switch_as = req.fabric_switch_as or local_as
    if not req.node_as:
        notes.append(
            f"local_as auto-picked: {local_as}" + (" (the switch's AS: iBGP)" if req.fabric_switch_as else "")
        )
    if not req.fabric_switch_as:
        notes.append(f"fabric_switch_as suggested: {switch_as} (same AS as the nodes: iBGP)")
    return local_as, switch_as


def _peering_ip(
    req: FabricPlanRequest,
    underlay: str,
    pool_net: ipaddress.IPv4Network,
    mgmt: ipaddress.IPv4Network,
    notes: list[str],
    risks: list[str],
) -> str:
    """3. Switch peering address: its loopback at the top of the VTEP pool (OSPF underlay), or
    its address on the management subnet, where the single iBGP session runs (BGP underlay)."""
    peering_ip = req.fabric_switch_peering_ip.strip()
    if not peering_ip:
        peering_ip = _last_host(pool_net if underlay == "ospf" else mgmt)
        where = (
            "last usable VTEP pool address (switch loopback)"
            if underlay == "ospf"
            else ("last usable management address")
        )
        notes.append(f"fabric_switch_peering_ip suggested: {peering_ip} ({where})")
    elif rules.parse_ipv4(peering_ip) is None:
        raise _fail("fabric_switch_peering_ip", f"{peering_ip!r} is not an IPv4 address")
    elif underlay == "bgp" and ipaddress.IPv4Address(peering_ip) not in mgmt:
        risks.append(
            f"underlay_mode bgp: the switch peering IP {peering_ip} is outside management_cidr {mgmt}; "
            "the single iBGP session runs over the management subnet"
        )
    return peering_ip


def _deployment_mode(req: FabricPlanRequest, notes: list[str]) -> str:
    """4. Deployment mode: a cube is a handful of nodes behind one leaf; anything bigger is a DC."""
    mode = req.deployment_mode.strip().lower()
    if not mode:
        big = req.expected_nodes > CUBE_MAX_NODES or req.fabric_switch_role.strip().lower() in (
            "spine",
            "border-leaf",
        )
        mode = "dc" if big else "cube"
        notes.append(
            f"deployment_mode {mode} (auto: "
            + (
                f"more than {CUBE_MAX_NODES} nodes or a spine/border-leaf switch)"
                if big
                else f"at most {CUBE_MAX_NODES} nodes behind a leaf)"
            )
        )
    if mode == "dc" and not req.public_mtu:
        raise _fail("public_mtu", "required in DC mode (the virtual routers' public-side MTU)")
    return mode


def _vni_end(req: FabricPlanRequest, notes: list[str]) -> int:
    """5. VNI range: room for one VNI per tenant network, at least 4096."""
    vni_count = MIN_VNI_COUNT
    while vni_count < req.expected_vms:
        vni_count *= 2
    vni_end = VNI_START + vni_count - 1
    notes.append(f"VNI range {VNI_START}-{vni_end}")
    if req.expected_vms:
        notes.append(
            f"expected_vms {req.expected_vms}: tenant subnets are sized from it; "
            f"{vni_count} VNIs leave one per network"
        )
    return vni_end


def _check_rules(planned: PlannedConfig, risks: list[str]) -> None:
    """The same rules as POST /fabric-config; secrets and preflight are assumed to come later."""
    as_fields = FabricConfigFields.model_validate(planned.model_dump(by_alias=True))
    ctx = rules.RuleContext(frr_hmac_sha_capable=True, ospf_auth_key_set=True)
    found = rules.violations(as_fields, ctx)
    if planned.fabric_switch_nos == "other" and planned.external_route_reflector:
        # The vendor-neutral reference still shows a switch RR; committing it is refused (seed rule).
        found = [v for v in found if v.field != "fabric_switch_nos"]
        risks.append(
            "fabric_switch_nos other: POST /fabric-config refuses external_route_reflector until a "
            "BGP-EVPN-capable NOS (sonic, cumulus, nxos, eos, frr) is chosen; frr renders the same "
            "FRR configuration"
        )
    if found:
        raise _fail(found[0].field, found[0].reason)
    if planned.ospf_auth_type == "hmac-sha-256":
        risks.append(
            "ospf_auth_type hmac-sha-256 is refused on commit until preflight proves FRR supports it"
        )


def _sizing_risks(req: FabricPlanRequest, prefix: int, capacity: int, mode: str, risks: list[str]) -> None:
    """6. Risks an operator can act on: pool headroom and MTUs."""
    if req.expected_nodes:
        headroom = capacity - req.expected_nodes
        if headroom < 0:
            risks.append(
                f"VTEP pool /{prefix} holds {capacity} addresses, {-headroom} fewer than expected_nodes "
                f"{req.expected_nodes}: widen router_id_prefix_len"
            )
        elif headroom < req.expected_nodes * HEADROOM_WARN:
            risks.append(
                f"VTEP pool headroom is {headroom} addresses (<10% of {req.expected_nodes} nodes): "
                "growth needs a pool move and a switch re-configuration"
            )
    tenant_mtu = req.vxlan_mtu - rules.VXLAN_OVERHEAD
    if tenant_mtu < 1500:
        risks.append(
            f"vxlan_mtu {req.vxlan_mtu} leaves {tenant_mtu} bytes for tenant frames after the "
            f"{rules.VXLAN_OVERHEAD}-byte VXLAN overhead: guests must use MTU {tenant_mtu} or the "
            "underlay must carry at least 1550 (9216 for jumbo)"
        )
    if mode == "dc" and req.public_mtu > tenant_mtu:
        risks.append(
            f"public_mtu {req.public_mtu} exceeds the tenant MTU {tenant_mtu}: large public packets "
            "will need fragmentation or PMTUD towards guests"
        )


def _bgp_risks(
    req: FabricPlanRequest, planned: PlannedConfig, underlay: str, notes: list[str], risks: list[str]
) -> None:
    """6. (cont.) Route reflection and eBGP caveats; underlay and NOS notes."""
    local_as, switch_as, peering_ip = planned.as_, planned.fabric_switch_as, planned.fabric_switch_peering_ip
    if switch_as == local_as:
        where = (
            f"the fabric switch {planned.fabric_switch_name or peering_ip}"
            if req.external_route_reflector
            else "the gateway node"
        )
        risks.append(
            f"single route reflector ({where}): while it is down no EVPN routes are exchanged; "
            "existing tunnels keep forwarding until BGP hold timers expire"
        )
        notes.append(
            "iBGP: every node peers with the route reflector only; route-targets auto-derive "
            f"from AS {local_as}"
        )
    else:
        risks.append(
            f"eBGP (nodes AS {local_as}, switch AS {switch_as}): the switch is the EVPN route server and "
            "must keep next-hops unchanged; auto-derived route-targets embed the AS, so set them "
            "explicitly (or rfc8365-compatible auto-RT) on both sides"
        )
        if req.external_route_reflector:
            risks.append("external_route_reflector is ignored with eBGP: route reflection is an iBGP feature")
        if underlay == "bgp":
            risks.append(
                "underlay_mode bgp is proven with iBGP only (one session carrying loopbacks and EVPN)"
            )
    if underlay == "bgp":
        notes.append(
            "underlay bgp: no OSPF; one iBGP session per node over the management subnet carries the "
            "IPv4 loopback /32s and EVPN"
        )
    if planned.fabric_switch_nos == "other":
        notes.append("fabric_switch_nos other: the switch configuration is a vendor-neutral FRR reference")


def plan_hash(plan: FabricPlan) -> str:
    """sha256 of the canonical JSON of the plan (sorted keys, no whitespace, hash excluded)."""
    body = plan.model_dump(mode="json", by_alias=True, exclude={"plan_hash"})
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
