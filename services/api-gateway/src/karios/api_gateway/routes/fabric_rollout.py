"""``/controlnode/fabric-config/...`` rollout endpoints (owned by fabric-worker, issue 6).

Thin: path/shape validation, role per endpoint, then the bus. Roles: viewer reads (latest,
post-deploy); operator runs the read-only preflight (SSH fan-out, no kernel change; it records
the probe results on the config); fabric_admin applies, cancels and tears down.
Long work (apply) is a command answered 202; progress streams on SSE channel ``fabric``
(event ``fabric_switch``).
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from sqlmodel import select

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.readcache import FABRIC_DRIFT_KEY, FABRIC_LATEST_KEY, read_cache
from karios.api_gateway.readmodel import JobRow
from karios.common.contracts.fabric_diff import FabricDiffQuery, FabricDiffView
from karios.common.contracts.fabric_rollout import (
    ApplyAccepted,
    BatchNodePostdeploy,
    BatchPostdeploy,
    CancelAccepted,
    CancelFabricApply,
    FabricDriftQuery,
    FabricDriftView,
    FabricJobView,
    FabricLatestQuery,
    FabricPreflightRequest,
    FabricPreflightResult,
    NodeDriftView,
    NodeTeardownView,
    PostdeployQuery,
    PostdeployStep,
    RequestFabricApply,
    TeardownFabricNode,
)
from karios.common.contracts.inventory import NodeAccess, NodeAccessQuery
from karios.common.errors import KariosError, NotFound, ValidationFailed
from karios.common.limits import Ident, IPText

router = APIRouter(prefix="/controlnode/fabric-config", tags=["fabric"])
# Path ids as long as their columns (a longer one is a 422, never a lookup).
NodeIp = Annotated[IPText, Path(description="The node's OS IP address")]
JobId = Annotated[Ident, Path(description="The apply's job id")]
BatchId = Annotated[Ident, Path(description="A batch (parent) id, job id, node or BMC IP, or `registered`")]

SSH_TIMEOUT = 90.0  # bus timeout of requests that SSH to nodes
_ERRORS = {
    401: {"description": "Missing or invalid token"},
    403: {"description": "Role too low"},
    503: {"description": "fabric-worker (or inventory) unavailable"},
}


def _node_ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValidationFailed(f"node_ip: {value!r} is not an IP address", field="node_ip") from None


async def _start_apply(
    request: Request, principal: Principal, node_ip: str = "", *, force: bool = False
) -> ApplyAccepted:
    """ONE bus request: the worker checks (the last preflight's blockers too), writes the job row
    and queues the command; the 202 carries its real job id, created flag and config id."""
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.request("fabric", "request_apply"),
        RequestFabricApply(
            node_ip=node_ip, caller=principal.name, caller_role=principal.role.name, force=force
        ),
        timeout=15,
        reply=ApplyAccepted,
    )


FORCE = Query(
    False,
    description="Apply although the last preflight found blockers (an underlay MTU below vxlan_mtu, an "
    "unreachable or unresolved node, a pool without room); fabric_admin only, logged",
)
_APPLY_409 = {
    "description": "An apply/teardown is running, no node registered, the config is incomplete, or "
    "FABRIC_PREFLIGHT_BLOCKED: details.blockers names each node (and its MTU) the last preflight "
    "found unfit (the first 100; details.blockers_total counts them all); details.max_vxlan_mtu is "
    "the largest vxlan_mtu the underlay carries"
}


@router.post(
    "/preflight",
    response_model=FabricPreflightResult,
    summary="Preflight underlay resolution per compute node",
    description="Read-only SSH fan-out: per node reuse / override / needs_override / unreachable, the "
    "underlay MTU consensus and drift, VTEP pool headroom and the FRR HMAC-SHA probe (stored on the config).",
    responses={422: {"description": "Invalid field (named in `field`)"}, **_ERRORS},
)
async def preflight(
    body: FabricPreflightRequest, request: Request, _p: Principal = Depends(require(Role.operator))
) -> FabricPreflightResult:
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.request("fabric", "preflight"), body, timeout=SSH_TIMEOUT, reply=FabricPreflightResult
    )


@router.post(
    "/apply",
    status_code=202,
    response_model=ApplyAccepted,
    summary="Manually trigger a fabric rollout to compute nodes",
    responses={
        404: {"description": "No fabric configuration stored"},
        409: _APPLY_409,
        422: {"description": "vnis: no L2 VNI configured on the worker"},
        **_ERRORS,
    },
)
async def apply(
    request: Request, force: bool = FORCE, principal: Principal = Depends(require(Role.fabric_admin))
) -> ApplyAccepted:
    return await _start_apply(request, principal, force=force)


@router.post(
    "/apply/{job_id}/cancel",
    status_code=202,
    response_model=CancelAccepted,
    summary="Cancel an in-flight fabric apply",
    description="202 at once; nodes roll back asynchronously (apply_cancelling → apply_cancelled on SSE). "
    "Idempotent; 404 when job_id is not the in-flight apply. Any fabric-worker replica answers (the job "
    "row is the source of truth); the replica running the apply gets the cancel by broadcast, and "
    "polls the stored cancel flag as a backstop.",
    responses={404: {"description": "Not the in-flight apply"}, **_ERRORS},
)
async def cancel(
    job_id: Annotated[Ident, Path(description="The apply's job id")],
    request: Request,
    _p: Principal = Depends(require(Role.fabric_admin)),
) -> CancelAccepted:
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.request("fabric", "cancel_apply"),
        CancelFabricApply(job_id=job_id),
        reply=CancelAccepted,
    )


@router.get(
    "/latest",
    response_model=FabricJobView,
    summary="Get the most recent fabric lifecycle job",
    responses={404: {"description": "No fabric job has run"}, **_ERRORS},
)
async def latest(request: Request, _p: Principal = Depends(require(Role.viewer))) -> Response:
    bus = request.app.state.runtime.bus
    # Shared as GET /fabric-config (api_gateway.readcache): every fabric event drops it.
    return await read_cache(request.app).response(
        FABRIC_LATEST_KEY,
        lambda: bus.request(bus.subjects.query("fabric", "latest"), FabricLatestQuery(), reply=FabricJobView),
        request,
    )


@router.get(
    "/drift",
    response_model=FabricDriftView,
    summary="Drift of every fabric node from the intent (last periodic check)",
    responses=_ERRORS,
)
async def drift(request: Request, _p: Principal = Depends(require(Role.viewer))) -> Response:
    bus = request.app.state.runtime.bus
    return await read_cache(request.app).response(  # shared as /latest
        FABRIC_DRIFT_KEY,
        lambda: bus.request(bus.subjects.query("fabric", "drift"), FabricDriftQuery(), reply=FabricDriftView),
        request,
    )


@router.get(
    "/drift/{node_ip}",
    response_model=NodeDriftView,
    summary="Drift of one node from the intent (last periodic check); repair with a node apply",
    responses={404: {"description": "Node not checked (not in the fabric, or no round yet)"}, **_ERRORS},
)
async def node_drift(
    request: Request, node_ip: NodeIp, _p: Principal = Depends(require(Role.viewer))
) -> NodeDriftView:
    rt = request.app.state.runtime
    view = await rt.bus.request(
        rt.bus.subjects.query("fabric", "drift"),
        FabricDriftQuery(node_ip=_node_ip(node_ip)),
        reply=FabricDriftView,
    )
    return view.nodes[0]


@router.post(
    "/diff",
    response_model=FabricDiffView,
    summary="Preview an apply: per-node diff of the FRR files and links (nothing is changed)",
    description="Read-only SSH fan-out running the apply's own discover → render → diff, stopped before "
    "the commit: per node unified diffs of daemons / frr.conf / vtysh.conf (secrets redacted: BGP "
    "passwords and OSPF keys read `<redacted>`), the vtep0 / vxlanN / brN changes, the FRR action, "
    "`changed`, `reachable` and `error`. No VTEP is allocated: `vtep_ip` is the one an apply would use.",
    responses={
        404: {"description": "No fabric configuration stored, or node_ip not registered"},
        409: {"description": "The stored configuration cannot be rolled out (the field is named)"},
        422: {"description": "node_ip is not an IP address"},
        **_ERRORS,
    },
)
async def diff(
    request: Request,
    node_ip: Annotated[IPText, Query(description="Only this node (its OS IP)")] = "",
    _p: Principal = Depends(require(Role.operator)),
) -> FabricDiffView:
    rt = request.app.state.runtime
    q = FabricDiffQuery(node_ip=_node_ip(node_ip) if node_ip else "")
    return await rt.bus.request(
        rt.bus.subjects.query("fabric", "diff"), q, timeout=SSH_TIMEOUT, reply=FabricDiffView
    )


@router.post(
    "/node/{node_ip}/apply",
    status_code=202,
    response_model=ApplyAccepted,
    summary="Apply EVPN/FRR config to a single node",
    responses={
        404: {"description": "Unknown node or no fabric configuration"},
        409: _APPLY_409,
        **_ERRORS,
    },
)
async def apply_node(
    node_ip: NodeIp,
    request: Request,
    force: bool = FORCE,
    principal: Principal = Depends(require(Role.fabric_admin)),
) -> ApplyAccepted:
    return await _start_apply(request, principal, _node_ip(node_ip), force=force)


@router.delete(
    "/node/{node_ip}",
    response_model=NodeTeardownView,
    summary="Tear down EVPN/FRR on a single node",
    responses={404: {"description": "Unknown node"}, 409: {"description": "An apply is running"}, **_ERRORS},
)
async def teardown_node(
    node_ip: NodeIp, request: Request, _p: Principal = Depends(require(Role.fabric_admin))
) -> NodeTeardownView:
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.request("fabric", "teardown_node"),
        TeardownFabricNode(node_ip=_node_ip(node_ip)),
        timeout=SSH_TIMEOUT,
        reply=NodeTeardownView,
    )


@router.get(
    "/node/{node_ip}/postdeploy",
    response_model=list[PostdeployStep],
    summary="Post-deployment step checklist for one node",
    responses={404: {"description": "Unknown node or no fabric configuration"}, **_ERRORS},
)
async def node_postdeploy(
    node_ip: NodeIp, request: Request, _p: Principal = Depends(require(Role.viewer))
) -> list[PostdeployStep]:
    rt = request.app.state.runtime
    return await _postdeploy(rt, PostdeployQuery(node_ip=_node_ip(node_ip)))


async def _postdeploy(rt, q: PostdeployQuery) -> list[PostdeployStep]:  # type: ignore[no-untyped-def]
    raw = await rt.bus.request(rt.bus.subjects.query("fabric", "postdeploy"), q, timeout=SSH_TIMEOUT)
    return [PostdeployStep.model_validate(s) for s in raw]


REGISTERED = "registered"  # batch id of every registered compute node


@dataclass(frozen=True)
class _Member:
    """One node of a post-deploy aggregate: from a provisioning job, or a registered node."""

    node_ip: str
    bmc_ip: str
    job_id: str
    at: str


async def _batch_members(rt, batch_id: str) -> list[_Member]:  # type: ignore[no-untyped-def]
    """The provisioning batch's jobs (jobs sharing parent_id; a single job is a batch of one).
    A node never provisioned in a batch (installed before, or provisioned alone and addressed by
    its IP) is reached by its OS or BMC IP as the id; ``registered`` lists every registered node."""
    assert rt.db is not None
    async with rt.db.session() as s:
        rows = (
            await s.exec(select(JobRow).where(sa.or_(JobRow.parent_id == batch_id, JobRow.id == batch_id)))
        ).all()
    jobs = [r for r in rows if r.parent_id == batch_id] or [r for r in rows if r.id == batch_id]
    if jobs:
        return [_Member(j.node_ip, j.bmc_ip, j.id, j.updated_at.isoformat()) for j in jobs]
    try:
        raw = await rt.bus.request(rt.bus.subjects.query("inventory", "node_access"), NodeAccessQuery())
    except NotFound:
        raw = []
    nodes = [NodeAccess.model_validate(a) for a in raw or []]
    now = datetime.now(UTC).isoformat()
    picked = [n for n in nodes if batch_id in (REGISTERED, n.node_ip, n.bmc_ip)]
    if not picked:
        raise NotFound(f"no provisioning batch, job or registered node {batch_id}")
    return [_Member(n.node_ip, n.bmc_ip, "", now) for n in picked]


@router.get(
    "/batches/{batch_id}/postdeploy",
    response_model=BatchPostdeploy,
    summary="Post-deployment aggregate for a provisioning batch",
    description="Every node of the provisioning batch (jobs sharing parent_id), each with node_ip and "
    "bmc_ip and its checklist; nodes without an OS IP yet are pending. A node that was not provisioned "
    "in a batch is reached by its OS IP or BMC IP as the id (a batch of one); `registered` aggregates "
    "every registered node (the nodes an apply reaches).",
    responses={404: {"description": "Unknown batch, job or node"}, **_ERRORS},
)
async def batch_postdeploy(
    batch_id: Annotated[
        Ident, Path(description="A batch (parent) id, job id, node or BMC IP, or `registered`")
    ],
    request: Request,
    _p: Principal = Depends(require(Role.viewer)),
) -> BatchPostdeploy:
    rt = request.app.state.runtime
    members = await _batch_members(rt, batch_id)
    sem = asyncio.Semaphore(8)

    async def one(m: _Member) -> BatchNodePostdeploy:
        node = BatchNodePostdeploy(node_ip=m.node_ip, bmc_ip=m.bmc_ip, job_id=m.job_id)
        if not m.node_ip:
            step = PostdeployStep(step_id="node_ip", status="pending", message="node has no OS IP yet")
            return node.model_copy(update={"steps": [_tag(step, m, batch_id)]})
        try:
            async with sem:
                q = PostdeployQuery(node_ip=m.node_ip, bmc_ip=m.bmc_ip, batch_id=batch_id)
                steps = await _postdeploy(rt, q)
        except KariosError as exc:
            steps = [
                _tag(PostdeployStep(step_id="fabric", status="failed", message=exc.message), m, batch_id)
            ]
        return node.model_copy(update={"steps": steps, "ok": all(st.status == "passed" for st in steps)})

    nodes = list(await asyncio.gather(*(one(m) for m in members)))
    pending = sum(1 for n in nodes if not n.node_ip)
    ok = sum(1 for n in nodes if n.ok)
    return BatchPostdeploy(
        batch_id=batch_id,
        total_nodes=len(nodes),
        ok_nodes=ok,
        failed_nodes=len(nodes) - ok - pending,
        pending_nodes=pending,
        ok=bool(nodes) and ok == len(nodes),
        nodes=nodes,
    )


def _tag(step: PostdeployStep, m: _Member, batch_id: str) -> PostdeployStep:
    return step.model_copy(
        update={
            "node_ip": m.node_ip,
            "bmc_ip": m.bmc_ip,
            "batch_id": batch_id,
            "created_at": m.at,
            "updated_at": m.at,
        }
    )
