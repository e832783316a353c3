"""The job table: SQL and leases, nothing else (no bus, no BMC, no events).

Leases are compared with the database clock (``now()``), never the replicas' clocks. A lease is a
row of ``job_leases`` (narrow, one per worker-phase job): the heartbeat renews thousands of them
without rewriting a single job row (migration 0011).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from karios.common.db import Database
from karios.common.errors import NotFound
from karios.common.provisioning import TERMINAL_STATES
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.jobs.admission import Limits, Waiting, candidates_per_vendor, plan
from karios.provisioner.models import Job, JobLease
from karios.provisioner.statemachine import INFO, WORKER_STATES, State, is_terminal, transition

T = Job.__table__  # type: ignore[attr-defined]
L = JobLease.__table__  # type: ignore[attr-defined]
#: A lease handed back (a graceful stop) or never held: claimable at once.
HANDED_BACK = sa.literal_column("'-infinity'::timestamptz")
_WORK = [s.value for s in WORKER_STATES]
_ENDED = sorted(TERMINAL_STATES)
_WATCHED = [s.value for s, info in INFO.items() if info.watched]


_RUNNING = ("id", "bmc_ip", "job_type", "state", "created_at", "vendor", "admitted_at")
_RUNNING_COLUMNS = [T.c[c] for c in _RUNNING]
_ADMISSION_LOCK = 0x6B61_6470  # pg_advisory_xact_lock key of admission ("kadp")


def now() -> datetime:
    return datetime.now(UTC)


async def running_job_on(db: Database, bmc_ip: str) -> str | None:
    """The id of a job on this BMC that has not ended (None: the BMC is free for a BMC-wide
    action — a credential rotation, a firmware update)."""
    async with db.session() as s:
        row = (
            await s.exec(  # type: ignore[call-overload]
                sa.select(Job.id).where(Job.bmc_ip == bmc_ip, Job.state.notin_(TERMINAL_STATES))  # type: ignore[attr-defined]
            )
        ).first()
    return None if row is None else str(row[0])


class LeaseLost(Exception):
    """Another replica owns the job now (our lease expired): stop without touching the BMC."""


class JobCancelled(Exception):
    """The job was cancelled: a worker step found it so (its move, or its check)."""


@dataclass
class Moved:
    job: Job
    previous: State


@dataclass
class JobRepository:
    db: Database
    cfg: ProvisionerConfig  # lease_seconds and stage_deadline, read at each use (tests change them)
    replica: str

    def lease_expr(self) -> Any:
        """``now() + lease`` on the database clock."""
        return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, float(self.cfg.lease_seconds))

    async def load(self, job_id: str) -> Job:
        async with self.db.session() as s:
            job = await s.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    async def state_of(self, job_id: str) -> str | None:
        """The job's state alone (None: no such job): the media access check."""
        async with self.db.session() as s:
            row = (await s.exec(sa.select(T.c.state).where(T.c.id == job_id))).first()
        return row[0] if row else None

    async def insert(self, row: dict[str, Any]) -> tuple[bool, str | None]:
        """Insert a job (a duplicate id is a no-op): (created, id of another running job of its BMC).

        A transaction-scoped advisory lock per BMC serialises two inserts for one BMC, so the
        second always sees the first (never two running jobs on one machine).
        """
        async with self.db.session() as s, s.begin():
            await s.exec(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(row["bmc_ip"]))))
            conn = await s.connection()
            res = await conn.execute(pg_insert(T).values(**row).on_conflict_do_nothing().returning(T.c.id))
            if res.first() is None:
                return False, None
            await conn.execute(pg_insert(L).values(job_id=row["id"], lease_until=self.lease_expr()))
            other = (
                await s.exec(
                    sa.select(T.c.id).where(
                        T.c.bmc_ip == row["bmc_ip"], T.c.id != row["id"], T.c.state.notin_(_ENDED)
                    )
                )
            ).first()
        return True, other[0] if other else None

    async def move(
        self,
        job_id: str,
        target: State,
        message: str,
        *,
        percent: int | None,
        owned: bool,
        values: dict[str, Any],
        guard: Callable[[Job], None] | None = None,
    ) -> Moved:
        """One transition of the table under the row lock (409 if forbidden).

        ``owned``: only the lease owner may make it (:class:`LeaseLost`; :class:`JobCancelled` if
        the job was cancelled), and it renews the lease while the job stays in the worker phase.
        ``guard``: a check of the row as locked (e.g. the job token's rule), raising to refuse.
        The row lock and the database clock come in one statement.
        """
        async with self.db.session() as s, s.begin():
            found = (
                await s.exec(sa.select(Job, sa.func.now()).where(T.c.id == job_id).with_for_update(of=T))
            ).first()
            if found is None:
                raise NotFound(f"no job {job_id}")
            job, db_now = found
            if owned and job.state == State.cancelled.value:
                raise JobCancelled(job_id)
            if owned and job.owner != self.replica and not is_terminal(job.state):
                raise LeaseLost(f"job {job_id} is owned by {job.owner or 'nobody'}")
            if guard is not None:
                guard(job)
            previous = State(job.state)
            new = transition(job.state, target)
            await (await s.connection()).execute(self._lease_on_move(job_id, new, owned, db_now))
            info = INFO[new]
            job.state = new.value
            job.message = message or info.stage
            job.percent = percent if percent is not None else (info.percent or job.percent)
            job.updated_at = now()
            job.stage_deadline = now() + timedelta(seconds=self.cfg.stage_deadline) if info.watched else None
            for k, v in values.items():
                setattr(job, k, v)
        return Moved(job, previous)

    def _lease_on_move(self, job_id: str, new: State, owned: bool, db_now: datetime) -> Any:
        """The lease statement of a move to ``new``: the owner's move renews it; a worker-phase
        job always has a lease row (claimable at once when nobody held it); past the worker
        phase there is nothing left to claim."""
        if new not in WORKER_STATES:
            return sa.delete(L).where(L.c.job_id == job_id)
        if owned:
            stmt = pg_insert(L).values(
                job_id=job_id, lease_until=db_now + timedelta(seconds=self.cfg.lease_seconds)
            )
            return stmt.on_conflict_do_update(
                index_elements=[L.c.job_id], set_={"lease_until": stmt.excluded.lease_until}
            )
        return pg_insert(L).values(job_id=job_id, lease_until=HANDED_BACK).on_conflict_do_nothing()

    async def set_token(self, job_id: str, token_hash: str, token_enc: str) -> None:
        async with self.db.session() as s, s.begin():
            res = await (await s.connection()).execute(
                sa.update(T)
                .where(T.c.id == job_id, T.c.owner == self.replica)
                .values(token_hash=token_hash, token_enc=token_enc)
            )
            if res.rowcount != 1:
                raise LeaseLost(f"job {job_id} is owned by another replica")

    # -- leases -------------------------------------------------------------------------
    async def renew(self, ids: list[str]) -> list[str]:
        """Renew our leases on ``ids``; return those another replica owns now.

        Only lease rows are written. The job rows are share-locked while read: a claim of
        another replica holding one (``FOR UPDATE``) is waited for and its new owner seen; one
        that comes later skips the row (``SKIP LOCKED``) or finds the lease renewed."""
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            # One array parameter, not an IN list of thousands: one statement text (asyncpg's
            # prepared statement reused) whatever the number of jobs.
            listed = sa.any_(sa.bindparam("ids", list(ids), type_=ARRAY(sa.String)))
            ours = (
                sa.select(T.c.id)
                .where(T.c.id == listed, T.c.owner == self.replica, T.c.state.in_(_WORK))
                .with_for_update(read=True, of=T)
            )
            renewed = {
                r[0]
                for r in await conn.execute(
                    sa.update(L)
                    .where(L.c.job_id.in_(ours.scalar_subquery()))
                    .values(lease_until=self.lease_expr())
                    .returning(L.c.job_id)
                )
            }
            rest = [i for i in ids if i not in renewed]
            if not rest:
                return []
            taken = await conn.execute(
                sa.select(T.c.id).where(T.c.id.in_(rest), T.c.owner != self.replica, T.c.state.in_(_WORK))
            )
            return [r[0] for r in taken]

    async def claim_expired(self, limit: int) -> list[tuple[str, int]]:
        """Take worker-phase jobs whose lease expired (or was handed back): (job id, attempts).

        ``FOR UPDATE SKIP LOCKED`` of the job and its lease row in one UPDATE: two replicas
        sweeping at once never take the same job, and a lease renewed after this statement's
        snapshot is seen renewed (its row changed: the condition is checked again on it).
        """
        pick = (
            sa.select(T.c.id)
            .select_from(T.join(L, L.c.job_id == T.c.id))
            .where(T.c.state.in_(_WORK), L.c.lease_until < sa.func.now())
            .order_by(T.c.created_at)
            .limit(limit)
            .with_for_update(skip_locked=True, of=[T, L])
        )
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            rows = [
                (r[0], r[1])
                for r in await conn.execute(
                    sa.update(T)
                    .where(T.c.id.in_(pick.scalar_subquery()))
                    .values(owner=self.replica, attempts=T.c.attempts + 1)
                    .returning(T.c.id, T.c.attempts)
                )
            ]
            await self._extend(conn, [r[0] for r in rows])
            return rows

    async def _extend(self, conn: Any, ids: list[str]) -> None:
        """A full lease from now on ``ids`` (jobs this transaction just took or admitted)."""
        if ids:
            await conn.execute(sa.update(L).where(L.c.job_id.in_(ids)).values(lease_until=self.lease_expr()))

    async def release_leases(self) -> None:
        """Hand our worker-phase leases back (a graceful stop: another replica resumes at once)."""
        async with self.db.session() as s, s.begin():
            ours = sa.select(T.c.id).where(T.c.owner == self.replica, T.c.state.in_(_WORK))
            await (await s.connection()).execute(
                sa.update(L).where(L.c.job_id.in_(ours.scalar_subquery())).values(lease_until=HANDED_BACK)
            )

    # -- admission (see admission.py) -----------------------------------------------------
    async def admit(self, limits: Limits, waiting: list[str]) -> list[str]:
        """Admit those of ``waiting`` (queued, ours) that :func:`admission.plan` lets start;
        return their ids, and those of ``waiting`` admitted already (an earlier admission whose
        commit succeeded but whose answer was lost).

        One transaction-scoped advisory lock serialises admission over all replicas, and the
        counts are read under it: replicas never admit past a limit together. An older job of
        another replica keeps its slot until that replica admits it (the queue stays FIFO).
        """
        async with self.db.session() as s, s.begin():
            await s.exec(sa.select(sa.func.pg_advisory_xact_lock(_ADMISSION_LOCK)))
            # Already admitted, by an earlier run whose COMMIT's answer never came back (the
            # database paused or the connection dropped after the commit): its waiter is still
            # waiting. Without this it would wait for ever, its lease renewed by the heartbeat.
            # Read among the admitted jobs (ix_jobs_admitted: at most the overall limit), not by
            # the waiting ids (thousands in a storm, sent at every round).
            mine = set(waiting)
            earlier = [
                r[0]
                for r in await s.exec(
                    sa.select(T.c.id).where(
                        T.c.admitted_at.is_not(None),
                        T.c.owner == self.replica,
                        T.c.state == State.queued.value,
                    )
                )
                if r[0] in mine
            ]
            active, queued = await _admission_rows(s, candidates_per_vendor(limits))
            decided = plan(limits, active, queued)
            go = [j for j, why in decided.items() if not why and j in mine]
            if not go:
                return earlier
            conn = await s.connection()
            ids = [
                r[0]
                for r in await conn.execute(
                    sa.update(T)
                    .where(
                        T.c.id.in_(go),
                        T.c.owner == self.replica,
                        T.c.state == State.queued.value,
                        T.c.admitted_at.is_(None),
                    )
                    .values(admitted_at=sa.func.now())
                    .returning(T.c.id)
                )
            ]
            await self._extend(conn, ids)
            return earlier + ids

    async def admission(self, limits: Limits) -> tuple[dict[str, int], dict[str, str]]:
        """(admitted jobs per vendor, queued job id → why it waits) as :func:`plan` sees it now."""
        async with self.db.session() as s:
            active, queued = await _admission_rows(s)
        return active, plan(limits, active, queued)

    # -- queries ------------------------------------------------------------------------
    async def running(self) -> list[Any]:
        async with self.db.session() as s:
            return list(
                (
                    await s.exec(
                        sa.select(*_RUNNING_COLUMNS).where(T.c.state.notin_(_ENDED)).order_by(T.c.created_at)
                    )
                ).all()
            )

    async def overdue(self) -> list[str]:
        """Jobs waiting for the installer whose stage deadline passed."""
        async with self.db.session() as s:
            rows = (
                await s.exec(sa.select(T.c.id).where(T.c.state.in_(_WATCHED), T.c.stage_deadline < now()))
            ).all()
        return [r[0] for r in rows]

    async def counts(self) -> list[tuple[str, str, str | None, int]]:
        """``(job_type, state, vendor, count)`` over the job table (the jobs gauge)."""
        async with self.db.session() as s:
            rows = await s.exec(
                sa.select(T.c.job_type, T.c.state, T.c.vendor, sa.func.count()).group_by(
                    T.c.job_type, T.c.state, T.c.vendor
                )
            )
            return [(r[0], r[1], r[2], int(r[3])) for r in rows.all()]

    async def newer_than(self, job: Job) -> str | None:
        async with self.db.session() as s:
            row = (
                await s.exec(
                    sa.select(T.c.id).where(T.c.bmc_ip == job.bmc_ip, T.c.created_at > job.created_at)
                )
            ).first()
        return row[0] if row else None

    async def with_token(self, bmc_ip: str, token_hash: str) -> str | None:
        async with self.db.session() as s:
            row = (
                await s.exec(sa.select(T.c.id).where(T.c.bmc_ip == bmc_ip, T.c.token_hash == token_hash))
            ).first()
        return row[0] if row else None

    async def latest_for_bmc(self, bmc_ip: str) -> str | None:
        async with self.db.session() as s:
            row = (
                await s.exec(
                    sa.select(T.c.id).where(T.c.bmc_ip == bmc_ip).order_by(T.c.created_at.desc()).limit(1)
                )
            ).first()
        return row[0] if row else None


#: Each vendor's ``:n`` oldest waiting jobs, oldest first, read from ``ix_jobs_waiting`` (vendor,
#: created_at, id) alone: the vendors by a skip scan (one index probe per vendor, a recursive
#: query), then each vendor's first ``:n`` rows — never a pass over the whole queue.
_OLDEST_PER_VENDOR = sa.text("""
WITH RECURSIVE vendors(vendor) AS (
    (SELECT vendor FROM provision.jobs
     WHERE state = 'queued' AND admitted_at IS NULL ORDER BY vendor LIMIT 1)
    UNION ALL
    SELECT (SELECT j.vendor FROM provision.jobs j
            WHERE j.state = 'queued' AND j.admitted_at IS NULL AND j.vendor > v.vendor
            ORDER BY j.vendor LIMIT 1)
    FROM vendors v WHERE v.vendor IS NOT NULL
)
SELECT c.id, c.vendor FROM vendors v CROSS JOIN LATERAL (
    SELECT j.id, j.vendor, j.created_at FROM provision.jobs j
    WHERE j.state = 'queued' AND j.admitted_at IS NULL AND j.vendor = v.vendor
    ORDER BY j.created_at, j.id LIMIT :n
) c
WHERE v.vendor IS NOT NULL
ORDER BY c.created_at, c.id
""")


async def _admission_rows(s: Any, per_vendor: int | None = None) -> tuple[dict[str, int], list[Waiting]]:
    """Admitted jobs per vendor and the queued jobs oldest first (the inputs of ``plan``); with
    `per_vendor`, only each vendor's that many oldest (:func:`admission.candidates_per_vendor`)."""
    active = {
        r[0]: int(r[1])
        for r in await s.exec(
            sa.select(T.c.vendor, sa.func.count())
            .where(T.c.admitted_at.is_not(None), T.c.state.in_(_WORK))  # ix_jobs_admitted
            .group_by(T.c.vendor)
        )
    }
    if per_vendor is None:
        waiting = (T.c.state == State.queued.value) & T.c.admitted_at.is_(None)
        rows = await s.exec(sa.select(T.c.id, T.c.vendor).where(waiting).order_by(T.c.created_at, T.c.id))
    else:
        rows = await (await s.connection()).execute(_OLDEST_PER_VENDOR, {"n": per_vendor})
    return active, [Waiting(r[0], r[1] or "") for r in rows]
