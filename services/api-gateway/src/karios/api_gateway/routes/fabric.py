"""``/controlnode/fabric-config`` — the cluster-wide fabric configuration (owned by fabric-worker).

Thin: shape validation, secrets encrypted here (they never cross the bus in clear), the
caller's identity and role forwarded (the worker honours ``skip_switch_ack`` for
``fabric_admin`` only), errors mapped by their code.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.readcache import FABRIC_CONFIG_KEY, read_cache
from karios.common.contracts.fabric import (
    BGP_PASSWORD_CONTEXT,
    OSPF_AUTH_KEY_CONTEXT,
    DeleteFabricConfig,
    DeleteResult,
    FabricConfigInput,
    FabricConfigQuery,
    FabricConfigView,
    FabricPlan,
    FabricPlanRequest,
    UpsertFabricConfig,
    VtepPoolQuery,
    VtepPoolStatus,
)
from karios.common.crypto import SecretBox

router = APIRouter(prefix="/controlnode/fabric-config", tags=["fabric"])

_ERRORS = {
    401: {"description": "Missing or invalid token"},
    403: {"description": "Role too low"},
    503: {"description": "fabric-worker unavailable"},
}


class AckRequired(BaseModel):
    code: str = "REQUIRES_SWITCH_RECONFIG_ACK"
    message: str
    field: str | None = None
    details: dict = {}


@router.get(
    "",
    response_model=FabricConfigView,
    response_model_exclude={"created"},  # a POST-only flag: a GET creates nothing
    summary="Get the current network fabric config",
    responses={404: {"description": "No fabric configuration stored"}, **_ERRORS},
)
async def get_fabric_config(request: Request, _p: Principal = Depends(require(Role.viewer))) -> Response:
    bus = request.app.state.runtime.bus

    async def load() -> bytes:
        view = await bus.request(
            bus.subjects.query("fabric", "config"), FabricConfigQuery(), reply=FabricConfigView
        )
        return view.model_dump_json(exclude={"created"}).encode()

    # One fabric-worker round trip (1,000 nodes: ~200 KB) serves every reader for up to
    # READ_TTL_S, encoded once; dropped by any write through this gateway and by every fabric
    # event it relays (api_gateway.readcache).
    return await read_cache(request.app).response(FABRIC_CONFIG_KEY, load, request)


@router.post(
    "",
    response_model=FabricConfigView,
    summary="Store network fabric configuration",
    description=(
        "Upsert: creates on the first call (201), then merges the fields sent (200). Secrets are write-only. "
        "Moving the VTEP pool answers 409 REQUIRES_SWITCH_RECONFIG_ACK with per-NOS switch snippets; "
        "re-POST with switch_acked, switch_snippet_hash and acked_by. skip_switch_ack needs fabric_admin. "
        "While a fabric job (apply or teardown) runs: 409 FABRIC_JOB_RUNNING naming the job, nothing written."
    ),
    responses={
        201: {"description": "Created", "model": FabricConfigView},
        409: {
            "description": "REQUIRES_SWITCH_RECONFIG_ACK, or FABRIC_JOB_RUNNING (a fabric job runs: "
            "`details.job_id`, `details.kind`, `details.cancel`; nothing written)",
            "model": AckRequired,
        },
        422: {"description": "A rule failed (named in `field`); nothing written"},
        **_ERRORS,
    },
)
async def post_fabric_config(
    body: FabricConfigInput,
    request: Request,
    response: Response,
    principal: Principal = Depends(require(Role.operator)),
) -> FabricConfigView:
    rt = request.app.state.runtime
    box: SecretBox = request.app.state.secret_box
    req = UpsertFabricConfig(
        config=body.model_copy(update={"bgp_password": "", "ospf_auth_key": ""}),
        fields_set=sorted(body.model_fields_set),
        bgp_password_enc=box.encrypt(body.bgp_password, context=BGP_PASSWORD_CONTEXT)
        if body.bgp_password
        else None,
        ospf_auth_key_enc=(
            box.encrypt(body.ospf_auth_key, context=OSPF_AUTH_KEY_CONTEXT) if body.ospf_auth_key else None
        ),
        caller=principal.name,
        caller_role=principal.role.name,
    )
    view = await rt.bus.request(
        rt.bus.subjects.request("fabric", "upsert_config"), req, reply=FabricConfigView
    )
    response.status_code = 201 if view.created else 200
    return view


@router.delete(
    "",
    response_model=DeleteResult,
    summary="Delete network fabric configuration",
    description="Hard delete. When nodes hold VTEP addresses, their teardown is queued as a durable "
    "job (`teardown_job_id`; progress on SSE channel fabric, result on GET /fabric-config/latest): it "
    "survives a worker restart and is retried.",
    responses={
        404: {"description": "No fabric configuration stored"},
        409: {"description": "FABRIC_JOB_RUNNING: a fabric apply/teardown runs (named); nothing deleted"},
        **_ERRORS,
    },
)
async def delete_fabric_config(
    request: Request, principal: Principal = Depends(require(Role.fabric_admin))
) -> DeleteResult:
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.request("fabric", "delete_config"),
        DeleteFabricConfig(caller=principal.name),
        reply=DeleteResult,
    )


@router.post(
    "/plan",
    response_model=FabricPlan,
    summary="Dry-run a fabric configuration",
    description="Pure: sizes the VTEP pool, suggests what is unset, lists risks and notes, renders the "
    "switch "
    "configuration for fabric_switch_nos. Writes nothing; commit with POST /controlnode/fabric-config.",
    responses={422: {"description": "A required or invalid field (named in `field`)"}, **_ERRORS},
)
async def plan_fabric_config(
    body: FabricPlanRequest, request: Request, _p: Principal = Depends(require(Role.operator))
) -> FabricPlan:
    rt = request.app.state.runtime
    return await rt.bus.request(rt.bus.subjects.query("fabric", "plan"), body, reply=FabricPlan)


@router.get(
    "/vtep-pool",
    response_model=VtepPoolStatus,
    summary="Get VTEP IP pool status",
    responses={404: {"description": "No fabric configuration stored"}, **_ERRORS},
)
async def get_vtep_pool(request: Request, _p: Principal = Depends(require(Role.viewer))) -> VtepPoolStatus:
    # Not shared: an allocation (a bus request from the provisioner or an apply) announces no
    # event that would drop a kept answer.
    rt = request.app.state.runtime
    return await rt.bus.request(
        rt.bus.subjects.query("fabric", "vtep_pool"), VtepPoolQuery(), reply=VtepPoolStatus
    )
