"""Contracts owned by the fabric worker: the cluster-wide FabricConfig, plans, the VTEP pool
(the rollout — preflight, apply, jobs, teardown, post-deploy, events — is in
:mod:`karios.common.contracts.fabric_rollout`).

Field names are the seed's (``../shared/seeds/000_*.txt``, ``/controlnode/fabric-config``):
a UI already speaks them. Shapes here are deliberately lenient (plain ``str``/``int``):
every semantic rule lives in one pure place, ``karios.fabric_worker.rules``, so each one
answers 422 naming its field instead of a generic type error. The exception is the grammar of
free text that lands in a switch or node configuration (:mod:`karios.common.devicetext`): the
input models refuse it at the API (:class:`DeviceTextRules`), the stored-config rules again.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from karios.common.contracts.base import Query
from karios.common.contracts.fabric_plan import FabricPlan as FabricPlan
from karios.common.contracts.fabric_plan import FabricPlanRequest as FabricPlanRequest
from karios.common.contracts.fabric_plan import PlannedConfig as PlannedConfig
from karios.common.contracts.fabric_rollout import FabricJobView
from karios.common.devicetext import DeviceTextRules
from karios.common.errors import KariosError, register_error

# AES-GCM associated data for the two secrets: a ciphertext only decrypts as what it was stored as.
BGP_PASSWORD_CONTEXT = "fabric:bgp_password"  # noqa: S105 (a label, not a secret)
OSPF_AUTH_KEY_CONTEXT = "fabric:ospf_auth_key"

# ---------------------------------------------------------------------------------------------
# FabricConfig


class FabricConfigFields(BaseModel):
    """The persisted, operator-declared fields of the FabricConfig (no secrets, no projections)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    as_: int = Field(0, alias="as", description="BGP AS of the compute nodes (BGP core)")
    advertise_all_vni: bool = Field(True, description="Advertise every local VNI into EVPN")
    bfd_enabled: bool = Field(False, description="BFD on the BGP/OSPF sessions to the fabric switch")
    expected_nodes: int = Field(0, description="Sizing hint, 1..1000 (0 = unset)")
    expected_vms: int = Field(0, description="Sizing hint, 1..10000 (0 = unset)")
    external_route_reflector: bool = Field(
        False, description="true: the BGP route reflector is the fabric switch; false: the gateway node"
    )
    fabric_switch_as: int = Field(0, description="AS of the fabric switch (equal to `as` means iBGP)")
    fabric_switch_name: str = Field(
        "", description="Fabric switch hostname: RFC 1123 label (letters, digits, inner hyphens; <= 63)"
    )
    fabric_switch_nos: str = Field("", description="sonic, cumulus, nxos, eos (or other)")
    fabric_switch_peering_ip: str = Field("", description="Switch loopback / BGP peer address")
    fabric_switch_role: str = Field("", description="spine, leaf, border-leaf")
    management_cidr: str = Field("", description="Management subnet, e.g. 192.168.111.0/24")
    ospf_area: str = Field(
        "", max_length=15, description="OSPF area (dotted quad or integer; empty = 0.0.0.0)"
    )
    ospf_auth_key_id: int = Field(0, description="OSPF message-digest key id (1..255)")
    ospf_auth_type: str = Field("", description='"" / none, message-digest, hmac-sha-256')
    ospf_auto_ref_bw: int = Field(0, description="OSPF auto-cost reference bandwidth, Mbit/s (0 = default)")
    ospf_dead_interval: int = Field(0, description="OSPF dead interval, seconds (0 = default 40)")
    ospf_enabled: bool = Field(True, description="OSPF underlay (false: BGP underlay over management)")
    ospf_fabric_interface: str = Field(
        "", description="Node interface facing the fabric switch, e.g. eth1 (Linux name, <= 15 characters)"
    )
    ospf_hello_interval: int = Field(0, description="OSPF hello interval, seconds (0 = default 10)")
    public_mtu: int = Field(0, description="Virtual-router public-side MTU (DC mode)")
    router_id_base: str = Field("", description="VTEP loopback start IP, e.g. 10.255.0.1")
    router_id_prefix_len: int = Field(0, description="VTEP pool prefix length, e.g. 24")
    vxlan_mtu: int = Field(0, description="Fabric / data-plane MTU (0 = 1500)")

    PERSISTED: ClassVar[tuple[str, ...]] = ()


FabricConfigFields.PERSISTED = tuple(FabricConfigFields.model_fields)


class FabricConfigInput(DeviceTextRules, FabricConfigFields):
    """``POST /controlnode/fabric-config`` body: the fields plus write-only and transient ones."""

    bgp_password: str = Field(
        "",
        description="Write-only; empty = unchanged. Printable ASCII, no whitespace, <= 80 characters",
        json_schema_extra={"writeOnly": True},
    )
    ospf_auth_key: str = Field(
        "",
        description="Write-only; empty = unchanged. Printable ASCII, no whitespace, <= 16 (MD5) / 64 (HMAC)",
        json_schema_extra={"writeOnly": True},
    )
    clear_bgp_password: bool = Field(False, description="Remove the stored BGP password")
    clear_ospf_auth_key: bool = Field(False, description="Remove the stored OSPF key")
    router_id_cidr: str = Field(
        "", description='"A.B.C.D/N" instead of router_id_base + router_id_prefix_len'
    )
    switch_acked: bool = Field(False, description="The switch snippet of the 409 was applied")
    switch_snippet_hash: str = Field("", description="sha256 echoed from the 409 response")
    switch_nos: str = Field("", description="NOS being acked (defaults to fabric_switch_nos)")
    acked_by: str = Field("", description="Operator identity for the audit log (one line, <= 128)")
    skip_switch_ack: bool = Field(False, description="Lab/CI bypass of the ack gate; fabric_admin only")
    # Read-only fields a UI may echo back: accepted and ignored.
    bgp_mode: str = Field("", description="Read-only (derived); ignored on input")
    bgp_password_is_set: bool = Field(False, description="Read-only; ignored on input")
    ospf_auth_key_is_set: bool = Field(False, description="Read-only; ignored on input")
    rollout_status: str = Field("", description="Read-only (owned by the rollout); ignored on input")
    frr_hmac_sha_capable: bool | None = Field(None, description="Read-only (set by preflight); ignored")
    physnet: Any = Field(None, description="Read-only projection; ignored on input")
    last_job: Any = Field(None, description="Read-only projection; ignored on input")


def _names(model: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


FabricPlanRequest.CONFIG_ONLY = frozenset(_names(FabricConfigInput) - _names(FabricPlanRequest))


class FabricConfigView(FabricConfigFields):
    """What ``GET /controlnode/fabric-config`` answers. Never carries a secret."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, serialize_by_alias=True)

    bgp_mode: str = Field("", description='Derived: "ibgp" | "ebgp"')
    bgp_password_is_set: bool = False
    ospf_auth_key_is_set: bool = False
    router_id_cidr: str = Field("", description="Derived from router_id_base / router_id_prefix_len")
    rollout_status: str = Field("ready", description="pending | rolling_out | ready | failed | degraded")
    frr_hmac_sha_capable: bool | None = Field(None, description="Preflight probe result; null = never probed")
    physnet: None = Field(
        None, description="VXLAN physnet projection of the seed; Karios has no physnet yet: always null"
    )
    last_job: FabricJobView | None = Field(
        None, description="Latest fabric job (as GET /latest) when the rollout failed/degraded"
    )
    created: bool = Field(False, description="On POST: true when this call created the row")


class UpsertFabricConfig(Query):
    """Gateway → worker: store the config. Secrets arrive already encrypted by the gateway."""

    TYPE = "karios.fabric.upsert_config.v1"

    config: FabricConfigInput
    fields_set: list[str] = Field(
        default_factory=list, description="Fields the caller sent (merge on update)"
    )
    bgp_password_enc: str | None = None
    ospf_auth_key_enc: str | None = None
    caller: str = ""
    caller_role: str = "viewer"


class FabricConfigQuery(Query):
    TYPE = "karios.fabric.config_query.v1"


class DeleteFabricConfig(Query):
    TYPE = "karios.fabric.delete_config.v1"
    caller: str = ""


class DeleteResult(BaseModel):
    deleted: bool
    message: str
    released_vteps: int = 0
    teardown_job_id: str = Field(
        "", description="Whole-fabric teardown job queued (durable command; '' = none)"
    )


# ---------------------------------------------------------------------------------------------
# Ack gate


class SwitchSnippet(BaseModel):
    """What an operator pastes on one NOS to move the BGP listen range, and how to verify it."""

    nos: str
    diff: str = Field(description="Unified-diff style: - removed line, + added line")
    snippet: str = Field(description="Commands to paste on the switch")
    verify: str = Field(description="Command that shows the new range is active")
    switch_snippet_hash: str = Field(description="sha256 of this NOS's diff; echo it when acking")


@register_error
class SwitchReconfigAckRequired(KariosError):
    """The VTEP pool moved: the switch's BGP listen range must change before the config may."""

    code = "REQUIRES_SWITCH_RECONFIG_ACK"
    http_status = 409


# ---------------------------------------------------------------------------------------------
# VTEP pool


class VtepPoolQuery(Query):
    TYPE = "karios.fabric.vtep_pool_query.v1"


class VtepPoolStatus(BaseModel):
    allocated: int
    exhausted: bool
    last_allocated_ip: str
    prefix_length: int
    remaining: int
    router_id_base: str
    start_ip: str
    subnet_cidr: str
    total_usable: int


class AllocateVtep(Query):
    """Give ``node_ip`` a VTEP loopback address (idempotent: a node keeps its address)."""

    TYPE = "karios.fabric.allocate_vtep.v1"
    node_ip: str


class ReleaseVtep(Query):
    TYPE = "karios.fabric.release_vtep.v1"
    node_ip: str


class VtepAllocation(BaseModel):
    node_ip: str
    vtep_ip: str
    created: bool = False
