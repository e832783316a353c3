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
import uuid

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Request
from sqlmodel import select

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.readmodel import JobRow
from karios.common.contracts.fabric import (
    ApplyAccepted,
    BatchNodePostdeploy,
    BatchPostdeploy,
    CancelAccepted,
    CancelFabricApply,
    FabricApplyCheck,
    FabricJobView,
    FabricLatestQuery,
    FabricPreflightRequest,
    FabricPreflightResult,
    NodeTeardownView,
    PostdeployQuery,
    PostdeployStep,
    StartFabricApply,
    TeardownFabricNode,
)
from karios.common.errors import KariosError, NotFound, ValidationFailed

router = APIRouter(prefix="/controlnode/fabric-config", tags=["fabric"])

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


async def _start_apply(request: Request, principal: Principal, node_ip: str = "") -> ApplyAccepted:
    rt = request.app.state.runtime
    sub = rt.bus.subjects
    await rt.bus.request(sub.request("fabric", "apply_check"), FabricApplyCheck(node_ip=node_ip), timeout=15)
    job_id = str(uuid.uuid4())
    await rt.bus.send_command(
        StartFabricApply(job_id=job_id, node_ip=node_ip, caller=principal.name),
        sub.cmd("fabric", "apply"),
        entity=job_id,
        msg_id=job_id,
    )
    what = f"node {node_ip}" if node_ip else "every registered node"
    return ApplyAccepted(
        apply_job_id=job_id,
        created=True,
        id=1,
        message=f"fabric apply to {what} queued; follow SSE channel fabric (fabric_switch) or job:{job_id}",
    )


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
        409: {"description": "An apply/teardown is running, no node registered, or the config is incomplete"},
        **_ERRORS,
    },
)
async def apply(
    request: Request, principal: Principal = Depends(require(Role.fabric_admin))
) -> ApplyAccepted:
    return await _start_apply(request, principal)


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
    job_id: str, request: Request, _p: Principal = Depends(require(Role.fabric_admin))
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
async def latest(request: Request, _p: Principal = Depends(require(Role.viewer))) -> FabricJobView:
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.query("fabric", "latest"), FabricLatestQuery(), reply=FabricJobView
    )


@router.post(
    "/node/{node_ip}/apply",
    status_code=202,
    response_model=ApplyAccepted,
    summary="Apply EVPN/FRR config to a single node",
    responses={404: {"description": "Unknown node or no fabric configuration"}, **_ERRORS},
)
async def apply_node(
    node_ip: str, request: Request, principal: Principal = Depends(require(Role.fabric_admin))
) -> ApplyAccepted:
    return await _start_apply(request, principal, _node_ip(node_ip))


@router.delete(
    "/node/{node_ip}",
    response_model=NodeTeardownView,
    summary="Tear down EVPN/FRR on a single node",
    responses={404: {"description": "Unknown node"}, 409: {"description": "An apply is running"}, **_ERRORS},
)
async def teardown_node(
    node_ip: str, request: Request, _p: Principal = Depends(require(Role.fabric_admin))
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
    node_ip: str, request: Request, _p: Principal = Depends(require(Role.viewer))
) -> list[PostdeployStep]:
    rt = request.app.state.runtime
    raw = await rt.bus.request(
        rt.bus.subjects.query("fabric", "postdeploy"),
        PostdeployQuery(node_ip=_node_ip(node_ip)),
        timeout=SSH_TIMEOUT,
    )
    return [PostdeployStep.model_validate(s) for s in raw]


@router.get(
    "/batches/{batch_id}/postdeploy",
    response_model=BatchPostdeploy,
    summary="Post-deployment aggregate for a provisioning batch",
    description="Every node of the provisioning batch (jobs sharing parent_id), each with node_ip and "
    "bmc_ip and its checklist; nodes without an OS IP yet are pending.",
    responses={404: {"description": "Unknown batch"}, **_ERRORS},
)
async def batch_postdeploy(
    batch_id: str, request: Request, _p: Principal = Depends(require(Role.viewer))
) -> BatchPostdeploy:
    rt = request.app.state.runtime
    assert rt.db is not None
    async with rt.db.session() as s:
        rows = (
            await s.exec(select(JobRow).where(sa.or_(JobRow.parent_id == batch_id, JobRow.id == batch_id)))
        ).all()
    children = [r for r in rows if r.parent_id == batch_id]
    if not rows:
        raise NotFound(f"no provisioning batch {batch_id}")
    if not children:  # a single job (no batch) is a batch of one
        children = [r for r in rows if r.id == batch_id]
    sem = asyncio.Semaphore(8)

    async def one(job: JobRow) -> BatchNodePostdeploy:
        node = BatchNodePostdeploy(node_ip=job.node_ip, bmc_ip=job.bmc_ip, job_id=job.id)
        if not job.node_ip:
            step = PostdeployStep(step_id="node_ip", status="pending", message="node has no OS IP yet")
            return node.model_copy(update={"steps": [_tag(step, job, batch_id)]})
        try:
            async with sem:
                raw = await rt.bus.request(
                    rt.bus.subjects.query("fabric", "postdeploy"),
                    PostdeployQuery(node_ip=job.node_ip, bmc_ip=job.bmc_ip, batch_id=batch_id),
                    timeout=SSH_TIMEOUT,
                )
            steps = [PostdeployStep.model_validate(x) for x in raw]
        except KariosError as exc:
            steps = [
                _tag(PostdeployStep(step_id="fabric", status="failed", message=exc.message), job, batch_id)
            ]
        return node.model_copy(update={"steps": steps, "ok": all(st.status == "passed" for st in steps)})

    nodes = list(await asyncio.gather(*(one(j) for j in children)))
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


def _tag(step: PostdeployStep, job: JobRow, batch_id: str) -> PostdeployStep:
    now = job.updated_at.isoformat()
    return step.model_copy(
        update={
            "node_ip": job.node_ip,
            "bmc_ip": job.bmc_ip,
            "batch_id": batch_id,
            "created_at": now,
            "updated_at": now,
        }
    )
