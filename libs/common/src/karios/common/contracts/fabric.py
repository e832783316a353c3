"""Contracts owned by the fabric worker: the cluster-wide FabricConfig, plans, the VTEP pool.

Field names are the seed's (``../shared/seeds/000_*.txt``, ``/controlnode/fabric-config``):
a UI already speaks them. Shapes here are deliberately lenient (plain ``str``/``int``):
every semantic rule lives in one pure place, ``karios.fabric_worker.rules``, so each one
answers 422 naming its field instead of a generic type error.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from karios.common.contracts.base import Command, Event, Query
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
    fabric_switch_name: str = Field("", description="Fabric switch name")
    fabric_switch_nos: str = Field("", description="sonic, cumulus, nxos, eos (or other)")
    fabric_switch_peering_ip: str = Field("", description="Switch loopback / BGP peer address")
    fabric_switch_role: str = Field("", description="spine, leaf, border-leaf")
    management_cidr: str = Field("", description="Management subnet, e.g. 192.168.111.0/24")
    ospf_area: str = Field("", description="OSPF area (dotted quad or integer; empty = 0.0.0.0)")
    ospf_auth_key_id: int = Field(0, description="OSPF message-digest key id (1..255)")
    ospf_auth_type: str = Field("", description='"" / none, message-digest, hmac-sha-256')
    ospf_auto_ref_bw: int = Field(0, description="OSPF auto-cost reference bandwidth, Mbit/s (0 = default)")
    ospf_dead_interval: int = Field(0, description="OSPF dead interval, seconds (0 = default 40)")
    ospf_enabled: bool = Field(True, description="OSPF underlay (false: BGP underlay over management)")
    ospf_fabric_interface: str = Field("", description="Node interface facing the fabric switch, e.g. eth1")
    ospf_hello_interval: int = Field(0, description="OSPF hello interval, seconds (0 = default 10)")
    public_mtu: int = Field(0, description="Virtual-router public-side MTU (DC mode)")
    router_id_base: str = Field("", description="VTEP loopback start IP, e.g. 10.255.0.1")
    router_id_prefix_len: int = Field(0, description="VTEP pool prefix length, e.g. 24")
    vxlan_mtu: int = Field(0, description="Fabric / data-plane MTU (0 = 1500)")

    PERSISTED: ClassVar[tuple[str, ...]] = ()


FabricConfigFields.PERSISTED = tuple(FabricConfigFields.model_fields)


class FabricConfigInput(FabricConfigFields):
    """``POST /controlnode/fabric-config`` body: the fields plus write-only and transient ones."""

    bgp_password: str = Field(
        "", description="Write-only; empty = unchanged", json_schema_extra={"writeOnly": True}
    )
    ospf_auth_key: str = Field(
        "", description="Write-only; empty = unchanged", json_schema_extra={"writeOnly": True}
    )
    clear_bgp_password: bool = Field(False, description="Remove the stored BGP password")
    clear_ospf_auth_key: bool = Field(False, description="Remove the stored OSPF key")
    router_id_cidr: str = Field(
        "", description='"A.B.C.D/N" instead of router_id_base + router_id_prefix_len'
    )
    switch_acked: bool = Field(False, description="The switch snippet of the 409 was applied")
    switch_snippet_hash: str = Field("", description="sha256 echoed from the 409 response")
    switch_nos: str = Field("", description="NOS being acked (defaults to fabric_switch_nos)")
    acked_by: str = Field("", description="Operator identity for the audit log")
    skip_switch_ack: bool = Field(False, description="Lab/CI bypass of the ack gate; fabric_admin only")
    # Read-only fields a UI may echo back: accepted and ignored.
    bgp_mode: str = Field("", description="Read-only (derived); ignored on input")
    bgp_password_is_set: bool = Field(False, description="Read-only; ignored on input")
    ospf_auth_key_is_set: bool = Field(False, description="Read-only; ignored on input")
    rollout_status: str = Field("", description="Read-only (owned by the rollout); ignored on input")
    frr_hmac_sha_capable: bool | None = Field(None, description="Read-only (set by preflight); ignored")
    physnet: Any = Field(None, description="Read-only projection; ignored on input")
    last_job: Any = Field(None, description="Read-only projection; ignored on input")


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
# Plan


class FabricPlanRequest(Query):
    """``POST /controlnode/fabric-config/plan`` body (seed fields plus optional rendering inputs)."""

    TYPE = "karios.fabric.plan.v1"
    model_config = ConfigDict(extra="ignore")

    expected_nodes: int = Field(0, description="Sizing hint; unset = default /24 pool")
    expected_vms: int = Field(0, description="Sizing hint for tenant subnets (notes only)")
    fabric_switch_as: int = Field(0, description="0 => planner suggests")
    fabric_switch_name: str = ""
    fabric_switch_nos: str = Field("", description="sonic|cumulus|nxos|eos|other (required)")
    fabric_switch_peering_ip: str = Field("", description="empty => planner suggests")
    fabric_switch_role: str = Field("", description="spine|leaf|border-leaf")
    local_as: int = Field(0, description="0 => auto-pick")
    management_cidr: str = Field("", description='e.g. "192.168.111.0/24" (required)')
    public_mtu: int = Field(0, description="VR public-side MTU: required in DC mode")
    router_id_base: str = Field("", description="empty => 10.255.0.0")
    router_id_prefix_len: int = Field(0, description="0 => auto-size; operator value honoured verbatim")
    underlay_mode: str = Field("", description='"" / "ospf" (default) | "bgp"')
    vxlan_mtu: int = Field(0, description="Fabric/data-plane MTU (required)")
    # Optional extras that change the rendered switch configuration.
    deployment_mode: str = Field("", description='"" (auto) | "cube" | "dc"')
    external_route_reflector: bool = Field(False, description="Route reflector on the switch")
    bfd_enabled: bool = False
    ospf_area: str = ""
    ospf_auth_type: str = ""
    ospf_auth_key_id: int = 0
    ospf_fabric_interface: str = ""
    ospf_hello_interval: int = 0
    ospf_dead_interval: int = 0
    bgp_password_set: bool = Field(False, description="Render BGP authentication (placeholder secret)")


class PlannedConfig(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    advertise_all_vni: bool = True
    as_: int = Field(0, alias="as")
    bfd_enabled: bool = False
    bgp_password: str = Field("", description="Never echoed: always empty")
    expected_nodes: int = 0
    expected_vms: int = 0
    external_route_reflector: bool = False
    fabric_switch_as: int = 0
    fabric_switch_name: str = ""
    fabric_switch_nos: str = ""
    fabric_switch_peering_ip: str = ""
    fabric_switch_role: str = ""
    management_cidr: str = ""
    ospf_area: str = ""
    ospf_auth_type: str = ""
    ospf_auth_key_id: int = 0
    ospf_auto_ref_bw: int = 0
    ospf_dead_interval: int = 0
    ospf_enabled: bool = True
    ospf_fabric_interface: str = ""
    ospf_hello_interval: int = 0
    public_mtu: int = 0
    rollout_status: str = ""
    router_id_base: str = ""
    router_id_prefix_len: int = 0
    vxlan_mtu: int = 0


class FabricPlan(BaseModel):
    config: PlannedConfig
    bgp_mode: str
    underlay_mode: str
    deployment_mode: str
    vtep_capacity: int
    vni_start: int
    vni_end: int
    risks: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    switch_config: str = ""
    plan_hash: str = ""


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


# ---------------------------------------------------------------------------------------------
# Rollout (issue 6): preflight, apply, cancel, latest, node apply/teardown, post-deploy


class PreflightOverride(BaseModel):
    node_ip: str = Field(description="(required)")
    underlay_iface_hint: str = Field("", description="(required)")
    underlay_ip: str = Field("", description='host/CIDR, e.g. "10.60.200.5/24" (required)')
    underlay_bridge_name: str = Field("", description="optional, derive from CIDR when empty")


class FabricPreflightRequest(Query):
    """``POST /controlnode/fabric-config/preflight`` body (seed fields)."""

    TYPE = "karios.fabric.preflight.v1"
    model_config = ConfigDict(extra="ignore")

    underlay_cidr: str = Field("", description='IPv4 CIDR, e.g. "10.60.200.0/24" (required)')
    router_id_base: str = Field("", description="VTEP pool base, falls back to stored FabricConfig")
    router_id_prefix_len: int = Field(0, description="VTEP pool prefix, falls back to stored FabricConfig")
    expected_nodes: int = Field(0, description="override stored sizing hint for capacity warn")
    node_overrides: list[PreflightOverride] = Field(default_factory=list)


class PreflightNodeView(BaseModel):
    node_ip: str
    fqdn: str = ""
    mode: str = Field(description="reuse | override | needs_override | unreachable")
    needs_override: bool = False
    bridge: str = ""
    bridge_mtu: int = 0
    underlay_ip: str = ""
    reason: str = ""


class MtuDriftView(BaseModel):
    node_ip: str
    fqdn: str = ""
    bridge: str
    bridge_mtu: int


class VtepPoolHeadroom(BaseModel):
    router_id_base: str
    router_id_prefix_len: int
    capacity: int
    expected_nodes: int
    headroom: int
    overalloc_warn: bool


class PreflightBlocker(BaseModel):
    """One reason an apply of the stored configuration would be refused (409) unless forced."""

    kind: str = Field(description="mtu | unreachable | needs_override | pool_headroom")
    field: str = Field(description="What to fix: vxlan_mtu, node_ip, node_overrides or router_id_prefix_len")
    node_ip: str = ""
    fqdn: str = ""
    mtu: int = Field(0, description="kind mtu: the node's underlay bridge MTU")
    message: str


class FabricPreflightResult(BaseModel):
    underlay_cidr: str
    nodes: list[PreflightNodeView]
    matched_bridges: list[str]
    node_overrides: list[PreflightOverride] = Field(default_factory=list)
    underlay_mtu: int
    mtu_drift: list[MtuDriftView]
    vtep_pool: VtepPoolHeadroom
    ready: bool
    frr_hmac_sha_capable: bool | None = Field(None, description="FRR HMAC-SHA probe (null: no node probed)")
    max_vxlan_mtu: int = Field(
        0,
        description="Largest vxlan_mtu every reuse node's underlay carries (smallest bridge MTU); 0: none",
    )
    mtu_outliers: list[MtuDriftView] = Field(
        default_factory=list,
        description="Nodes whose underlay MTU differs from the most common one (the nodes to fix)",
    )
    blockers: list[PreflightBlocker] = Field(
        default_factory=list,
        description="Why POST .../apply would answer 409 for the stored vxlan_mtu and pool (force: go on)",
    )


@register_error
class PreflightBlocked(KariosError):
    """The last preflight found nodes the configuration cannot be applied to (MTU below
    vxlan_mtu, unreachable, unresolved underlay) or a pool without room; ``details.blockers``
    names each. A fabric_admin may force the apply."""

    code = "FABRIC_PREFLIGHT_BLOCKED"
    http_status = 409


class RequestFabricApply(Query):
    """Gateway → worker, the one request behind ``POST .../apply``: the worker checks (a config
    exists, it can be rolled out, nothing in flight, nodes registered), writes the queued job row
    and sends itself :class:`StartFabricApply`; it answers :class:`ApplyAccepted`."""

    TYPE = "karios.fabric.request_apply.v1"
    node_ip: str = ""
    caller: str = ""
    caller_role: str = ""
    force: bool = Field(False, description="Apply despite preflight blockers (fabric_admin only; logged)")


class StartFabricApply(Command):
    """Run an apply job (every registered node, or only ``node_ip``)."""

    TYPE = "karios.fabric.start_apply.v1"
    job_id: str
    node_ip: str = ""
    caller: str = ""


class StartFabricTeardown(Command):
    """Remove the fabric from ``node_ips`` (durable: sent by ``DELETE /fabric-config``, retried
    after a worker restart). Credentials are looked up when it runs; no secret travels."""

    TYPE = "karios.fabric.start_teardown.v1"
    job_id: str
    node_ips: list[str] = Field(default_factory=list)
    vnis: list[int] = Field(default_factory=list)
    caller: str = ""


class ApplyAccepted(BaseModel):
    apply_job_id: str
    created: bool = Field(True, description="true if new record (the job row was written), false if updated")
    id: int = Field(1, description="FabricConfig id (the config row the job rolls out)")
    message: str = ""


class CancelFabricApply(Query):
    TYPE = "karios.fabric.cancel_apply.v1"
    job_id: str


class CancelAccepted(BaseModel):
    job_id: str
    state: str = "apply_cancelling"
    message: str = ""


class FabricLatestQuery(Query):
    TYPE = "karios.fabric.latest_query.v1"


class JobType(StrEnum):
    APPLY = "fabric_apply"
    TEARDOWN = "fabric_teardown"


class JobStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    PARTIAL = "partial"
    CANCELLED = "cancelled"


class RolloutStatus(StrEnum):
    PENDING = "pending"
    ROLLING_OUT = "rolling_out"
    READY = "ready"
    FAILED = "failed"
    DEGRADED = "degraded"
    REMOVED = "removed"  # a teardown job only: the configuration is deleted, its nodes cleaned


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


class FabricJobNodeView(BaseModel):
    node_ip: str
    fqdn: str = ""
    ok: bool = False
    reachable: bool = Field(True, description="false = SSH dial failed before EVPN step ran")
    error: str = ""
    changed: bool = False
    rolled_back: bool = False
    vtep_ip: str = ""


class FabricJobView(BaseModel):
    """``GET /controlnode/fabric-config/latest`` (seed fields) and ``last_job`` of the config.
    Also the worker's own job summary (``karios.fabric_worker.rollout.summary``): one model."""

    job_id: str
    job_type: JobType = Field(description="fabric_apply | fabric_teardown")
    job_status: JobStatus = Field(
        JobStatus.RUNNING, description="running | completed | failed | partial | cancelled"
    )
    rollout_status: RolloutStatus = RolloutStatus.ROLLING_OUT
    state: str = Field("", description="last SSE state: apply_*/teardown_*/node_*")
    progress: int = 0
    strict: bool = False
    fabric_id: str = "1"
    total_nodes: int = 0
    completed_nodes: int = 0
    failed_nodes: int = 0
    first_fail_node: str = ""
    first_fail_error: str = ""
    error: str = ""
    nodes: list[FabricJobNodeView] = Field(default_factory=list)
    created_at: str = Field(default_factory=_now)
    updated_at: str = Field(default_factory=_now)


FabricConfigView.model_rebuild()  # last_job: FabricJobView is defined below it


class TeardownFabricNode(Query):
    TYPE = "karios.fabric.teardown_node.v1"
    node_ip: str


class NodeTeardownView(BaseModel):
    node_ip: str
    removed: bool
    reachable: bool = True
    message: str = ""
    steps: list[str] = Field(default_factory=list)


class PostdeployQuery(Query):
    TYPE = "karios.fabric.postdeploy_query.v1"
    node_ip: str
    bmc_ip: str = ""
    batch_id: str = ""


class PostdeployStep(BaseModel):
    """One step of a node's post-deploy checklist (seed fields)."""

    step_id: str
    status: str = Field(description="passed | failed | warning | pending")
    message: str = ""
    progress: int = 0
    node_ip: str = ""
    bmc_ip: str = ""
    batch_id: str = ""
    created_at: str = ""
    updated_at: str = ""


class BatchNodePostdeploy(BaseModel):
    node_ip: str = ""
    bmc_ip: str = ""
    job_id: str = ""
    ok: bool = False
    steps: list[PostdeployStep] = Field(default_factory=list)


class BatchPostdeploy(BaseModel):
    batch_id: str
    total_nodes: int
    ok_nodes: int
    failed_nodes: int
    pending_nodes: int
    ok: bool
    nodes: list[BatchNodePostdeploy]


class FabricRolloutEvent(Event):
    """Progress of a fabric job (SSE channel ``fabric``, event name ``fabric_switch``). No secrets.
    The worker's rollout core emits exactly this model."""

    TYPE = "karios.fabric.rollout_event.v1"
    job_id: str
    job_type: JobType
    state: str
    progress: int = 0
    node_ip: str = ""
    fqdn: str = ""
    message: str = ""
