"""Provisioning endpoints of the seed: provision/unprovision, jobs, progress, installer callbacks.

Provision answers 202 with the job id at once (the provisioner does the work from a command).
Installer callbacks carry the per-job token the boot medium embeds (``X-Karios-Job-Token`` header
or ``?token=``), never an operator token.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import select

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.readmodel import JobRow, ProvisionProgress, job_json, progress_json
from karios.common.contracts.provision import (
    CallbackRequest,
    CancelJob,
    ProvisionSpec,
    QueueQuery,
    StartProvision,
    check_debian_version,
    check_pool,
)
from karios.common.crypto import SecretBox
from karios.common.errors import Conflict, NotFound, ValidationFailed
from karios.common.netaddr import IPStr

router = APIRouter(prefix="/controlnode", tags=["provisioning"])
VENDORS = ("cisco", "dell", "hp", "lenovo", "supermicro")
ACTIVE = ("queued", "building_media", "mounting", "booting", "installing", "first_boot", "stuck")


class ProvisionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    bmc_IP: IPStr = Field(description="BMC IP address (required); one running job per BMC")
    vendor: str = Field(description="cisco | dell | hp | lenovo | supermicro | generic (required)")
    hostname: str = Field("", description="OS hostname written into the preseed")
    debian_version: str = Field("12", description="12/bookworm or 13/trixie: which installer boots")
    arch: str = Field("amd64", description="Only amd64 media are built")
    os_username: str = Field("debian", description="OS user created by the installer")
    os_password: str | None = Field(
        None, description="OS password (default adminadmin); hashed in the preseed"
    )
    root_pass: str | None = Field(None, description="Root password; root login disabled when unset")
    selected_disks: list[str] = Field(default_factory=list, description="Install disks")
    pool_type: str = Field("single", description="single|stripe|mirror|raidz1|raidz2 → md RAID -/0/1/5/6")
    selected_nic: str = Field("", description="Installer interface (default: auto)")
    selected_nic_legacy: str = Field("", description="Legacy NIC name (kept in metadata)")
    selected_nic_mac: str = Field("", description="MAC of the selected NIC")
    mac_address: str = Field("", description="Kept in metadata")
    prefix_id: int | None = Field(None, description="Static address from the inventory's pool when set")
    network_role: str = Field("", description="Kept in metadata")
    gpu_passthrough: Any = Field(None, description="true, [vendor:device ids] or {device_ids, iommu}")
    controlnode_host: str = Field("", description="Callback host the installer uses (default: public URL)")
    controlnode_port: str = Field("", description="Callback port")
    device_id: int | None = Field(None, description="NetBox device id (kept in metadata)")
    branch: str = ""
    cache_dir: str = ""
    kubernetes_cluster_name: str = ""
    kubernetes_cluster_type: str = ""
    location: str = ""
    output_iso: str = ""
    pxe_path: str = ""
    pxe_server: str = ""
    rack_number: str = ""
    sys_iuri: str = ""
    vm_slot: str = ""
    zone: str = ""
    parent_id: str = Field("", description="Batch job id: jobs started by one UI action share it")


_NO_EFFECT = (
    "branch",
    "cache_dir",
    "kubernetes_cluster_name",
    "kubernetes_cluster_type",
    "location",
    "output_iso",
    "pxe_path",
    "pxe_server",
    "rack_number",
    "sys_iuri",
    "vm_slot",
    "zone",
    "selected_nic_legacy",
    "mac_address",
    "network_role",
    "device_id",
    "prefix_id",
)


class Accepted(BaseModel):
    job_id: str
    message: str
    status: str = "queued"
    success: bool = True


class BmcIpBody(BaseModel):
    bmc_ip: IPStr


class StepBody(BaseModel):
    step: str = Field(min_length=1, max_length=200)
    state: Literal["active", "done", "failed"]
    percent: int | None = Field(None, ge=0, le=100)


class CompleteBody(BaseModel):
    os_ip: str = ""
    os_password: str | None = None


class FirstbootBody(BaseModel):
    bmc_ip: IPStr
    os_ip: IPStr


class UnprovisionBody(BaseModel):
    bmc_ip: IPStr
    bmc_user: str | None = None
    bmc_pass: str | None = None
    vendor: str = "generic"


class JobPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: str | dict[str, Any] | None = None
    resource_name: str | None = None


def _db(request: Request):  # type: ignore[no-untyped-def]
    return request.app.state.runtime.db


async def _refuse_running(request: Request, bmc_ip: str) -> None:
    async with _db(request).session() as s:
        row = (
            await s.exec(select(JobRow).where(JobRow.bmc_ip == bmc_ip, JobRow.job_status.in_(ACTIVE)))
        ).first()
    if row is not None:
        raise Conflict(
            f"BMC {bmc_ip} already has running job {row.id}; cancel it first", details={"job_id": row.id}
        )


async def _accept(request: Request, cmd: StartProvision, metadata: dict[str, Any]) -> JSONResponse:
    rt = request.app.state.runtime
    await _refuse_running(request, cmd.spec.bmc_ip)
    async with _db(request).session() as s, s.begin():
        s.add(
            JobRow(
                id=cmd.job_id,
                job_type=cmd.job_type,
                bmc_ip=cmd.spec.bmc_ip,
                parent_id=cmd.parent_id,
                resource_name=cmd.spec.hostname,
                metadata_=json.dumps(metadata, default=str),
                message="Queued",
            )
        )
        if cmd.parent_id:
            parent = await s.get(JobRow, cmd.parent_id, with_for_update=True)
            if parent is None:
                s.add(
                    JobRow(
                        id=cmd.parent_id, job_type=f"{cmd.job_type}_batch", total_jobs=1, job_status="running"
                    )
                )
            else:
                parent.total_jobs += 1
    await rt.bus.send_command(
        cmd, rt.bus.subjects.cmd("provision", "start"), entity=cmd.job_id, msg_id=cmd.job_id
    )
    body = Accepted(job_id=cmd.job_id, message=f"{cmd.job_type} of {cmd.spec.bmc_ip} queued")
    return JSONResponse(body.model_dump(), status_code=202)


async def _provision(body: ProvisionRequest, request: Request, vendor: str) -> JSONResponse:
    box: SecretBox = request.app.state.secret_box
    ip = str(body.bmc_IP)
    check_pool(body.pool_type, body.selected_disks)
    check_debian_version(body.debian_version)
    if body.arch != "amd64":
        raise ValidationFailed("arch: only amd64 media are built", field="arch")
    metadata = {k: getattr(body, k) for k in _NO_EFFECT if getattr(body, k) not in ("", None)}
    spec = ProvisionSpec(
        **body.model_dump(
            exclude={"bmc_IP", "vendor", "os_password", "root_pass", "parent_id", *_NO_EFFECT[:12]}
        ),
        bmc_ip=ip,
        vendor=vendor,
        os_password_enc=box.encrypt(body.os_password, context=f"os:{ip}") if body.os_password else None,
        root_pass_enc=box.encrypt(body.root_pass, context=f"os:{ip}") if body.root_pass else None,
        metadata=metadata,
    )
    cmd = StartProvision(job_id=str(uuid.uuid4()), spec=spec, parent_id=body.parent_id)
    return await _accept(request, cmd, metadata)


_ACCEPTED = {
    202: {"description": "Job queued", "model": Accepted},
    409: {"description": "BMC has a running job"},
    422: {"description": "Invalid field (named in `field`)"},
}


@router.post(
    "/provision",
    status_code=202,
    response_model=Accepted,
    responses=_ACCEPTED,
    summary="Provision a node with Debian OS",
)
async def provision(
    body: ProvisionRequest, request: Request, _p: Principal = Depends(require(Role.operator))
) -> JSONResponse:
    return await _provision(body, request, body.vendor)


def _vendor_route(vendor: str) -> None:
    async def provision_vendor(
        body: ProvisionRequest, request: Request, _p: Principal = Depends(require(Role.operator))
    ) -> JSONResponse:
        return await _provision(body, request, vendor)

    router.post(
        f"/provision/{vendor}",
        status_code=202,
        response_model=Accepted,
        responses=_ACCEPTED,
        summary=f"Provision a {vendor} node with Debian OS",
        name=f"provision_{vendor}",
    )(provision_vendor)


for _v in VENDORS:
    _vendor_route(_v)


@router.post("/provision/progress", summary="Latest provision progress for a BMC IP")
async def progress(body: BmcIpBody, request: Request, _p: Principal = Depends(require(Role.viewer))) -> dict:
    async with _db(request).session() as s:
        row = (
            await s.exec(
                select(ProvisionProgress)
                .where(ProvisionProgress.bmc_ip == str(body.bmc_ip))
                .order_by(ProvisionProgress.id.desc())
            )
        ).first()
    if row is None:
        raise NotFound(f"no provision progress for {body.bmc_ip}")
    return progress_json(row)


@router.post("/provision/progress/all", summary="All provision progress records for a BMC IP")
async def progress_all(
    body: BmcIpBody, request: Request, _p: Principal = Depends(require(Role.viewer))
) -> list[dict]:
    async with _db(request).session() as s:
        rows = (
            await s.exec(
                select(ProvisionProgress)
                .where(ProvisionProgress.bmc_ip == str(body.bmc_ip))
                .order_by(ProvisionProgress.id)
            )
        ).all()
    return [progress_json(r) for r in rows]


@router.get("/provision/queue", summary="Provision queue status (pending and active entries)")
async def queue(request: Request, _p: Principal = Depends(require(Role.viewer))) -> dict:
    rt = request.app.state.runtime
    entries = await rt.bus.request(rt.bus.subjects.query("provision", "queue"), QueueQuery())
    return {
        "entries": entries,
        "queued": sum(1 for e in entries if e["position"]),
        "active": sum(1 for e in entries if not e["position"]),
    }


async def _job(request: Request, job_id: str) -> JobRow:
    async with _db(request).session() as s:
        row = await s.get(JobRow, job_id)
    if row is None:
        raise NotFound(f"no job {job_id}")
    return row


@router.get("/job/{id}", summary="Get Job Status")
async def get_job(id: str, request: Request, _p: Principal = Depends(require(Role.viewer))) -> dict:
    return job_json(await _job(request, id))


@router.patch("/job/{id}", summary="Patch Job Status (metadata, resource_name)")
async def patch_job(
    id: str,
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


@router.post("/job/{id}/cancel", summary="Cancel a running provision job (idempotent)")
async def cancel(id: str, request: Request, _p: Principal = Depends(require(Role.operator))) -> dict:
    rt = request.app.state.runtime
    return await rt.bus.request(rt.bus.subjects.request("provision", "cancel"), CancelJob(job_id=id))


def installer_token(
    x_karios_job_token: str | None = Header(None, description="The job token baked into the boot medium"),
    token: str | None = Query(None, description="The job token (for installers that cannot set headers)"),
) -> str:
    """Installer callbacks authenticate with their job's token, not an operator token."""
    return x_karios_job_token or token or ""


@router.post("/job/{id}/step", summary="Installer step report (job token, no operator auth)")
async def step(
    id: str,
    body: StepBody,
    request: Request,
    job_token: str = Depends(installer_token),
) -> dict:
    rt = request.app.state.runtime
    req = CallbackRequest(
        job_id=id,
        token=job_token,
        step=body.step,
        state=body.state,
        percent=body.percent,
    )
    return await rt.bus.request(rt.bus.subjects.request("provision", "step"), req)


@router.post("/job/{id}/complete", summary="Installer reports the OS installed (job token)")
async def complete(
    id: str,
    body: CompleteBody,
    request: Request,
    job_token: str = Depends(installer_token),
) -> dict:
    rt = request.app.state.runtime
    box: SecretBox = request.app.state.secret_box
    req = CallbackRequest(
        job_id=id,
        token=job_token,
        os_ip=body.os_ip,
        os_password_enc=box.encrypt(body.os_password, context=f"os-job:{id}") if body.os_password else None,
    )
    return await rt.bus.request(rt.bus.subjects.request("provision", "complete"), req)


@router.post("/firstboot", summary="Installed OS reports its IP on first boot (job token)")
async def firstboot(
    body: FirstbootBody,
    request: Request,
    job_token: str = Depends(installer_token),
) -> dict:
    rt = request.app.state.runtime
    req = CallbackRequest(token=job_token, bmc_ip=str(body.bmc_ip), os_ip=str(body.os_ip))
    return await rt.bus.request(rt.bus.subjects.request("provision", "firstboot"), req)


@router.post(
    "/unprovision",
    status_code=202,
    response_model=Accepted,
    responses=_ACCEPTED,
    summary="Unprovision a node (wipe medium)",
)
async def unprovision(
    body: UnprovisionBody, request: Request, _p: Principal = Depends(require(Role.operator))
) -> JSONResponse:
    box: SecretBox = request.app.state.secret_box
    ip = str(body.bmc_ip)
    spec = ProvisionSpec(bmc_ip=ip, vendor=body.vendor, hostname="wipe")
    cmd = StartProvision(
        job_id=str(uuid.uuid4()),
        job_type="unprovision",
        spec=spec,
        bmc_username=body.bmc_user,
        bmc_password_enc=box.encrypt(body.bmc_pass, context=f"bmc:{ip}") if body.bmc_pass else None,
    )
    return await _accept(request, cmd, {})
