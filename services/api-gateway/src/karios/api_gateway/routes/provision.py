"""Provisioning endpoints of the seed: provision/unprovision, jobs, progress, installer callbacks.

Provision answers 202 with the job id at once (the provisioner does the work from a command).
Installer callbacks carry the per-job token the boot medium embeds (``X-Karios-Job-Token`` header
or ``?token=``), never an operator token.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import JSONResponse
from sqlmodel import select

from karios.api_gateway.auth import Principal, Role, require
from karios.api_gateway.models import (
    NO_EFFECT,
    Accepted,
    BmcIpBody,
    ProvisionRequest,
    UnprovisionBody,
)
from karios.api_gateway.outbox import CommandOutbox
from karios.api_gateway.readcache import QUEUE_KEY, read_cache
from karios.api_gateway.readmodel import (
    JobRow,
    ProgressOut,
    ProvisionProgress,
    progress_json,
)
from karios.common.bus.runtime import Bus
from karios.common.cache import SingleFlightCache
from karios.common.contracts.hardware import (
    HardwareContradiction,
    HardwareQuery,
    HardwareRecord,
    contradiction,
)
from karios.common.contracts.images import CatalogImageQuery, ImageView
from karios.common.contracts.inventory import BmcHardware, BmcHardwareQuery
from karios.common.contracts.provision import (
    QUEUE_PAGE,
    AdmissionQuery,
    ImageInfo,
    ImageQuery,
    ProvisionSpec,
    QueueQuery,
    StartProvision,
    check_debian_version,
)
from karios.common.crypto import SecretBox
from karios.common.errors import NotFound, ServiceUnavailable
from karios.common.limits import Ident
from karios.common.provisioning import (
    TERMINAL_STATES,
    check_catalog_image,
    check_disk_space,
    check_disks_known,
    gpu_kernel_args,
    refuse_second_job,
    resolve_pool_backend,
    validate_provision,
    validate_unprovision,
)
from karios.common.telemetry import get_logger

router = APIRouter(prefix="/controlnode", tags=["provisioning"])
#: A job id in a path: as long as the ``jobs.id`` column (a longer one is a 422, never a lookup).
JobId = Annotated[Ident, Path(description="The job id (as returned by provision)")]
VENDOR_ROUTES = ("cisco", "dell", "hp", "lenovo", "supermicro")  # POST /controlnode/provision/<vendor>
# Fields kept in the job's metadata: those with no effect, and prefix_id (as before).
_IN_METADATA = tuple(n for n, f in ProvisionRequest.model_fields.items() if f.description == NO_EFFECT)
_METADATA_ALSO = ("prefix_id",)
_SPEC_FIELDS = set(ProvisionSpec.model_fields)
#: How long a provision waits for the provisioner to say how big its image is (the disk-size
#: check); no answer in time, or no provisioner: nothing is checked, the provision is accepted.
IMAGE_QUERY_TIMEOUT = 5.0
log = get_logger(__name__)


def _db(request: Request):  # type: ignore[no-untyped-def]
    return request.app.state.runtime.db


async def _refuse_running(request: Request, bmc_ip: str) -> None:
    async with _db(request).session() as s:
        row = (
            await s.exec(
                select(JobRow).where(JobRow.bmc_ip == bmc_ip, JobRow.job_status.notin_(TERMINAL_STATES))
            )
        ).first()
    refuse_second_job(bmc_ip, row.id if row is not None else None)


async def _known_bmc(request: Request, spec: ProvisionSpec, field: str) -> None:
    """404 naming ``field`` when the inventory has no device with this BMC; 422 naming
    ``selected_disks`` when it lists the device's disks and a selected one is not among them
    (both before any work)."""
    rt = request.app.state.runtime
    try:
        hw = await rt.bus.request(
            rt.bus.subjects.query("inventory", "bmc_hardware"),
            BmcHardwareQuery(bmc_ip=spec.bmc_ip),
            reply=BmcHardware,
        )
    except NotFound:
        raise NotFound(
            f"{field}: no device with BMC IP {spec.bmc_ip} in the inventory", field=field
        ) from None
    check_disks_known(spec.selected_disks, [d.name for d in hw.disks])
    if spec.image:
        await _check_catalog_image(request, spec, hw)
    else:
        await _check_disk_space(request, spec, hw)
    await _check_hardware_record(request, spec, hw)


def _gpu_ids(gpu: Any) -> list[str]:
    """The ``vendor:device`` ids a ``gpu_passthrough`` value names (validated before)."""
    if isinstance(gpu, list):
        return [str(i).lower() for i in gpu]
    if isinstance(gpu, dict):
        return [str(i).lower() for i in (gpu.get("device_ids") or gpu.get("ids") or [])]
    return []


async def _check_hardware_record(request: Request, spec: ProvisionSpec, hw: BmcHardware) -> None:
    """409 naming ``selected_disks`` / ``selected_nic_mac`` / ``gpu_passthrough`` when the BMC's
    stored hardware record (an inspection) contradicts them (``contracts.hardware.contradiction``).
    No record, or no provisioner answer in time: nothing is checked, the provision is accepted."""
    gpu = bool(gpu_kernel_args(spec.gpu_passthrough))
    if not (spec.selected_disks or spec.selected_nic_mac or gpu):
        return
    rt = request.app.state.runtime
    try:
        rec = await rt.bus.request(
            rt.bus.subjects.query("provision", "hardware"),
            HardwareQuery(bmc_ip=spec.bmc_ip),
            reply=HardwareRecord,
            timeout=IMAGE_QUERY_TIMEOUT,
        )
    except NotFound:  # HARDWARE_NOT_INSPECTED: never inspected, nothing to contradict
        return
    except ServiceUnavailable as exc:
        log.info("hardware record not checked: no answer", bmc_ip=spec.bmc_ip, error=str(exc))
        return
    found = contradiction(
        rec,
        selected_disks=spec.selected_disks,
        disk_serials={d.name.removeprefix("/dev/"): d.serial for d in hw.disks if d.serial},
        selected_nic_mac=spec.selected_nic_mac,
        gpu_passthrough=gpu,
        gpu_ids=_gpu_ids(spec.gpu_passthrough),
    )
    if found is not None:
        field, why = found
        raise HardwareContradiction(f"{field}: {why}", field=field)


async def _check_catalog_image(request: Request, spec: ProvisionSpec, hw: BmcHardware) -> None:
    """422 naming ``image`` / ``pool_type`` / ``selected_disks`` when the catalog image named by
    the request is unknown, not ready, or cannot go onto the selected disk
    (``karios.common.provisioning.check_catalog_image``). No provisioner answer in time: accepted
    (the job then fails at its start saying why, if it must)."""
    rt = request.app.state.runtime
    try:
        view: ImageView | None = await rt.bus.request(
            rt.bus.subjects.query("provision", "catalog_image"),
            CatalogImageQuery(name=spec.image),
            reply=ImageView,
            timeout=IMAGE_QUERY_TIMEOUT,
        )
    except NotFound:
        view = None
    except ServiceUnavailable as exc:
        log.info("catalog image not checked: no answer", image=spec.image, error=str(exc))
        return
    sizes = {d.name.removeprefix("/dev/"): round(d.size_gb * 1e9) if d.size_gb else None for d in hw.disks}
    check_catalog_image(spec, view, sizes)


async def _check_disk_space(request: Request, spec: ProvisionSpec, hw: BmcHardware) -> None:
    """422 naming ``selected_disks`` with the needed and available sizes when the inventory knows
    every selected disk's size and the provisioner its image's, and the image does not fit the
    pool (``karios.common.provisioning.check_disk_space``); any size unknown: accepted."""
    sizes = {d.name.removeprefix("/dev/"): round(d.size_gb * 1e9) if d.size_gb else None for d in hw.disks}
    selected = [d.removeprefix("/dev/") for d in spec.selected_disks]
    if not selected or any(sizes.get(d) is None for d in selected):
        return
    rt = request.app.state.runtime
    query = ImageQuery(suite=check_debian_version(spec.debian_version), install_method=spec.install_method)

    async def load() -> ImageInfo:
        return await rt.bus.request(
            rt.bus.subjects.query("provision", "image"), query, reply=ImageInfo, timeout=IMAGE_QUERY_TIMEOUT
        )

    # An image's size changes only with a rebuild: one bus query per image and minute, not per POST.
    sizes_cache = getattr(request.app.state, "image_sizes", None)
    if sizes_cache is None:
        sizes_cache = SingleFlightCache[ImageInfo](ttl=60.0)
        request.app.state.image_sizes = sizes_cache
    try:
        info = (await sizes_cache.get_or_load(f"{query.suite}/{query.install_method}", load)).value
    except ServiceUnavailable as exc:
        log.info("disk size not checked: the image's size is unknown", bmc_ip=spec.bmc_ip, error=str(exc))
        return
    assert info is not None  # the loader answers or raises
    # zfs of a request leaving the method to a preseed deployment: 422 here (else at the job's start).
    backend = resolve_pool_backend(spec.pool_backend, spec.pool_type, info.method)
    check_disk_space(spec.pool_type, selected, sizes, info.installed_bytes, backend)


async def _accept(
    request: Request, cmd: StartProvision, metadata: dict[str, Any], field: str
) -> JSONResponse:
    rt = request.app.state.runtime
    await _refuse_running(request, cmd.spec.bmc_ip)
    await _known_bmc(request, cmd.spec, field)
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
        if cmd.parent_id:  # the batch's first POSTs race to create its row: one at a time
            await s.exec(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(cmd.parent_id))))
            parent = await s.get(JobRow, cmd.parent_id, with_for_update=True)
            if parent is None:
                s.add(
                    JobRow(
                        id=cmd.parent_id, job_type=f"{cmd.job_type}_batch", total_jobs=1, job_status="running"
                    )
                )
            else:
                parent.total_jobs += 1
        # The command commits with the job row (the transactional outbox); the relay publishes
        # it right after the commit, or when the bus is back. 202 means "committed".
        outbox: CommandOutbox = request.app.state.outbox
        subject = rt.bus.subjects.cmd("provision", "start")
        await outbox.add(s, cmd, subject, entity=cmd.job_id, msg_id=cmd.job_id)
    if (hook := request.app.state.after_outbox_commit) is not None:
        hook()  # chaos tests only: the process dies here, between commit and relay
    body = Accepted(job_id=cmd.job_id, message=f"{cmd.job_type} of {cmd.spec.bmc_ip} queued")
    return JSONResponse(body.model_dump(), status_code=202)


async def _provision(body: ProvisionRequest, request: Request, vendor: str) -> JSONResponse:
    """Validate (422 naming the field), then 409/404 checks, then the job is recorded and queued."""
    box: SecretBox = request.app.state.secret_box
    ip = str(body.bmc_IP)
    metadata = {
        k: getattr(body, k) for k in (*_IN_METADATA, *_METADATA_ALSO) if getattr(body, k) not in ("", None)
    }
    spec = validate_provision(
        ProvisionSpec(
            **body.model_dump(include=_SPEC_FIELDS - {"bmc_ip", "vendor", "metadata"}),
            bmc_ip=ip,
            vendor=vendor,
            metadata=metadata,
        )
    )
    spec.os_password_enc = box.encrypt(body.os_password, context=f"os:{ip}") if body.os_password else None
    spec.root_pass_enc = box.encrypt(body.root_pass, context=f"os:{ip}") if body.root_pass else None
    cmd = StartProvision(job_id=str(uuid.uuid4()), spec=spec, parent_id=body.parent_id)
    return await _accept(request, cmd, metadata, "bmc_IP")


_ACCEPTED = {
    202: {"description": "Job queued", "model": Accepted},
    404: {"description": "No device with this BMC IP in the inventory (`field` names it)"},
    409: {
        "description": "BMC has a running job, or the request contradicts the BMC's hardware record "
        "(HARDWARE_CONTRADICTION; `field`: selected_disks | selected_nic_mac | gpu_passthrough)"
    },
    422: {"description": "Invalid field (named in `field`)"},
    503: {"description": "Inventory unavailable"},
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


for _v in VENDOR_ROUTES:
    _vendor_route(_v)


@router.post(
    "/provision/progress", response_model=ProgressOut, summary="Latest provision progress for a BMC IP"
)
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


@router.post(
    "/provision/progress/all",
    response_model=list[ProgressOut],
    summary="All provision progress records for a BMC IP",
)
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


@router.get(
    "/provision/queue", response_model=dict, summary="Provision queue status (pending and active entries)"
)
async def queue(request: Request, _p: Principal = Depends(require(Role.viewer))) -> Response:
    # One provisioner round trip serves every reader for up to READ_TTL_S, encoded once
    # (api_gateway.readcache; a write through this gateway drops it at once).
    return await read_cache(request.app).response(
        QUEUE_KEY, lambda: _queue(request.app.state.runtime.bus), request
    )


async def _queue_entries(bus: Bus) -> list[dict]:
    """Every queue entry, in pages of QUEUE_PAGE (one reply is one NATS message: a 10,000-job
    storm's queue, ~2 MB, did not fit in one, and the page answered nothing). A job that moved
    between two pages is listed once."""
    out: list[dict] = []
    seen: set[str] = set()
    offset = 0
    while True:
        page = await bus.request(
            bus.subjects.query("provision", "queue"), QueueQuery(offset=offset, limit=QUEUE_PAGE)
        )
        out += [e for e in page if e.get("job_id") not in seen]
        seen.update(e.get("job_id") for e in page)
        offset += len(page)
        if len(page) < QUEUE_PAGE:
            return out


async def _queue(bus: Bus) -> dict:
    entries, admission = await asyncio.gather(
        _queue_entries(bus),
        bus.request(bus.subjects.query("provision", "admission"), AdmissionQuery()),
    )
    return {
        "entries": entries,
        "queued": sum(1 for e in entries if e["position"]),
        "active": sum(1 for e in entries if not e["position"]),
        "admission": admission,  # limits + jobs doing BMC/media work now (entries say waiting_for)
    }


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
    spec = validate_unprovision(ProvisionSpec(bmc_ip=ip, vendor=body.vendor, hostname="wipe"))
    cmd = StartProvision(
        job_id=str(uuid.uuid4()),
        job_type="unprovision",
        spec=spec,
        bmc_username=body.bmc_user,
        bmc_password_enc=box.encrypt(body.bmc_pass, context=f"bmc:{ip}") if body.bmc_pass else None,
    )
    return await _accept(request, cmd, {}, "bmc_ip")
