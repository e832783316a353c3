"""Every rule a FabricConfig must satisfy (pure: config + stored context in, violations out).

Each rule names the field it protects and says why, so the API answers 422 with ``field``
and a reason an operator can act on. ``docs/fabric.md`` lists them in this order.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from karios.common import devicetext
from karios.common.contracts.fabric import FabricConfigFields, FabricConfigInput
from karios.common.devicetext import BGP_PASSWORD_MAX, HMAC_KEY_MAX, MD5_KEY_MAX
from karios.common.errors import ValidationFailed
from karios.fabric_worker.config.pool import VtepPool

# "frr": an FRR-based switch (or a Linux router running FRR) as what it is, route reflector
# included; "other" stays the vendor-neutral reference, which the seed does not let host the RR.
EVPN_NOS = ("sonic", "cumulus", "nxos", "eos", "frr")
KNOWN_NOS = ("", *EVPN_NOS, "other")
ROLES = ("", "spine", "leaf", "border-leaf")
OSPF_AUTH_TYPES = ("", "none", "message-digest", "hmac-sha-256")
ROLLOUT_STATUSES = ("", "pending", "rolling_out", "ready", "failed", "degraded")

ASN_MAX = 4_294_967_295
AS_TRANS = 23456  # RFC 6793: placeholder for 4-byte ASNs on 2-byte speakers, never a real AS
VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
MIN_TENANT_MTU = 1280  # IPv6 minimum link MTU: the smallest tenant frame worth carrying
MAX_MTU = 9216
MIN_VTEP_PREFIX, MAX_VTEP_PREFIX = 8, 30
DEFAULT_VXLAN_MTU = 1500


@dataclass(frozen=True)
class RuleContext:
    """What validation needs beyond the request: stored secrets and preflight results."""

    frr_hmac_sha_capable: bool | None = None
    underlay_mtu: int = 0  # preflight consensus across nodes; 0 = unknown
    bgp_password_set: bool = False
    ospf_auth_key_set: bool = False
    ospf_auth_key_len: int = 0
    bgp_password_len: int = 0
    # FRR's configuration syntax ends a key at whitespace: such a key would be applied truncated.
    ospf_auth_key_space: bool = False
    bgp_password_space: bool = False


@dataclass(frozen=True)
class Violation:
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


Rule = Callable[[FabricConfigFields, RuleContext], list[Violation]]


# -- parsing helpers ---------------------------------------------------------------------------
def parse_ipv4(value: str) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(value.strip())
    except ValueError:
        return None


def parse_ipv4_cidr(value: str) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(value.strip(), strict=False)
    except ValueError:
        return None


def decode_router_id_cidr(cidr: str) -> tuple[str, int]:
    """``"10.255.0.1/24"`` → ``("10.255.0.1", 24)``; 422 on ``router_id_cidr`` otherwise."""
    try:
        iface = ipaddress.IPv4Interface(cidr.strip())
    except ValueError:
        raise ValidationFailed(
            f"router_id_cidr: {cidr!r} is not an IPv4 A.B.C.D/N", field="router_id_cidr"
        ) from None
    if "/" not in cidr:
        raise ValidationFailed("router_id_cidr: needs a prefix length (A.B.C.D/N)", field="router_id_cidr")
    return str(iface.ip), iface.network.prefixlen


def resolve_router_id_cidr(cidr: str, base: str, prefix_len: int) -> tuple[str, int]:
    """``router_id_cidr`` decoded; a base or prefix length sent with it must agree (422)."""
    rid_base, rid_len = decode_router_id_cidr(cidr)
    if base.strip() and base.strip() != rid_base:
        raise ValidationFailed(
            f"router_id_cidr: {cidr} disagrees with router_id_base {base}", field="router_id_cidr"
        )
    if prefix_len and prefix_len != rid_len:
        raise ValidationFailed(
            f"router_id_cidr: /{rid_len} disagrees with router_id_prefix_len {prefix_len}",
            field="router_id_cidr",
        )
    return rid_base, rid_len


def encode_router_id_cidr(base: str, prefix_len: int) -> str:
    return f"{base}/{prefix_len}" if base and prefix_len else ""


def _asn_ok(value: int) -> bool:
    return 1 <= value <= ASN_MAX and value != AS_TRANS


def bgp_mode(cfg: FabricConfigFields) -> str:
    """iBGP when the switch shares the nodes' AS (or has none yet), eBGP otherwise."""
    if cfg.fabric_switch_as and cfg.as_ and cfg.fabric_switch_as != cfg.as_:
        return "ebgp"
    return "ibgp"


def effective_vxlan_mtu(cfg: FabricConfigFields) -> int:
    return cfg.vxlan_mtu or DEFAULT_VXLAN_MTU


# -- merge -------------------------------------------------------------------------------------
def merge(
    stored: FabricConfigFields | None, inp: FabricConfigInput, fields_set: set[str]
) -> FabricConfigFields:
    """The config after this POST: sent fields replace stored ones; unsent ones are kept.

    ``router_id_cidr`` is decoded into ``router_id_base`` + ``router_id_prefix_len``; sending it
    together with a different base or prefix length is ambiguous and refused.
    """
    base = stored.model_dump(by_alias=False) if stored is not None else FabricConfigFields().model_dump()
    sent = {k for k in fields_set if k in FabricConfigFields.model_fields or k == "as"}
    data = inp.model_dump(by_alias=False)
    for name in sent:
        key = "as_" if name == "as" else name
        base[key] = data[key]
    if inp.router_id_cidr.strip():
        base["router_id_base"], base["router_id_prefix_len"] = resolve_router_id_cidr(
            inp.router_id_cidr,
            inp.router_id_base if "router_id_base" in sent else "",
            inp.router_id_prefix_len if "router_id_prefix_len" in sent else 0,
        )
    for key in ("fabric_switch_nos", "fabric_switch_role", "ospf_auth_type"):
        base[key] = str(base[key]).strip().lower()
    for key in ("router_id_base", "management_cidr", "fabric_switch_peering_ip", "ospf_area"):
        base[key] = str(base[key]).strip()
    return FabricConfigFields.model_validate(base)


# -- the rules ---------------------------------------------------------------------------------
def rule_sizing(cfg: FabricConfigFields, _ctx: RuleContext) -> list[Violation]:
    out = []
    if cfg.expected_nodes and not 1 <= cfg.expected_nodes <= 1000:
        out.append(Violation("expected_nodes", f"{cfg.expected_nodes} is outside 1..1000 (0 = unset)"))
    if cfg.expected_vms and not 1 <= cfg.expected_vms <= 10000:
        out.append(Violation("expected_vms", f"{cfg.expected_vms} is outside 1..10000 (0 = unset)"))
    return out


def rule_asns(cfg: FabricConfigFields, _ctx: RuleContext) -> list[Violation]:
    out = []
    if not _asn_ok(cfg.as_):
        why = (
            "is AS_TRANS (23456), reserved"
            if cfg.as_ == AS_TRANS
            else "must be a 2- or 4-byte ASN 1..4294967295"
        )
        out.append(Violation("as", f"{cfg.as_} {why}"))
    if cfg.fabric_switch_as and not _asn_ok(cfg.fabric_switch_as):
        why = "is AS_TRANS (23456), reserved" if cfg.fabric_switch_as == AS_TRANS else "must be 1..4294967295"
        out.append(Violation("fabric_switch_as", f"{cfg.fabric_switch_as} {why} (0 = unset)"))
    return out


def rule_addresses(cfg: FabricConfigFields, _ctx: RuleContext) -> list[Violation]:
    out = []
    if cfg.management_cidr and parse_ipv4_cidr(cfg.management_cidr) is None:
        out.append(Violation("management_cidr", f"{cfg.management_cidr!r} is not an IPv4 CIDR"))
    if cfg.fabric_switch_peering_ip and parse_ipv4(cfg.fabric_switch_peering_ip) is None:
        out.append(
            Violation("fabric_switch_peering_ip", f"{cfg.fabric_switch_peering_ip!r} is not an IPv4 address")
        )
    if cfg.router_id_base and parse_ipv4(cfg.router_id_base) is None:
        out.append(Violation("router_id_base", f"{cfg.router_id_base!r} is not an IPv4 address"))
    if cfg.router_id_prefix_len and not MIN_VTEP_PREFIX <= cfg.router_id_prefix_len <= MAX_VTEP_PREFIX:
        out.append(
            Violation(
                "router_id_prefix_len",
                f"/{cfg.router_id_prefix_len} is outside /{MIN_VTEP_PREFIX}../{MAX_VTEP_PREFIX}",
            )
        )
    if bool(cfg.router_id_base) != bool(cfg.router_id_prefix_len):
        missing = "router_id_prefix_len" if cfg.router_id_base else "router_id_base"
        out.append(Violation(missing, "router_id_base and router_id_prefix_len are set together"))
    return out


def rule_pool_vs_management(cfg: FabricConfigFields, _ctx: RuleContext) -> list[Violation]:
    mgmt = parse_ipv4_cidr(cfg.management_cidr) if cfg.management_cidr else None
    base = parse_ipv4(cfg.router_id_base) if cfg.router_id_base else None
    prefix_ok = MIN_VTEP_PREFIX <= cfg.router_id_prefix_len <= MAX_VTEP_PREFIX
    if mgmt is None or base is None or not prefix_ok:
        return []
    pool = VtepPool.of(str(base), cfg.router_id_prefix_len).subnet
    if pool.overlaps(mgmt):
        return [Violation("router_id_base", f"VTEP pool {pool} overlaps management_cidr {mgmt}")]
    return []


def rule_switch(cfg: FabricConfigFields, _ctx: RuleContext) -> list[Violation]:
    out = []
    # The name is rendered into the switch configuration: one hostname token (devicetext), so a
    # row stored before the API checked it is refused on its next write, not rendered.
    if problem := devicetext.switch_name_problem(cfg.fabric_switch_name):
        out.append(Violation("fabric_switch_name", problem))
    if cfg.fabric_switch_nos not in KNOWN_NOS:
        out.append(
            Violation(
                "fabric_switch_nos", f"{cfg.fabric_switch_nos!r} is not one of {', '.join(KNOWN_NOS[1:])}"
            )
        )
    if cfg.fabric_switch_role not in ROLES:
        out.append(
            Violation(
                "fabric_switch_role", f"{cfg.fabric_switch_role!r} is not one of {', '.join(ROLES[1:])}"
            )
        )
    return out


def rule_external_rr(cfg: FabricConfigFields, _ctx: RuleContext) -> list[Violation]:
    if not cfg.external_route_reflector:
        return []
    out = []
    if not cfg.fabric_switch_peering_ip:
        out.append(Violation("fabric_switch_peering_ip", "required when external_route_reflector is true"))
    if not cfg.fabric_switch_as:
        out.append(Violation("fabric_switch_as", "required when external_route_reflector is true"))
    elif cfg.as_ and cfg.fabric_switch_as != cfg.as_:
        out.append(
            Violation(
                "fabric_switch_as",
                f"a route reflector needs iBGP: fabric_switch_as {cfg.fabric_switch_as} "
                f"differs from as {cfg.as_}",
            )
        )
    if cfg.fabric_switch_nos not in EVPN_NOS:
        out.append(
            Violation(
                "fabric_switch_nos",
                f"external_route_reflector needs a BGP-EVPN-capable NOS ({', '.join(EVPN_NOS)}), "
                f"not {cfg.fabric_switch_nos or 'unset'!r}",
            )
        )
    return out


def rule_ospf(cfg: FabricConfigFields, ctx: RuleContext) -> list[Violation]:
    out = []
    if cfg.ospf_area:
        area_ok = parse_ipv4(cfg.ospf_area) is not None or (
            cfg.ospf_area.isdigit() and len(cfg.ospf_area) <= 10 and int(cfg.ospf_area) <= ASN_MAX
        )
        if not area_ok:
            out.append(Violation("ospf_area", f"{cfg.ospf_area!r} is not a dotted-quad or integer area id"))
    for name in ("ospf_hello_interval", "ospf_dead_interval"):
        v = getattr(cfg, name)
        if v and not 1 <= v <= 65535:
            out.append(Violation(name, f"{v} is outside 1..65535 seconds (0 = default)"))
    hello, dead = cfg.ospf_hello_interval or 10, cfg.ospf_dead_interval or 40
    if dead <= hello and (cfg.ospf_hello_interval or cfg.ospf_dead_interval):
        out.append(Violation("ospf_dead_interval", f"{dead}s must exceed ospf_hello_interval {hello}s"))
    if cfg.ospf_auto_ref_bw and not 1 <= cfg.ospf_auto_ref_bw <= 4_294_967:
        out.append(Violation("ospf_auto_ref_bw", f"{cfg.ospf_auto_ref_bw} is outside 1..4294967 Mbit/s"))
    if problem := devicetext.ifname_problem(cfg.ospf_fabric_interface):
        out.append(Violation("ospf_fabric_interface", problem))
    return out


def rule_ospf_auth(cfg: FabricConfigFields, ctx: RuleContext) -> list[Violation]:
    t = cfg.ospf_auth_type
    if t not in OSPF_AUTH_TYPES:
        return [Violation("ospf_auth_type", f"{t!r} is not one of none, message-digest, hmac-sha-256")]
    if t in ("", "none"):  # a key id is still stored: it must fit (0 = unset)
        bad = not 0 <= cfg.ospf_auth_key_id <= 255
        return [Violation("ospf_auth_key_id", f"{cfg.ospf_auth_key_id} is outside 0..255")] if bad else []
    out = []
    if not cfg.ospf_fabric_interface:
        out.append(
            Violation(
                "ospf_fabric_interface",
                f"FRR OSPF authentication is per interface: {t} needs ospf_fabric_interface",
            )
        )
    if t == "hmac-sha-256" and ctx.frr_hmac_sha_capable is not True:
        why = (
            "never probed: run preflight"
            if ctx.frr_hmac_sha_capable is None
            else "preflight found FRR lacks it"
        )
        out.append(Violation("ospf_auth_type", f"hmac-sha-256 needs frr_hmac_sha_capable ({why})"))
    if not ctx.ospf_auth_key_set:
        out.append(Violation("ospf_auth_key", f"{t} needs an ospf_auth_key"))
    else:
        limit = MD5_KEY_MAX if t == "message-digest" else HMAC_KEY_MAX
        if ctx.ospf_auth_key_len > limit:
            out.append(Violation("ospf_auth_key", f"{t} keys are at most {limit} characters"))
        if ctx.ospf_auth_key_space:
            out.append(Violation("ospf_auth_key", "must not contain whitespace (FRR cuts keys there)"))
    if not 1 <= cfg.ospf_auth_key_id <= 255:
        out.append(
            Violation("ospf_auth_key_id", f"{cfg.ospf_auth_key_id} is outside 1..255 ({t} needs a key id)")
        )
    return out


def rule_bgp_password(_cfg: FabricConfigFields, ctx: RuleContext) -> list[Violation]:
    out = []
    if ctx.bgp_password_len > BGP_PASSWORD_MAX:
        out.append(Violation("bgp_password", f"at most {BGP_PASSWORD_MAX} characters (TCP-MD5 key)"))
    if ctx.bgp_password_space:
        out.append(Violation("bgp_password", "must not contain whitespace (FRR cuts it there)"))
    return out


def rule_mtu(cfg: FabricConfigFields, ctx: RuleContext) -> list[Violation]:
    out = []
    min_mtu = MIN_TENANT_MTU + VXLAN_OVERHEAD
    if cfg.vxlan_mtu and not min_mtu <= cfg.vxlan_mtu <= MAX_MTU:
        out.append(
            Violation(
                "vxlan_mtu",
                f"{cfg.vxlan_mtu} is outside {min_mtu}..{MAX_MTU} "
                f"(the {VXLAN_OVERHEAD}-byte VXLAN overhead must "
                f"leave at least {MIN_TENANT_MTU} bytes for tenant frames)",
            )
        )
    elif ctx.underlay_mtu and effective_vxlan_mtu(cfg) != ctx.underlay_mtu:
        out.append(
            Violation(
                "vxlan_mtu",
                f"MTU drift: {effective_vxlan_mtu(cfg)} differs from the underlay MTU {ctx.underlay_mtu} "
                "every node reported in preflight",
            )
        )
    if cfg.public_mtu and not 576 <= cfg.public_mtu <= MAX_MTU:
        out.append(Violation("public_mtu", f"{cfg.public_mtu} is outside 576..{MAX_MTU}"))
    return out


RULES: tuple[Rule, ...] = (
    rule_sizing,
    rule_asns,
    rule_addresses,
    rule_pool_vs_management,
    rule_switch,
    rule_external_rr,
    rule_ospf,
    rule_ospf_auth,
    rule_bgp_password,
    rule_mtu,
)


def violations(cfg: FabricConfigFields, ctx: RuleContext) -> list[Violation]:
    return [v for rule in RULES for v in rule(cfg, ctx)]


def check(cfg: FabricConfigFields, ctx: RuleContext) -> None:
    """Raise 422 naming the first violated field; every violation is in ``details``."""
    found = violations(cfg, ctx)
    if found:
        first = found[0]
        raise ValidationFailed(
            str(first), field=first.field, details=[{"field": v.field, "reason": v.reason} for v in found]
        )
