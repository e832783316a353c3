"""Use cases "installer reports": a step, completion, first boot. All carry the job token.

A step naming a stage of the job's install method gets that stage's label and percentage; a
step in state ``failed`` fails the job at once with "<stage label>: <installer message>" and the
installer's last log lines.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from karios.common.contracts.inventory import RegisterNode
from karios.common.contracts.provision import CallbackRequest, JobView
from karios.common.errors import Conflict, KariosError, NotFound, Unauthorized
from karios.common.provisioning import bound_log, bound_message
from karios.common.telemetry import get_logger
from karios.provisioner.install import INSTALL_STAGES, WIPE_STAGES, Stage, stage_of
from karios.provisioner.models import Job
from karios.provisioner.statemachine import INFO, State, is_terminal

if TYPE_CHECKING:
    from karios.provisioner.jobs import JobService

log = get_logger(__name__)


def verify(job: Job, token: str, token_hash: str) -> None:
    if not token or not hmac.compare_digest(token_hash, job.token_hash):
        raise Unauthorized("invalid job token")
    if is_terminal(job.state):
        raise Conflict(f"job {job.id} is already {job.state}", details={"state": job.state})


def view(job: Job) -> JobView:
    return JobView(
        job_id=job.id,
        bmc_ip=job.bmc_ip,
        state=job.state,
        status=INFO[State(job.state)].status,
        message=job.message,
        log_tail=list(job.log_tail or []),
    )


def stages_of(svc: JobService, job: Job) -> tuple[Stage, ...]:
    method = svc.methods.get(job.method)
    if method is not None:
        return method.stages
    return WIPE_STAGES if job.job_type == "unprovision" else INSTALL_STAGES


async def _current(svc: JobService, req: CallbackRequest) -> Job:
    job = await svc.load(req.job_id)
    verify(job, req.token, svc.token_hash(req.token))
    newer = await svc.repo.newer_than(job)
    if newer is not None:
        raise Conflict(f"job {job.id} was superseded by job {newer} for BMC {job.bmc_ip}")
    return job


async def step(svc: JobService, req: CallbackRequest) -> JobView:
    job = await _current(svc, req)
    stage = stage_of(stages_of(svc, job), req.step)
    label = stage.label if stage else req.step
    said = bound_message(req.message)
    extra = {"log_tail": bound_log(req.log)} if req.log else {}
    if req.state == "failed":
        text = f"{label}: {said or f'installer step {req.step} failed'}"
        job = await svc.move(job.id, State.failed, text, **extra)
        return view(job)
    percent = req.percent if req.percent is not None else (stage.percent if stage else None)
    percent = max(50, min(89, percent)) if percent is not None else None
    target = State.first_boot if job.state == State.first_boot else State.installing
    if job.state == State.stuck and job.os_ip:
        target = State.first_boot
    text = f"{label}: {said or req.state}"
    job = await svc.move(job.id, target, text, percent=percent, fact="job.step", **extra)
    return view(job)


async def complete(svc: JobService, req: CallbackRequest) -> JobView:
    job = await _current(svc, req)
    enc = req.os_password_enc
    extra = {"log_tail": bound_log(req.log)} if req.log else {}
    if job.state == State.booting:
        await svc.move(job.id, State.installing, "installer reported completion")
    job = await svc.move(
        job.id,
        State.first_boot,
        "OS installed; waiting for first boot",
        os_ip=req.os_ip or job.os_ip,
        **({"os_password_enc": enc} if enc else {}),
        **extra,
    )
    if job.job_type == "unprovision":
        job = await svc.move(job.id, State.completed, bound_message(req.message) or "disks wiped")
    return view(job)


async def firstboot(svc: JobService, req: CallbackRequest) -> JobView:
    job_id = await svc.repo.latest_for_bmc(req.bmc_ip)
    if job_id is None:
        raise NotFound(f"no job for BMC {req.bmc_ip}")
    job = await svc.load(job_id)
    if req.token and not hmac.compare_digest(svc.token_hash(req.token), job.token_hash):
        old = await svc.repo.with_token(req.bmc_ip, svc.token_hash(req.token))
        if old is not None:
            raise Conflict(f"job {old} was superseded by a newer job for BMC {req.bmc_ip}")
    verify(job, req.token, svc.token_hash(req.token))
    if job.state in (State.booting, State.installing):
        raise Conflict(f"job {job.id} has not finished installing")
    job = await svc.move(job.id, State.completed, f"first boot from {req.os_ip}", os_ip=req.os_ip)
    try:
        await svc.bus.request(
            svc.bus.subjects.request("inventory", "register_node"),
            RegisterNode(
                bmc_ip=job.bmc_ip,
                os_ip=req.os_ip or None,
                os_hostname=job.hostname or None,
                vendor=job.vendor or None,
                is_control_node=False,
            ),
        )
    except KariosError as exc:
        log.warning("could not record the OS IP in the registry", job_id=job.id, error=exc.message)
    return view(job)
