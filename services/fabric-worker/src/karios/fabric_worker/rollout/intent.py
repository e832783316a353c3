"""What the rollout needs to know, independent of how the fabric config is stored.

:class:`FabricIntent` is the cluster-wide desired state (secrets already decrypted by the
caller); :class:`NodeTarget` is one compute node with its SSH credentials. The VTEP pool
allocation is pure and deterministic; the caller stores the result.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from karios.common.contracts.fabric_rollout import VtepPoolHeadroom
from karios.common.netaddr import ip_sort_key
from karios.fabric_worker.config.pool import VtepPool
from karios.fabric_worker.config.sessions import node_update_source


class UnderlayProtocol(StrEnum):
    OSPF = "ospf"
    BGP = "bgp"


class OspfAuthType(StrEnum):
    NONE = "none"
    MESSAGE_DIGEST = "message-digest"
    HMAC_SHA_256 = "hmac-sha-256"


class FabricIntent(BaseModel):
    """Cluster-wide fabric intent the rollout renders into each node's FRR config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    asn: int = Field(ge=1, le=4294967295)
    peer_ip: str  # route reflector / fabric switch peering address
    peer_asn: int | None = Field(default=None, ge=1, le=4294967295)  # None: iBGP (= asn)
    router_id_base: str  # first VTEP address of the pool, e.g. "10.255.0.1"
    router_id_prefix_len: int = Field(ge=8, le=32)
    underlay_cidr: str  # where each node's underlay bridge address lives
    underlay: UnderlayProtocol = UnderlayProtocol.BGP
    ospf_area: str = "0.0.0.0"
    ospf_hello_interval: int = Field(default=10, ge=1, le=65535)
    ospf_dead_interval: int = Field(default=40, ge=1, le=65535)
    ospf_auto_ref_bw: int | None = Field(default=None, ge=1, le=4294967)
    ospf_auth_type: OspfAuthType = OspfAuthType.NONE
    ospf_auth_key: SecretStr | None = None
    ospf_auth_key_id: int = Field(default=1, ge=1, le=255)
    bfd_enabled: bool = False
    bgp_password: SecretStr | None = None
    bgp_keepalive: int = Field(default=3, ge=1, le=65535)
    bgp_holdtime: int = Field(default=9, ge=3, le=65535)
    vxlan_mtu: int = Field(default=1500, ge=1280, le=9216)
    advertise_all_vni: bool = True
    vnis: tuple[int, ...] = ()
    frr_log_file: str = "/var/log/frr/frr-{hostname}.log"  # {hostname}: one log per FRR instance
    # The device the node's BGP session is sourced from ("" = the underlay address): decided by
    # the sessions model (config/sessions.py) from the underlay, so node and switch agree.
    update_source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _session_source(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("update_source") is None:
            ospf = str(data.get("underlay", UnderlayProtocol.BGP)) == UnderlayProtocol.OSPF.value
            data = {**data, "update_source": node_update_source(ospf)}
        return data

    @field_validator("peer_ip", "router_id_base")
    @classmethod
    def _ipv4(cls, v: str) -> str:
        try:
            return str(ipaddress.IPv4Address(v.strip()))
        except ValueError:
            raise ValueError("must be an IPv4 address") from None

    @field_validator("underlay_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        try:
            return str(ipaddress.IPv4Network(v.strip(), strict=False))
        except ValueError:
            raise ValueError("must be an IPv4 CIDR such as 10.60.200.0/24") from None

    @field_validator("vnis")
    @classmethod
    def _vnis(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        for vni in v:
            if not 1 <= vni <= 16777215:
                raise ValueError(f"VNI {vni} outside 1..16777215")
        return tuple(sorted(set(v)))

    @field_validator("ospf_area")
    @classmethod
    def _area(cls, v: str) -> str:
        v = v.strip()
        if v.isdigit():
            return str(ipaddress.IPv4Address(int(v)))
        try:
            return str(ipaddress.IPv4Address(v))
        except ValueError:
            raise ValueError("OSPF area must be a number or dotted quad") from None

    @model_validator(mode="after")
    def _consistent(self) -> FabricIntent:
        if self.ospf_auth_type is not OspfAuthType.NONE:
            key = self.ospf_auth_key.get_secret_value() if self.ospf_auth_key else ""
            if not key:
                raise ValueError("ospf_auth_key is required when ospf_auth_type is set")
            if self.ospf_auth_type is OspfAuthType.MESSAGE_DIGEST and len(key) > 16:
                raise ValueError("ospf_auth_key: message-digest keys are at most 16 characters")
            if any(c.isspace() for c in key):
                raise ValueError("ospf_auth_key must not contain whitespace")
        if self.bgp_password and any(c.isspace() for c in self.bgp_password.get_secret_value()):
            raise ValueError("bgp_password must not contain whitespace")
        if self.bgp_holdtime < 3 * self.bgp_keepalive:
            raise ValueError("bgp_holdtime must be at least 3 x bgp_keepalive")
        if self.ospf_dead_interval <= self.ospf_hello_interval:
            raise ValueError("ospf_dead_interval must exceed ospf_hello_interval")
        pool = self.vtep_pool
        if ipaddress.IPv4Address(self.router_id_base) not in pool:
            raise ValueError("router_id_base is outside its own prefix")
        return self

    @property
    def vtep_pool(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.router_id_base}/{self.router_id_prefix_len}", strict=False)

    @property
    def ebgp(self) -> bool:
        return self.peer_asn is not None and self.peer_asn != self.asn

    def secrets(self) -> list[str]:
        """Every secret value, for scrubbing node output before it reaches logs or events."""
        out = []
        for s in (self.bgp_password, self.ospf_auth_key):
            if s is not None and s.get_secret_value():
                out.append(s.get_secret_value())
        return out


class NodeOverride(BaseModel):
    """Operator-supplied underlay for a node whose bridge cannot be found from the CIDR."""

    model_config = ConfigDict(frozen=True)

    node_ip: str
    underlay_iface_hint: str
    underlay_ip: str  # "10.60.200.5/24"
    underlay_bridge_name: str = ""


class NodeTarget(BaseModel):
    """One compute node and how to reach it over SSH."""

    model_config = ConfigDict(frozen=True)

    node_ip: str
    fqdn: str = ""
    ssh_host: str = ""  # defaults to node_ip
    ssh_port: int = 22
    username: str = "root"
    private_key: SecretStr | None = None  # OpenSSH/PEM private key text
    password: SecretStr | None = None
    known_host_key: str | None = None  # "ssh-ed25519 AAAA...": None = first contact, trust and report

    @property
    def host(self) -> str:
        return self.ssh_host or self.node_ip

    @property
    def label(self) -> str:
        return self.fqdn or self.node_ip


# -- VTEP pool ------------------------------------------------------------------------------


def vtep_pool_capacity(base: str, prefix_len: int, reserved: tuple[str, ...] = ()) -> int:
    """Usable VTEP addresses from `base` to the end of its prefix: the one sizing rule of
    :class:`karios.fabric_worker.config.pool.VtepPool` (no .0/.255 of any /24, nor `reserved`,
    e.g. the switch's peering IP), the same number ``GET /vtep-pool`` reports as total_usable."""
    return VtepPool.of(base, prefix_len, reserved).total_usable


def vtep_pool_status(
    base: str, prefix_len: int, expected_nodes: int, reserved: tuple[str, ...] = ()
) -> VtepPoolHeadroom:
    cap = vtep_pool_capacity(base, prefix_len, reserved)
    return VtepPoolHeadroom(
        router_id_base=base,
        router_id_prefix_len=prefix_len,
        capacity=cap,
        expected_nodes=expected_nodes,
        headroom=cap - expected_nodes,
        overalloc_warn=cap - expected_nodes < 0,
    )


class VtepPoolExhausted(ValueError):
    pass


def allocate_vteps(
    intent: FabricIntent, node_ips: list[str], existing: dict[str, str] | None = None
) -> dict[str, str]:
    """{node_ip: vtep_ip} for every node: keeps `existing` allocations still inside the pool,
    gives new nodes (in address order, so the result does not depend on list order) the
    lowest free addresses of the pool (same rule as the stored pool: :class:`VtepPool`)."""
    pool = VtepPool.of(intent.router_id_base, intent.router_id_prefix_len, (intent.peer_ip,))
    result: dict[str, str] = {}
    for ip, vtep in (existing or {}).items():
        if ip in node_ips and pool.contains(vtep) and vtep not in result.values():
            result[ip] = str(ipaddress.IPv4Address(vtep))
    free = (str(a) for a in pool.addresses() if str(a) not in result.values())
    for ip in sorted(set(node_ips) - result.keys(), key=ip_sort_key):
        vtep = next(free, None)
        if vtep is None:
            raise VtepPoolExhausted(
                f"VTEP pool {pool.subnet} has no free address for {ip} (capacity {pool.total_usable})"
            )
        result[ip] = vtep
    return dict(sorted(result.items(), key=lambda kv: ip_sort_key(kv[0])))


OverrideMode = Literal["reuse", "needs_override", "unreachable"]
