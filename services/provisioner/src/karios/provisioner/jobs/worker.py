"""Use case "run the worker phase": queued → building_media → mounting → booting, resumable.

queued: wait for admission (admitter.py: bounded overall and per vendor, over all replicas);
queued/building_media: check the BMC answers (before any medium is written), (re)build the
medium; mounting: rebuild the medium (it lives on the replica that serves it), eject + insert,
boot override (all idempotent); then the gate ``mounting → booting`` (owner-checked, under the
row lock, once per job) and only after it commits the one power reset.

Per job: one BMC session (the probe's driver goes on to mount and reset: one login, one
discovery), and every state move is the ownership and cancel check of its step (made under the
row lock), so a step that moves the job does not read it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from dataclasses import dataclass
from typing import Any

from karios.common.contracts.provision import StartProvision
from karios.common.db.session import unavailable_database_error
from karios.common.errors import KariosError
from karios.common.telemetry import get_logger
from karios.provisioner.bios import step as bios_step
from karios.provisioner.bmc import probe
from karios.provisioner.drivers import RedfishDriver
from karios.provisioner.jobs.ports import WorkerPort
from karios.provisioner.jobs.repository import JobCancelled, LeaseLost, now
from karios.provisioner.models import Job
from karios.provisioner.statemachine import State, is_terminal

log = get_logger(__name__)

QUIRK_ONCE = (
    "BMC quirk: BootSourceOverrideEnabled reads back {got!r} after 'Once' was sent "
    "(the override is cleared when the job ends)"
)


__all__ = ["JobCancelled", "run"]


@dataclass
class Attempt:
    job_id: str
    job: Job | None = None
    mounted: bool = False  # from here a cancel must eject what we may have inserted


def subnet_of(ip: str) -> str:
    try:
        return str(ipaddress.ip_network(f"{ip}/24", strict=False))
    except ValueError:
        return ip


async def run(svc: WorkerPort, job_id: str, job: Job | None = None) -> None:
    """Work a job from its recorded state up to booting; safe to run again after a crash.

    ``job``: the row as just read by the caller (checked here instead of read again)."""
    at = Attempt(job_id)
    probed: RedfishDriver | None = None  # the probe's driver, handed on to the mount
    try:
        at.job = svc.verify(job) if job is not None else await svc.check(job_id)
        cmd = StartProvision.model_validate(at.job.spec)
        token = await svc.job_token(at.job)
        state = State(at.job.state)
        if state == State.queued and at.job.admitted_at is None:
            await svc.admitter.wait(job_id)  # admission control: a slot (all replicas, per vendor)
        if state in (State.queued, State.building_media):
            async with svc.bmc_sem:  # fail in seconds, before any medium is written
                probed = await svc.driver(cmd, probe=True)
                await probe(probed)
            if svc.firmware is not None and at.job.job_type == "provision":
                # held firmware updates: the same maintenance window, before the install
                await svc.firmware.before_install(cmd.spec.bmc_ip, job_id)
        async with svc.build_sem:
            if state == State.queued:
                await svc.move(job_id, State.building_media, owned=True)  # owner + cancel check
                state = State.building_media
            else:
                await svc.check(job_id)
            await svc.build_medium(cmd, token, job=at.job)
        drv, probed = probed, None
        kind = await mount_and_reset(svc, at, cmd, state, drv)
        log.info("job booting", job_id=job_id, reset=kind, replica=svc.replica)
    except asyncio.CancelledError:
        log.info("worker stopping; the job stays claimable", job_id=job_id)
    except JobCancelled:
        log.info("job cancelled", job_id=job_id)
        await _after_cancel(svc, at)
    except LeaseLost as exc:
        log.warning("job lease lost; the owner resumes it", job_id=job_id, reason=str(exc))
    except KariosError as exc:
        if at.mounted and await svc.is_cancelled(job_id):
            await _after_cancel(svc, at)  # e.g. the booting gate refused: cancelled meanwhile
        else:
            await svc.fail(job_id, exc.message)
    except Exception as exc:
        if unavailable_database_error(exc) is not None:
            # A stalled or restarting database is not the job's fault (and failing it would need
            # the database too): leave it claimable; the lease sweep resumes it from its state.
            log.warning("database unavailable; the job stays claimable", job_id=job_id, error=str(exc)[:200])
            return
        log.exception("job failed", job_id=job_id)
        await svc.fail(job_id, "internal error (see the provisioner log)")
    finally:
        if probed is not None:  # stopped before the mount: end the probe's session
            with contextlib.suppress(Exception):
                await probed.close()
        if svc.tasks.get(job_id) is asyncio.current_task():
            svc.tasks.pop(job_id, None)


async def _after_cancel(svc: WorkerPort, at: Attempt) -> None:
    """The cancel may have run its cleanup before our build or insert: clean up again."""
    svc.media.remove(at.job_id)
    if at.mounted and at.job is not None:
        await svc.cleanup_bmc(at.job)


async def mount_and_reset(
    svc: WorkerPort, at: Attempt, cmd: StartProvision, state: State, probed: RedfishDriver | None = None
) -> str:
    """Mount, boot override, the gate and the reset; ``probed``: the probe's driver (its session
    and discovery are reused; it is closed here)."""
    subnet = svc.subnet_sems[subnet_of(cmd.spec.bmc_ip)]
    try:
        async with svc.bmc_sem, subnet:
            if state == State.building_media:
                await svc.move(at.job_id, State.mounting, owned=True)  # owner + cancel check
            else:
                await svc.check(at.job_id)
            if probed is not None:
                drv, probed = probed, None
                drv.relax()
            else:
                drv = await svc.driver(cmd)
            return await _mount_and_reset(svc, at, drv)
    finally:
        if probed is not None:
            with contextlib.suppress(Exception):
                await probed.close()


async def _mount_and_reset(svc: WorkerPort, at: Attempt, drv: RedfishDriver) -> str:
    async with drv:
        at.mounted = True
        await drv.mount(svc.media_url(at.job_id))  # signed, expiring at the stage deadline
        svc.mounts += 1
        note = quirk_note(drv, await drv.set_boot_cd_once())
        if note:
            log.warning("BMC ignores one-time boot overrides", job_id=at.job_id, bmc_ip=drv.ep.bmc_ip)
        # BIOS intents (gpu_passthrough): PATCHed now, applied by the reset below (bios/step.py).
        spec = StartProvision.model_validate(at.job.spec) if at.job is not None else None
        bios = await bios_step.before_reset(drv, spec) if spec is not None else None
        note = "; ".join(n for n in (note, bios.note if bios else "") if n)
        # No read of the job here: the gate's move checks owner and cancel under the row lock.
        gate = asyncio.create_task(gate_and_reset(svc, at.job_id, drv, note))
        gate.add_done_callback(_retrieve)
        svc.resetting[at.job_id] = gate
        try:
            kind = await asyncio.shield(gate)
        finally:
            if gate.done():
                svc.resetting.pop(at.job_id, None)
        await drv.wait_power_on()
        if bios is not None:
            await _bios_read_back(svc, at.job_id, drv, bios)
    return kind


async def _bios_read_back(svc: WorkerPort, job_id: str, drv: RedfishDriver, bios: bios_step.BiosStep) -> None:
    """After the reset: the BIOS read back, the verdict on the job (an event, never a failure)."""
    message = await bios_step.after_reset(drv, bios, drv.ep.power_deadline)
    if not message:
        return
    with contextlib.suppress(KariosError):
        job = await svc.load(job_id)
        if not is_terminal(job.state):
            await svc.emit(job, message=message)


def quirk_note(drv: RedfishDriver, read_back: Any) -> str:
    """Evidence of a BMC that answers ``Continuous`` when ``Once`` was sent ("" otherwise)."""
    if drv.quirks.boot_enabled == "Once" and isinstance(read_back, str) and read_back == "Continuous":
        return QUIRK_ONCE.format(got=read_back)
    return ""


async def gate_and_reset(svc: WorkerPort, job_id: str, drv: RedfishDriver, note: str = "") -> str:
    """``mounting → booting`` as the lease owner (once per job, row-locked), then the reset."""
    message = "Medium mounted; resetting into it" + (f" ({note})" if note else "")
    await svc.move(job_id, State.booting, message, owned=True, reset_at=now())
    return await drv.reset_into_media()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shielded task's outcome as seen (its awaiter may be gone after a stop)."""
    if not task.cancelled():
        task.exception()
