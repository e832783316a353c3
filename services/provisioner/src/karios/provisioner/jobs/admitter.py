"""Use case "admit queued jobs": the worker of a queued job waits here for a slot.

Admission sets ``admitted_at`` on the row (the state stays ``queued`` until the BMC answered and
the medium is being built); the slot is free again when the job reaches ``booting`` or ends.

One admission loop per replica: it runs when a job of this replica starts waiting or leaves
the admitted states, and every ``admission_interval`` while jobs wait (a slot freed by another
replica). Each run is one transaction (:meth:`JobRepository.admit`): the counts come from the
job table under an advisory lock, so the limits hold over all replicas. See ``admission.py``.
"""

from __future__ import annotations

import asyncio
import contextlib

from karios.common.contracts.provision import Admission, AdmissionLimits, QueueEntry
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger
from karios.provisioner.jobs.admission import Limits
from karios.provisioner.jobs.ports import JobStore
from karios.provisioner.statemachine import State

log = get_logger(__name__)


def limits_of(svc: JobStore) -> Limits:
    c = svc.cfg  # read at each use (tests and operators change them)
    return Limits(c.admission_overall, c.admission_per_vendor, dict(c.admission_vendors))


class Admitter:
    def __init__(self, svc: JobStore) -> None:
        self.svc = svc
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.kick = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def wait(self, job_id: str) -> None:
        """Return once the job is admitted (its ``admitted_at`` set by this replica)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[job_id] = fut
        self.poke()
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._loop(), name="provision-admission")
        try:
            await fut
        finally:
            if self.waiting.get(job_id) is fut:
                del self.waiting[job_id]

    def poke(self) -> None:
        self.kick.set()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout=self.svc.cfg.admission_interval)
            self.kick.clear()
            if not self.waiting:
                continue
            try:
                await self.admit_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # DB or bus blip: the next tick tries again
                log.warning("admission check failed", error=f"{type(exc).__name__}: {exc}"[:300])

    async def admit_once(self) -> int:
        waiting = [j for j, f in self.waiting.items() if not f.done()]
        admitted = await self.svc.repo.admit(limits_of(self.svc), waiting)
        for job_id in admitted:
            fut = self.waiting.get(job_id)
            if fut is not None and not fut.done():
                fut.set_result(None)
        return len(admitted)

    async def stop(self) -> None:
        if self.task is not None:
            await cancel_and_wait(self.task)
            self.task = None


async def admission(svc: JobStore) -> tuple[Admission, dict[str, str]]:
    """The limits, the admitted counts (all replicas) and why each queued job waits."""
    lim = limits_of(svc)
    active, why = await svc.repo.admission(lim)
    view = Admission(
        limits=AdmissionLimits(overall=lim.overall, per_vendor=lim.per_vendor, vendors=dict(lim.vendors)),
        active=sum(active.values()),
        active_by_vendor=dict(sorted(active.items())),
        queued=len(why),
    )
    return view, why


async def queue(svc: JobStore) -> list[QueueEntry]:
    """Every unfinished job, oldest first: a queued one with its position and why it waits."""
    _, why = await admission(svc)
    out, pos = [], 0
    for r in await svc.repo.running():
        queued = r.state == State.queued and r.admitted_at is None  # admitted: at work (position 0)
        pos += queued
        out.append(
            QueueEntry(
                job_id=r.id,
                bmc_ip=r.bmc_ip,
                job_type=r.job_type,
                state=r.state,
                position=pos if queued else 0,
                created_at=r.created_at.isoformat(),
                vendor=r.vendor or "",
                waiting_for=why.get(r.id, "") if queued else "",
            )
        )
    return out
