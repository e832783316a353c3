"""Use case: a job whose replica died (its lease expired) is taken over by a peer. A teardown
runs again (idempotent); an apply rolls every touched node back to its persisted baseline on
the same path a cancelled apply takes (:meth:`ApplyJob.recover`) and ends failed (cancelled
when a cancel was requested), rollout_status failed, or degraded when a node could not be."""

from __future__ import annotations

import asyncio
import json

from pydantic import ValidationError

from karios.common.errors import KariosError
from karios.common.telemetry import get_logger
from karios.fabric_worker.models import FabricJobRow
from karios.fabric_worker.rollout import teardown
from karios.fabric_worker.rollout.access import baseline_context, intent_of
from karios.fabric_worker.rollout.facts import facts_from_dict
from karios.fabric_worker.rollout.jobs import ApplyJob, RolloutEvent
from karios.fabric_worker.rollout.service import RolloutService
from karios.fabric_worker.rollout.summary import JobSummary, JobType, RolloutStatus

log = get_logger(__name__)


async def recover_stale(svc: RolloutService) -> int:
    """Take over every running job whose replica is gone (start-up and every lease/3)."""
    ids = await svc.repo.stale_jobs(svc.settings.lease)
    for job_id in ids:
        if svc.stopping:
            break
        try:
            await take_over(svc, job_id)
        except Exception:
            log.exception("fabric job recovery failed", job_id=job_id)
    return len(ids)


async def take_over(svc: RolloutService, job_id: str) -> None:
    live = svc.registry.running_job()
    if live is not None and live.job_id == job_id:
        # Our own apply, still running: its heartbeat only looked stale (e.g. the database was
        # paused). Renew the lease instead of reaping ourselves.
        await svc.repo.heartbeat(job_id, live.summary)
        return
    before = await svc.repo.get_row(job_id)
    previous = before.owner if before is not None else ""
    row = await svc.repo.claim(job_id, svc.settings.lease)
    if row is None:
        return  # held by a live replica, finished, or another peer won the claim
    if row.job_type == JobType.TEARDOWN:
        await teardown.run_claimed(svc, row, None)
    else:
        await recover_apply(svc, row, previous)


async def _job(
    svc: RolloutService, row: FabricJobRow, summary: JobSummary, touched: bool
) -> tuple[ApplyJob, str]:
    """The interrupted job rebuilt from its row: intent (secrets decrypted now, to redact them
    and to roll back) and the nodes still registered. Second value: why a node is missing."""
    vnis = tuple(int(v) for v in (row.request or {}).get("vnis", svc.vnis))
    try:
        config = await svc.repo.config()
        intent = intent_of(config, svc.settings, svc.box).model_copy(update={"vnis": vnis})
        targets = await svc.targets() if touched else []  # nothing to roll back: no SSH, no lookup
        missing = "node no longer registered"
    except KariosError as exc:  # config gone (DELETE is refused while a job runs) or inventory down
        intent, targets, missing = None, [], exc.message

    async def sink(ev: RolloutEvent) -> None:
        await svc.safe_publish(ev)

    job = ApplyJob(
        intent,
        targets,
        {},
        concurrency=svc.settings.concurrency,
        options=svc.settings.options(),
        sink=sink,
        job_id=row.job_id,
        resume=summary,
    )
    return job, missing


async def recover_apply(svc: RolloutService, row: FabricJobRow, previous: str) -> None:
    job_id = row.job_id
    try:
        summary = JobSummary.model_validate((row.summary or {}) | {"job_type": JobType.APPLY})
    except ValidationError:
        summary = JobSummary(job_id=job_id, job_type=JobType.APPLY)
    blobs = await svc.repo.baselines(job_id)
    baselines = {
        ip: facts_from_dict(json.loads(svc.box.decrypt(blob, context=baseline_context(job_id, ip))))
        for ip, blob in blobs.items()
    }
    job, missing = await _job(svc, row, summary, bool(baselines))
    work = job.recover(baselines, previous=previous, cancelled=bool(row.cancel_requested), missing=missing)
    task = asyncio.get_running_loop().create_task(work)
    if not await svc.hold_lease(job_id, task):
        return
    if task.cancelled():
        await svc.repo.release(job_id)
        return
    done = task.result()
    whole = not (row.request or {}).get("node_ip")
    if not await svc.repo.finish(done, done.rollout_status if whole else RolloutStatus.DEGRADED):
        return
    log.warning(
        "interrupted fabric apply recovered", job_id=job_id, rolled_back=len(blobs), failed=done.failed_nodes
    )
