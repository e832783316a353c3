"""Contracts of the fabric rollout: preflight, apply, cancel, the job views, node teardown,
post-deploy checks and the rollout events (the configuration itself is in
:mod:`karios.common.contracts.fabric`).

Field names are the seed's (``../shared/seeds/000_*.txt``, ``/controlnode/fabric-config/*``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, computed_field

from karios.common.contracts.base import Command, Event, Query
from karios.common.errors import KariosError, register_error

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


def preflight_ready(modes: Iterable[str], blockers: Sequence[object]) -> bool:
    """The one definition of preflight's ``ready``: nodes were found, every one resolved
    (``reuse``, the seed's rule) and nothing blocks the apply (a blocker makes POST .../apply
    answer 409, so "ready" with a blocker would be a lie)."""
    found = list(modes)
    return bool(found) and all(m == "reuse" for m in found) and not blockers


class FabricPreflightResult(BaseModel):
    underlay_cidr: str
    nodes: list[PreflightNodeView]
    matched_bridges: list[str]
    node_overrides: list[PreflightOverride] = Field(default_factory=list)
    underlay_mtu: int
    mtu_drift: list[MtuDriftView]
    vtep_pool: VtepPoolHeadroom
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

    @computed_field(
        description="Derived: true iff there are nodes, every one is reuse and there is no blocker"
    )
    @property
    def ready(self) -> bool:
        return preflight_ready((n.mode for n in self.nodes), self.blockers)


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


# ---------------------------------------------------------------------------------------------
# Drift detection (issue 13 item 5): a periodic read-only verify of every node against the intent


class DriftFinding(BaseModel):
    """One way a node differs from the intent. ``kind`` is one of ``unreachable``,
    ``frr config``, ``frr daemons``, ``frr vtysh.conf``, ``frr not running``, ``vtep0 missing``,
    ``vtep0``, ``vxlan``, ``bgp session``, ``bgp shutdown`` (the neighbor shut down by hand),
    ``evpn``, ``mtu``, ``vteps`` (this node misses remote VTEPs the other nodes see),
    ``vtep not seen`` (no other node sees this node's VTEP)."""

    kind: str
    message: str


class NodeDriftView(BaseModel):
    """``GET /controlnode/fabric-config/drift/{node_ip}``: the last check of one node."""

    node_ip: str
    fqdn: str = ""
    drifted: bool
    findings: list[DriftFinding] = Field(default_factory=list)
    frr_config_sha256: str = Field("", description="sha256 of the node's /etc/frr/frr.conf ('' absent)")
    intent_sha256: str = Field("", description="sha256 of the frr.conf the intent renders for the node")
    checked_at: str = ""
    since: str = Field("", description="when the node entered its current drift state")
    settling: bool = Field(
        False,
        description="the fabric is settling after an apply: BGP/EVPN/VTEP findings are held until "
        "the node's sessions re-establish or the settle window ends",
    )
    held: list[DriftFinding] = Field(
        default_factory=list,
        description="findings seen but not reported (yet): while settling, or a VTEP finding seen "
        "in one round only (reported when the next round sees it too)",
    )


class FabricDriftView(BaseModel):
    """``GET /controlnode/fabric-config/drift``: the last drift round over every node."""

    checked_at: str = Field("", description="end of the last round ('' none has run)")
    interval_s: float = 0.0
    nodes_total: int = 0
    nodes_drifted: int = 0
    nodes: list[NodeDriftView] = Field(default_factory=list)
    settle_s: float = Field(0.0, description="settle window after an apply or teardown, seconds")
    against: str = Field(
        "",
        description="what the nodes are checked against: 'config' (the stored configuration, "
        "applied), 'last_applied' (an edit is pending or the last apply failed: the configuration "
        "the nodes were last given), '' (nothing applied: no node is checked)",
    )


class FabricDriftQuery(Query):
    TYPE = "karios.fabric.drift_query.v1"
    node_ip: str = ""


class FabricDriftEvent(Event):
    """A node's drift state changed (SSE channel ``fabric``, event name ``fabric_switch``):
    ``state`` is ``node_drifted`` or ``node_drift_cleared``. No secrets."""

    TYPE = "karios.fabric.drift_event.v1"
    state: str
    node_ip: str
    fqdn: str = ""
    drifted: bool
    findings: list[DriftFinding] = Field(default_factory=list)
    message: str = ""
    checked_at: str = ""
