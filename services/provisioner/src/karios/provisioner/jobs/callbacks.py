"""Use cases "installer reports": a step, completion, first boot. All carry the job token.

A step naming a stage of the job's install method gets that stage's label and percentage; a
step in state ``failed`` fails the job at once with "<stage label>: <installer message>" and the
installer's last log lines.

No existence oracle: an unknown job or BMC answers exactly like a wrong token (401 "invalid job
token"); 404 and 409 are only ever said to a caller holding a valid token. First boot registers
the node as a compute node of the fabric (credentials as the installer set them); a repeated
first boot of the completed job registers it again (idempotent) and answers the job.
"""

from __future__ import annotations

import hmac

from karios.common.contracts.inventory import RegisterNode
from karios.common.contracts.nodes import ComputeNode, RegisterComputeNode, password_context
from karios.common.contracts.provision import CallbackRequest, JobView
from karios.common.errors import Conflict, KariosError, NotFound, Unauthorized
from karios.common.provisioning import bound_log, bound_message
from karios.common.telemetry import get_logger
from karios.provisioner import metrics
from karios.provisioner.install import INSTALL_STAGES, WIPE_STAGES, Stage, stage_of
from karios.provisioner.jobs.hostctx import DEFAULT_OS_PASSWORD
from karios.provisioner.jobs.ports import CallbackPort
from karios.provisioner.models import Job
from karios.provisioner.statemachine import INFO, State, is_terminal

log = get_logger(__name__)


INVALID_TOKEN = "invalid job token"  # noqa: S105 (a message, not a secret)


def verify(job: Job, token: str, token_hash: str) -> None:
    if not token or not hmac.compare_digest(token_hash, job.token_hash):
        raise Unauthorized(INVALID_TOKEN)
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


def stages_of(svc: CallbackPort, job: Job) -> tuple[Stage, ...]:
    method = svc.methods.get(job.method)
    if method is not None:
        return method.stages
    return WIPE_STAGES if job.job_type == "unprovision" else INSTALL_STAGES


async def _load(svc: CallbackPort, job_id: str) -> Job:
    """The job, or the same 401 a wrong token gets (no oracle of which jobs exist)."""
    try:
        return await svc.load(job_id)
    except NotFound:
        raise Unauthorized(INVALID_TOKEN) from None


async def _current(svc: CallbackPort, req: CallbackRequest) -> Job:
    job = await _load(svc, req.job_id)
    verify(job, req.token, svc.token_hash(req.token))
    newer = await svc.repo.newer_than(job)
    if newer is not None:
        raise Conflict(f"job {job.id} was superseded by job {newer} for BMC {job.bmc_ip}")
    return job


async def step(svc: CallbackPort, req: CallbackRequest) -> JobView:
    job = await _current(svc, req)
    stage = stage_of(stages_of(svc, job), req.step)
    label = stage.label if stage else req.step
    said = bound_message(req.message)
    extra = {"log_tail": bound_log(req.log)} if req.log else {}
    if req.state == "failed":
        text = f"{label}: {said or f'installer step {req.step} failed'}"
        metrics.installer_failed(job.vendor, stage.key if stage else None)
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


async def complete(svc: CallbackPort, req: CallbackRequest) -> JobView:
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


async def firstboot(svc: CallbackPort, req: CallbackRequest) -> JobView:
    job_id = await svc.repo.latest_for_bmc(req.bmc_ip)
    if job_id is None:
        raise Unauthorized(INVALID_TOKEN)  # as for a wrong token: no oracle of known BMCs
    job = await _load(svc, job_id)
    th = svc.token_hash(req.token)
    if not (req.token and hmac.compare_digest(th, job.token_hash)):
        old = await svc.repo.with_token(req.bmc_ip, th) if req.token else None
        if old is not None:
            raise Conflict(f"job {old} was superseded by a newer job for BMC {req.bmc_ip}")
        raise Unauthorized(INVALID_TOKEN)
    if job.state == State.completed:  # a repeated first boot: register again (idempotent)
        await register(svc, job, req.os_ip or job.os_ip)
        return view(job)
    verify(job, req.token, th)
    if job.state in (State.booting, State.installing):
        raise Conflict(f"job {job.id} has not finished installing")
    job = await svc.move(job.id, State.completed, f"first boot from {req.os_ip}", os_ip=req.os_ip)
    await register(svc, job, req.os_ip or job.os_ip)
    return view(job)


def _request(job: Job) -> dict:
    """The provision request's spec as the job stored it (the StartProvision command's dump)."""
    return dict((job.spec or {}).get("spec") or {})


def _os_password(svc: CallbackPort, job: Job) -> str:
    """The password the installer set: reported at completion, else the request's, else the
    installer's default (what hostctx put in the medium)."""
    if job.os_password_enc:
        return svc.box.decrypt(job.os_password_enc, context=f"os-job:{job.id}")
    spec_enc = _request(job).get("os_password_enc")
    if spec_enc:
        return svc.box.decrypt(spec_enc, context=f"os:{job.bmc_ip}")
    return DEFAULT_OS_PASSWORD


async def register(svc: CallbackPort, job: Job, os_ip: str) -> None:
    """Record the OS address on the BMC's registry row and the node as a compute node of the
    fabric (idempotent per address). A failure is logged: the job itself has completed."""
    spec = _request(job)
    try:
        await svc.bus.request(
            svc.bus.subjects.request("inventory", "register_node"),
            RegisterNode(
                bmc_ip=job.bmc_ip,
                os_ip=os_ip or None,
                os_hostname=job.hostname or None,
                vendor=job.vendor or None,
                is_control_node=False,
            ),
        )
        if not os_ip:
            return
        await svc.bus.request(
            svc.bus.subjects.request("inventory", "register_compute_node"),
            RegisterComputeNode(
                node_ip=os_ip,
                os_username=spec.get("os_username") or "debian",
                os_password_enc=svc.box.encrypt(_os_password(svc, job), context=password_context(os_ip)),
                hostname=job.hostname or None,
                bmc_ip=job.bmc_ip,
            ),
            reply=ComputeNode,
        )
    except KariosError as exc:
        log.warning("could not register the node in the inventory", job_id=job.id, error=exc.message)
