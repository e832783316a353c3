"""Use cases that keep jobs moving: the stuck sweep, and lease upkeep (heartbeat, claim sweep).

A replica renews the lease of the jobs it works every ``lease_seconds/3``; every ``claim_interval``
it claims worker-phase jobs whose lease expired and resumes each from its recorded state; a job
taken more than ``max_attempts`` times fails instead of crash-looping.
"""

from __future__ import annotations

import asyncio
import contextlib

from karios.common.errors import Conflict, ServiceUnavailable
from karios.common.telemetry import get_logger
from karios.provisioner import metrics
from karios.provisioner.jobs.ports import UpkeepPort
from karios.provisioner.statemachine import INFO, State

log = get_logger(__name__)


async def check_stuck(svc: UpkeepPort) -> int:
    """Jobs waiting for the installer past their stage deadline become ``stuck``."""
    n = 0
    for job_id in await svc.repo.overdue():
        with contextlib.suppress(Conflict):
            await svc.move(job_id, State.stuck, "no installer report before the stage deadline")
            n += 1
    metrics.set_job_counts(await svc.repo.counts())
    return n


async def stuck_loop(svc: UpkeepPort) -> None:
    while True:
        await asyncio.sleep(svc.cfg.stuck_check_interval)
        try:
            await check_stuck(svc)
        except (ServiceUnavailable, OSError) as exc:
            log.warning("stuck check failed", error=str(exc))


async def heartbeat(svc: UpkeepPort) -> list[str]:
    """Renew the lease of every job this replica works; stop tasks whose lease was taken."""
    ids = list(svc.tasks)
    lost = await svc.repo.renew(ids) if ids else []
    for job_id in lost:
        task = svc.tasks.get(job_id)
        if task is not None:
            log.warning("job lease taken by another replica; stopping here", job_id=job_id)
            task.cancel()
    return lost


async def resume_expired(svc: UpkeepPort) -> list[str]:
    """Claim expired jobs and resume each from its recorded state. Returns the job ids."""
    resumed = []
    for job_id, attempts in await svc.claim_expired():
        if job_id in svc.tasks and not svc.tasks[job_id].done():
            continue  # our own task outlived a missed heartbeat: it still runs
        if attempts > svc.cfg.max_attempts:
            await svc.fail(job_id, f"gave up after {attempts - 1} worker attempts (provisioner restarts)")
            continue
        job = await svc.load(job_id)
        log.info("resuming job", job_id=job_id, state=job.state, attempt=attempts, replica=svc.replica)
        await svc.emit(
            job,
            f"{INFO[State(job.state)].stage}: resumed by another worker (attempt {attempts})",
            fact="job.resumed",
        )
        svc.spawn(job_id)
        resumed.append(job_id)
    return resumed


async def lease_loop(svc: UpkeepPort) -> None:
    """Heartbeat every lease/3 and claim expired jobs every ``claim_interval`` (first: now)."""
    loop = asyncio.get_running_loop()
    tick = max(0.05, min(svc.cfg.claim_interval, svc.cfg.lease_seconds / 3))
    next_claim = 0.0
    while True:
        try:
            await heartbeat(svc)
            if loop.time() >= next_claim:
                next_claim = loop.time() + svc.cfg.claim_interval
                await resume_expired(svc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # DB or bus blip: try again next tick
            log.warning("lease upkeep failed", error=f"{type(exc).__name__}: {exc}"[:300])
        await asyncio.sleep(tick)
