"""Jobs and the installer's callbacks: ``GET/PATCH /controlnode/job/{id}``, cancel, and the
callbacks the boot medium makes (``/job/{id}/step``, ``/job/{id}/complete``, ``/firstboot``).

Callbacks carry the per-job token the medium embeds (``X-Karios-Job-Token`` header or
``?token=``), never an operator token; an unknown job and a wrong token get the same answer. The
token is hashed here: only its SHA-256 goes on the bus. A token is good only for the callback its
job's state expects (provisioner ``jobs/tokens.py``): anything else is a 409 naming why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Literal
from urllib.parse import parse_qs

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from sqlmodel import col, select

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.models import (
    CompleteBody,
    FirstbootBody,
    JobPatch,
    StepBody,
)
from karios.api_gateway.readmodel import (
    JobOut,
    JobRow,
    end_job,
    job_json,
)
from karios.api_gateway.routes.provision import JobId, _db
from karios.common.contracts.provision import (
    CallbackRequestV2,
    CancelJob,
    JobView,
    job_token_hash,
)
from karios.common.crypto import SecretBox
from karios.common.errors import Conflict, NotFound, ValidationFailed
from karios.common.http import ErrorResponse
from karios.common.provisioning import (
    TERMINAL_STATES,
    bound_log,
    bound_message,
)

router = APIRouter(prefix="/controlnode", tags=["provisioning"])


async def _job(request: Request, job_id: str) -> JobRow:
    async with _db(request).session() as s:
        row = await s.get(JobRow, job_id)
    if row is None:
        raise NotFound(f"no job {job_id}")
    return row


class JobPage(BaseModel):
    """``GET /controlnode/jobs``: one page of jobs, newest first, and how many match."""

    items: list[JobOut]
    total: int = Field(description="Jobs matching the filters (all pages)")


JobStatus = Literal["running", "completed", "failed", "cancelled", "stuck"]


@router.get(
    "/jobs",
    response_model=JobPage,
    summary="Jobs, newest first: history and active (filters: status, since, BMC, id prefix)",
    description="Every provisioning job the gateway has seen, ended ones included (the queue, "
    "`GET /controlnode/provision/queue`, has only active ones). `id_prefix` finds a job from the "
    "first characters of its id (a client's prefix lookup).",
)
async def list_jobs(
    request: Request,
    status: Annotated[list[JobStatus], Query(description="Only jobs with one of these statuses")] = [],  # noqa: B006
    since: Annotated[
        datetime | None, Query(description="Only jobs created at or after this time (ISO 8601)")
    ] = None,
    bmc_ip: Annotated[
        str, Query(max_length=64, pattern=r"^[0-9A-Fa-f.:]*$", description="Only this BMC's jobs (its IP)")
    ] = "",
    id_prefix: Annotated[
        str, Query(max_length=64, pattern=r"^[A-Za-z0-9_.:-]*$", description="Only ids starting with this")
    ] = "",
    offset: Annotated[int, Query(ge=0, le=2_147_483_647, description="Items to skip")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size")] = 100,
    _p: Principal = Depends(require(Role.viewer)),
) -> dict:
    where = []
    if status:
        where.append(col(JobRow.status).in_(status))
    if since is not None:
        try:
            since = since.astimezone(UTC) if since.tzinfo else since.replace(tzinfo=UTC)
        except OverflowError:
            raise ValidationFailed("since: out of range", field="since") from None
        where.append(col(JobRow.created_at) >= since)
    if bmc_ip:
        where.append(col(JobRow.bmc_ip) == bmc_ip)
    if id_prefix:
        where.append(col(JobRow.id).startswith(id_prefix, autoescape=True))
    async with _db(request).session() as s:
        total = (await s.exec(select(sa.func.count()).select_from(JobRow).where(*where))).one()
        rows = (
            await s.exec(
                select(JobRow)
                .where(*where)
                .order_by(col(JobRow.created_at).desc(), col(JobRow.id))
                .offset(offset)
                .limit(limit)
            )
        ).all()
    return {"items": [job_json(r) for r in rows], "total": int(total)}


@router.get(
    "/job/{id}",
    response_model=JobOut,
    responses={404: {"description": "No such job"}},
    summary="Get Job Status",
)
async def get_job(id: JobId, request: Request, _p: Principal = Depends(require(Role.viewer))) -> dict:
    return job_json(await _job(request, id))


@router.patch(
    "/job/{id}",
    response_model=JobOut,
    responses={404: {"description": "No such job"}},
    summary="Patch Job Status (metadata, resource_name)",
)
async def patch_job(
    id: JobId,
    body: JobPatch,
    request: Request,
    _p: Principal = Depends(require(Role.operator)),
) -> dict:
    async with _db(request).session() as s, s.begin():
        row = await s.get(JobRow, id, with_for_update=True)
        if row is None:
            raise NotFound(f"no job {id}")
        if body.metadata is not None:
            row.metadata_ = body.metadata if isinstance(body.metadata, str) else json.dumps(body.metadata)
        if body.resource_name is not None:
            row.resource_name = body.resource_name
    return job_json(row)


@router.post(
    "/job/{id}/cancel",
    response_model=JobView,
    responses={
        404: {"description": "No such job"},
        409: {"description": "The job has already ended (failed or completed); `message` says how"},
    },
    summary="Cancel a running provision job (idempotent)",
)
async def cancel(id: JobId, request: Request, _p: Principal = Depends(require(Role.operator))) -> JobView:
    # The provisioner cancels its job; a job only the gateway knows is answered from the read
    # model: 409 naming its end if it has ended (e.g. its command was dead-lettered), else it
    # never reached a provisioner and is cancelled here (the BMC is free again).
    rt = request.app.state.runtime
    try:
        return await rt.bus.request(
            rt.bus.subjects.request("provision", "cancel"), CancelJob(job_id=id), reply=JobView
        )
    except NotFound:
        row = await _job(request, id)  # 404 only when the gateway never had the job either
    if row.job_status in TERMINAL_STATES:
        raise Conflict(
            f"job {id} already {row.job_status}: {row.message}",
            details={"job_id": id, "job_status": row.job_status},
        )
    ev = await end_job(
        rt.bus, row, "cancelled by operator (the job never reached a provisioner)", "cancelled"
    )
    return JobView(job_id=id, bmc_ip=row.bmc_ip, state=ev.state, status=ev.status, message=ev.message)


# Installer callbacks (job token, no operator auth). No existence oracle: an unknown job or BMC
# answers exactly like a wrong token (401); 404/409 only reach a caller holding a valid token.
_CALLBACK = {
    401: {
        "model": ErrorResponse,
        "description": "Missing or wrong job token, or no such job/BMC (same answer)",
    },
    404: {"model": ErrorResponse, "description": "Never for an unknown job or BMC (those answer 401)"},
    409: {
        "model": ErrorResponse,
        "description": "The job's state does not accept this callback with its token (ended, superseded, "
        "already completed, not finished installing, first-boot window closed), or the first boot "
        "would move a registered node to another address; `message` says which",
    },
    422: {"model": ErrorResponse, "description": "Invalid field (named in `field`)"},
    503: {"model": ErrorResponse, "description": "Provisioner unavailable"},
}


def installer_token(
    x_karios_job_token: str | None = Header(None, description="The job token baked into the boot medium"),
    token: str | None = Query(None, description="The job token (for installers that cannot set headers)"),
) -> str:
    """Installer callbacks authenticate with their job's token, not an operator token: its SHA-256
    (what the provisioner compares and the bus may carry), "" when none was given."""
    return job_token_hash(x_karios_job_token or token or "")


# A failure report the gateway cannot parse (not JSON, a broken escape, a field breaking its rule)
# still fails its job — with the installer's raw words, one printable line, bounded, as the reason
# — instead of a 422 that leaves the job installing until its stage deadline. Only a body that
# says `"state": "failed"` is taken so; any other unreadable body stays a 422. The job token is
# checked by the provisioner as for every step.
_SAYS_FAILED = re.compile(rb'"state"\s*:\s*"failed"')
_STEP_KEY = re.compile(rb'"step"\s*:\s*"([A-Za-z0-9:_./-]{1,200})"')
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
RAW_REPORT_MAX = 900  # characters of the raw body kept in the job's message


def raw_report_text(raw: bytes) -> str:
    """An unreadable report as one printable line: bytes that are not UTF-8 become U+FFFD, runs of
    control characters a space; at most :data:`RAW_REPORT_MAX` characters."""
    text = raw[: RAW_REPORT_MAX * 4].decode("utf-8", errors="replace")
    text = " ".join(_CONTROL.sub(" ", text).split())
    return text if len(text) <= RAW_REPORT_MAX else text[: RAW_REPORT_MAX - 1] + "…"


class _StepRoute(APIRoute):
    """``/job/{id}/step`` with the rule above for an unreadable failure report."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                raw = await request.body()
                only_body = all(e.get("loc", ("",))[0] == "body" for e in exc.errors())
                if not (only_body and _SAYS_FAILED.search(raw)):
                    raise
                return JSONResponse(jsonable_encoder(await _unreadable_failure(request, raw, exc)))

        return route


async def _unreadable_failure(request: Request, raw: bytes, exc: RequestValidationError) -> JobView:
    rt = request.app.state.runtime
    key = _STEP_KEY.search(raw)
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ())[1:])
    why = f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "invalid"))
    token = request.headers.get("X-Karios-Job-Token") or request.query_params.get("token") or ""
    req = CallbackRequestV2(
        job_id=request.path_params["id"],
        token_sha256=job_token_hash(token),
        step=key.group(1).decode() if key else "report",
        state="failed",
        message=bound_message(f"unreadable failure report ({why}): {raw_report_text(raw)}"),
    )
    return await rt.bus.request(rt.bus.subjects.request("provision", "step"), req, reply=JobView)


async def step(
    id: JobId,
    body: StepBody,
    request: Request,
    job_token: str = Depends(installer_token),
) -> JobView:
    rt = request.app.state.runtime
    req = CallbackRequestV2(
        job_id=id,
        token_sha256=job_token,
        step=body.step,
        state=body.state,
        percent=body.percent,
        message=bound_message(body.message),
        log=bound_log(body.log),
    )
    return await rt.bus.request(rt.bus.subjects.request("provision", "step"), req, reply=JobView)


router.add_api_route(
    "/job/{id}/step",
    step,
    methods=["POST"],
    route_class_override=_StepRoute,
    response_model=JobView,
    responses=_CALLBACK,
    summary="Installer step report (job token, no operator auth)",
    description="A step naming a stage of the job's install method gets its label and percentage; "
    '`state: "failed"` fails the job at once with "<stage label>: <message>" and keeps `log` as the '
    "job's `log_tail`.",
)


@router.post(
    "/job/{id}/complete",
    response_model=JobView,
    responses=_CALLBACK,
    summary="Installer reports the OS installed (job token)",
)
async def complete(
    id: JobId,
    body: CompleteBody,
    request: Request,
    job_token: str = Depends(installer_token),
) -> dict:
    rt = request.app.state.runtime
    box: SecretBox = request.app.state.secret_box
    req = CallbackRequestV2(
        job_id=id,
        token_sha256=job_token,
        os_ip=body.os_ip,
        os_password_enc=box.encrypt(body.os_password, context=f"os-job:{id}") if body.os_password else None,
        message=bound_message(body.message),
        log=bound_log(body.log),
    )
    return await rt.bus.request(rt.bus.subjects.request("provision", "complete"), req, reply=JobView)


@router.post(
    "/firstboot",
    response_model=JobView,
    responses=_CALLBACK,
    summary="Installed OS reports its IP on first boot (job token); registers it as a compute node",
)
async def firstboot(
    body: FirstbootBody,
    request: Request,
    job_token: str = Depends(installer_token),
) -> dict:
    rt = request.app.state.runtime
    req = CallbackRequestV2(token_sha256=job_token, bmc_ip=str(body.bmc_ip), os_ip=str(body.os_ip))
    return await rt.bus.request(rt.bus.subjects.request("provision", "firstboot"), req, reply=JobView)


#: What cloud-init's phone_home posts (form fields) that the job's record keeps: bounded, printable.
_PHONE_HOME_FIELDS = ("instance_id", "hostname", "fqdn")
_PHONE_HOME_MAX = 64 * 1024


@router.post(
    "/job/{id}/phone-home",
    response_model=JobView,
    responses=_CALLBACK,
    summary="cloud-init's phone_home from an installed catalog image (job token in ?token=)",
    description="The first-boot report of a whole-disk catalog image: cloud-init posts its form "
    "(`instance_id`, `hostname`, `fqdn`, `pub_key_*`) once it has configured the system; the job "
    "completes as with `/firstboot`, at the address the installer reported at `/complete`. The "
    "body's fields are only recorded in the job's message; an unreadable body is still a first boot.",
)
async def phone_home(id: JobId, request: Request, job_token: str = Depends(installer_token)) -> dict:
    rt = request.app.state.runtime
    raw = await request.body()
    form = parse_qs(raw[:_PHONE_HOME_MAX].decode("utf-8", "replace"), max_num_fields=32)
    said = ", ".join(
        f"{k}={raw_report_text(form[k][0].encode())[:80]}" for k in _PHONE_HOME_FIELDS if form.get(k)
    )
    req = CallbackRequestV2(
        job_id=id,
        token_sha256=job_token,
        message=bound_message(f"cloud-init phone_home ({said})" if said else "cloud-init phone_home"),
    )
    return await rt.bus.request(rt.bus.subjects.request("provision", "firstboot"), req, reply=JobView)
