"""Use cases "installer reports": a step, completion, first boot. All carry the job token.

A step naming a stage of the job's install method gets that stage's label and percentage; a
step in state ``failed`` fails the job at once with "<stage label>: <installer message>" and the
installer's last log lines.

No existence oracle: an unknown job or BMC answers exactly like a wrong token (401 "invalid job
token"); 404 and 409 are only ever said to a caller holding a valid token. The token arrives as
its SHA-256 (the gateway hashes it; the bus never carries it) and is good only for what its
job's state expects (:mod:`.tokens`: steps and one /complete while installing, then one
/firstboot within the window, then nothing), checked again under the row lock of the move.
First boot registers the node as a compute node of the fabric (credentials as the installer
set them) at the address it reports, unless that would move a node: an address other than the
one reported at /complete, or another BMC's compute node, is a 409 for an operator to settle.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from karios.common.contracts.inventory import RegisterNode
from karios.common.contracts.nodes import (
    ComputeNode,
    ComputeNodeQuery,
    RegisterComputeNode,
    password_context,
)
from karios.common.contracts.provision import CallbackRequestV2, JobView
from karios.common.errors import Conflict, KariosError, NotFound, Unauthorized
from karios.common.provisioning import bound_log, bound_message
from karios.common.telemetry import get_logger
from karios.provisioner import metrics
from karios.provisioner.install import INSTALL_STAGES, WIPE_STAGES, Stage, stage_of
from karios.provisioner.jobs import tokens
from karios.provisioner.jobs.hostctx import DEFAULT_OS_PASSWORD
from karios.provisioner.jobs.ports import CallbackPort
from karios.provisioner.jobs.repository import now
from karios.provisioner.jobs.tokens import Callback, TokenState
from karios.provisioner.models import Job
from karios.provisioner.statemachine import INFO, State

log = get_logger(__name__)


INVALID_TOKEN = "invalid job token"  # noqa: S105 (a message, not a secret)


def token_matches(job: Job, token_sha256: str) -> bool:
    """The presented token (as its SHA-256) is the job's, compared in constant time."""
    return bool(token_sha256) and hmac.compare_digest(token_sha256, job.token_hash)


def accepts(svc: CallbackPort, cb: Callback) -> Callable[[Job], None]:
    """The token rule for ``cb`` as a check of a job row (409 naming why it is refused)."""

    def check(job: Job) -> None:
        tokens.check(cb, TokenState.of(job), now(), svc.cfg.firstboot_window)

    return check


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


async def _current(svc: CallbackPort, req: CallbackRequestV2, cb: Callback) -> Job:
    job = await _load(svc, req.job_id)
    if not token_matches(job, req.token_sha256):
        raise Unauthorized(INVALID_TOKEN)
    accepts(svc, cb)(job)
    newer = await svc.repo.newer_than(job)
    if newer is not None:
        raise Conflict(f"job {job.id} was superseded by job {newer} for BMC {job.bmc_ip}")
    return job


async def step(svc: CallbackPort, req: CallbackRequestV2) -> JobView:
    job = await _current(svc, req, Callback.step)
    stage = stage_of(stages_of(svc, job), req.step)
    label = stage.label if stage else req.step
    said = bound_message(req.message)
    extra = {"log_tail": bound_log(req.log)} if req.log else {}
    guard = accepts(svc, Callback.step)
    if req.state == "failed":
        text = f"{label}: {said or f'installer step {req.step} failed'}"
        metrics.installer_failed(job.vendor, stage.key if stage else None)
        job = await svc.move(job.id, State.failed, text, guard=guard, **extra)
        return view(job)
    percent = req.percent if req.percent is not None else (stage.percent if stage else None)
    percent = max(50, min(89, percent)) if percent is not None else None
    text = f"{label}: {said or req.state}"
    target = tokens.target(Callback.step, job.job_type)
    job = await svc.move(job.id, target, text, percent=percent, fact="job.step", guard=guard, **extra)
    return view(job)


async def complete(svc: CallbackPort, req: CallbackRequestV2) -> JobView:
    job = await _current(svc, req, Callback.complete)
    enc = req.os_password_enc
    extra = {"log_tail": bound_log(req.log)} if req.log else {}
    guard = accepts(svc, Callback.complete)
    if job.state == State.booting:
        await svc.move(job.id, State.installing, "installer reported completion", guard=guard)
    job = await svc.move(
        job.id,
        State.first_boot,
        # the installer's own words, if any (a whole-disk image says what writing it took)
        "OS installed; waiting for first boot" + (f": {bound_message(req.message)}" if req.message else ""),
        os_ip=req.os_ip or job.os_ip,
        installed_at=now(),  # the token is now good for one /firstboot, nothing else
        guard=guard,
        **({"os_password_enc": enc} if enc else {}),
        **extra,
    )
    if tokens.target(Callback.complete, job.job_type) == State.completed:  # unprovision: done
        job = await svc.move(job.id, State.completed, bound_message(req.message) or "disks wiped")
    return view(job)


async def firstboot(svc: CallbackPort, req: CallbackRequestV2) -> JobView:
    """``/firstboot`` names the BMC (the seed's body); cloud-init's ``/job/{id}/phone-home`` names
    the job (``req.job_id``) and reports no address: the one the installer reported at /complete."""
    job_id = req.job_id or await svc.repo.latest_for_bmc(req.bmc_ip)
    if job_id is None:
        raise Unauthorized(INVALID_TOKEN)  # as for a wrong token: no oracle of known BMCs
    job = await _load(svc, job_id)
    if not token_matches(job, req.token_sha256):
        old = (
            await svc.repo.with_token(req.bmc_ip, req.token_sha256)
            if req.token_sha256 and req.bmc_ip
            else None
        )
        if old is not None:
            raise Conflict(f"job {old} was superseded by a newer job for BMC {req.bmc_ip}")
        raise Unauthorized(INVALID_TOKEN)
    guard = accepts(svc, Callback.firstboot)
    guard(job)
    os_ip = req.os_ip or job.os_ip
    await refuse_move(svc, job, os_ip)
    said = f": {req.message}" if req.message else ""
    job = await svc.move(job.id, State.completed, f"first boot from {os_ip}{said}", os_ip=os_ip, guard=guard)
    await register(svc, job, os_ip)
    return view(job)


async def refuse_move(svc: CallbackPort, job: Job, os_ip: str) -> None:
    """409 when registering ``job``'s node at ``os_ip`` would move a node without an operator:
    the installer reported another address at /complete, or ``os_ip`` is another BMC's node."""
    if job.os_ip and os_ip != job.os_ip:
        raise Conflict(
            f"job {job.id}: the installer reported os_ip {job.os_ip} at /complete and the first boot "
            f"reports {os_ip}; an operator must register the node at its new address",
            details={"job_id": job.id, "os_ip": job.os_ip, "reported": os_ip},
        )
    if not os_ip:
        return
    try:
        node = await svc.bus.request(
            svc.bus.subjects.query("inventory", "compute_node"),
            ComputeNodeQuery(node_ip=os_ip),
            reply=ComputeNode,
        )
    except NotFound:
        return
    except KariosError as exc:  # the inventory is away: register() will not reach it either
        log.warning("could not check the first boot's address", job_id=job.id, error=exc.message)
        return
    if node.bmc_ip != job.bmc_ip:
        owner = f"BMC {node.bmc_ip}" if node.bmc_ip else f"a node {node.source}"
        raise Conflict(
            f"job {job.id}: os_ip {os_ip} is the address of the compute node of {owner}; an operator "
            "must remove that node before this one may register there",
            details={"job_id": job.id, "os_ip": os_ip, "bmc_ip": node.bmc_ip},
        )


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
