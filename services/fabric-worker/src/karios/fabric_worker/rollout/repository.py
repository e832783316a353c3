"""PostgreSQL side of the rollout: job rows and their leases, encrypted node baselines,
first-seen host keys, and the rollout fields of the config row. SQL and leases, nothing else:
every method is one transaction. VTEP addresses go through :mod:`karios.fabric_worker.config.store`
(one pool, one lock).

Jobs across replicas (migration 0003): the job row is the source of truth. A running row has a
lease (``owner`` + ``heartbeat_at``, compared with the database clock); a partial unique index
lets only one job run at a time (:class:`Conflict` here); ``cancel_requested`` is the durable half
of a cancel; each node's baseline is kept encrypted in ``node_baselines`` until the job ends. A
queued job (written by the request that answered 202) has no owner until a replica claims it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from karios.common.contracts.fabric import DeleteResult
from karios.common.contracts.fabric_rollout import FabricJobView, PreflightOverride
from karios.common.errors import Conflict, NotFound
from karios.fabric_worker.config import store
from karios.fabric_worker.models import (
    AppliedConfigRow,
    DriftRoundRow,
    FabricConfigRow,
    FabricJobRow,
    NodeBaselineRow,
    NodeDriftRow,
    NodeHostKeyRow,
    VtepAllocationRow,
)
from karios.fabric_worker.outbox import waiting_job_ids
from karios.fabric_worker.rollout.summary import JobSummary, JobType

RUNNING = "running"
Row = FabricJobRow


def _data(summary: JobSummary) -> dict:
    return summary.model_dump(mode="json")


def _stale(lease_s: float) -> sa.ColumnElement[bool]:
    cutoff = sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, 0, lease_s)
    return sa.or_(Row.heartbeat_at.is_(None), Row.heartbeat_at < cutoff)  # type: ignore[union-attr,operator]


def _held(job_id: str, owner: str) -> tuple[Any, ...]:
    return (Row.job_id == job_id, Row.owner == owner, Row.job_status == RUNNING)


class RolloutRepository:
    """One per worker process; ``owner`` is this replica's lease identity."""

    def __init__(self, db: Any, owner: str) -> None:
        self.db, self.owner = db, owner

    async def _exec(self, stmt: Any) -> Any:
        async with self.db.session() as s, s.begin():
            return await (await s.connection()).execute(stmt)

    # -- the config row ----------------------------------------------------------------------

    async def config(self) -> FabricConfigRow:
        async with self.db.session() as s:
            row = await store.load(s)
        if row is None:
            raise NotFound("no fabric configuration is stored")
        return row

    async def config_or_none(self) -> FabricConfigRow | None:
        async with self.db.session() as s:
            return await store.load(s)

    async def set_rollout_status(self, status: str) -> None:
        async with self.db.session() as s, s.begin():
            await _mark_rollout(s, status)

    async def store_preflight(
        self,
        *,
        underlay_cidr: str,
        underlay_mtu: int,
        hmac_sha_capable: bool | None,
        overrides: list,
        nodes: list[dict] | None = None,
    ) -> None:
        """Keep what preflight learned on the config row (the MTU/HMAC rules read it on the next POST)."""
        async with self.db.session() as s, s.begin():
            row = await store.load(s, for_update=True)
            if row is None:
                return
            row.underlay_cidr, row.underlay_mtu = underlay_cidr, underlay_mtu
            if hmac_sha_capable is not None:  # no node probed: keep what an earlier preflight found
                row.frr_hmac_sha_capable = hmac_sha_capable
            row.node_overrides = [PreflightOverride(**o.model_dump()).model_dump() for o in overrides]
            if nodes is not None:
                row.preflight_nodes = nodes
            s.add(row)

    # -- VTEP addresses and host keys ----------------------------------------------------------

    async def allocations(self, node_ips: Collection[str] | None = None) -> dict[str, str]:
        """{node_ip: vtep_ip}, of every node or only of ``node_ips`` (one indexed lookup each:
        a request about one node does not read a 1,000-node fabric's rows)."""
        cols = VtepAllocationRow.__table__.c  # type: ignore[attr-defined]
        q = sa.select(cols.node_ip, cols.vtep_ip)
        if node_ips is not None:
            q = q.where(cols.node_ip.in_(list(node_ips)))
        async with self.db.session() as s:
            return {n: v for n, v in (await (await s.connection()).execute(q)).all()}

    async def any_allocated(self) -> bool:
        """Whether any node holds a VTEP address (one row read, not all)."""
        q = sa.select(VtepAllocationRow.__table__.c.node_ip).limit(1)  # type: ignore[attr-defined]
        async with self.db.session() as s:
            return (await (await s.connection()).execute(q)).first() is not None

    async def allocation_of(self, node_ip: str) -> str | None:
        """The node's VTEP address, None when it holds none."""
        return (await self.allocations([node_ip])).get(node_ip)

    async def allocate(self, node_ips: list[str]) -> dict[str, str]:
        out = {}
        for ip in node_ips:  # one transaction each: the pool lock is held briefly
            async with self.db.session() as s, s.begin():
                out[ip] = (await store.allocate(s, ip)).vtep_ip
        return out

    async def release_vtep(self, node_ip: str) -> None:
        async with self.db.session() as s, s.begin():
            with contextlib.suppress(NotFound):
                await store.release(s, node_ip)

    async def host_keys(self, node_ips: Collection[str] | None = None) -> dict[str, str]:
        """{node_ip: pinned host key}, of every node or only of ``node_ips``."""
        cols = NodeHostKeyRow.__table__.c  # type: ignore[attr-defined]
        q = sa.select(cols.node_ip, cols.host_key)
        if node_ips is not None:
            q = q.where(cols.node_ip.in_(list(node_ips)))
        async with self.db.session() as s:
            return {n: k for n, k in (await (await s.connection()).execute(q)).all()}

    async def remember_host_keys(self, keys: dict[str, str]) -> int:
        """Store first-seen keys; a node that already has one keeps it (a change is never accepted here)."""
        if not keys:
            return 0
        now = datetime.now(UTC)
        values = [{"node_ip": ip, "host_key": k, "first_seen_at": now} for ip, k in keys.items()]
        stmt = pg_insert(NodeHostKeyRow.__table__).values(values)  # type: ignore[attr-defined]
        res = await self._exec(stmt.on_conflict_do_nothing(index_elements=["node_ip"]))
        return res.rowcount or 0

    async def forget_host_key(self, node_ip: str) -> bool:
        """Drop the pinned key of `node_ip` (the node left the node set, or was reinstalled)."""
        res = await self._exec(sa.delete(NodeHostKeyRow).where(NodeHostKeyRow.node_ip == node_ip))  # type: ignore[arg-type]
        return bool(res.rowcount)

    # -- job rows ------------------------------------------------------------------------------

    async def latest_job(self) -> FabricJobView | None:
        """The newest job's summary: that column only (not the job's request, which holds every
        node's access), validated once from its JSON text."""
        q = sa.select(sa.cast(Row.summary, sa.Text)).order_by(Row.seq.desc()).limit(1)  # type: ignore[union-attr]
        async with self.db.session() as s:
            text = (await (await s.connection()).execute(q)).scalar()
        return FabricJobView.model_validate_json(text) if text is not None else None

    async def get_row(self, job_id: str) -> FabricJobRow | None:
        async with self.db.session() as s:
            q = select(Row).where(Row.job_id == job_id).execution_options(populate_existing=True)
            return (await s.exec(q)).first()

    async def check_idle(self) -> None:
        """409 ``FABRIC_JOB_RUNNING`` while any replica runs (or has queued) an apply/teardown.
        An early answer only: the writes check again under the config lock."""
        async with self.db.session() as s:
            await store.refuse_while_job_runs(s)

    async def save_job(self, summary: JobSummary) -> None:
        """Insert or update a job row that holds no lease (a job that failed before it ran)."""
        now = datetime.now(UTC)
        stmt = pg_insert(Row.__table__).values(  # type: ignore[attr-defined]
            job_id=summary.job_id,
            job_type=str(summary.job_type),
            job_status=str(summary.job_status),
            summary=_data(summary),
            created_at=now,
            updated_at=now,
        )
        set_ = {"job_status": stmt.excluded.job_status, "summary": stmt.excluded.summary, "updated_at": now}
        await self._exec(stmt.on_conflict_do_update(index_elements=["job_id"], set_=set_))

    def _insert(self, summary: JobSummary, owner: str, request: dict) -> Any:
        now = datetime.now(UTC)
        return pg_insert(Row.__table__).values(  # type: ignore[attr-defined]
            job_id=summary.job_id,
            job_type=str(summary.job_type),
            job_status=RUNNING,
            summary=_data(summary),
            created_at=now,
            updated_at=now,
            owner=owner,
            heartbeat_at=sa.func.now(),
            cancel_requested=False,
            request=request,
        )

    async def queue_job(
        self, summary: JobSummary, request: dict, then: Callable[[Any], Awaitable[None]] | None = None
    ) -> None:
        """Write the job as queued (running, no owner yet) under the config lock, so a config
        write in flight lands before it or is refused after it (409 either way for a second
        job; the partial unique index is the backstop). `then(session)` runs in the same
        transaction (the outbox row of its command: both commit or neither)."""
        try:
            async with self.db.session() as s, s.begin():
                await store.lock(s)
                await store.refuse_while_job_runs(s)
                await (await s.connection()).execute(self._insert(summary, "", request))
                if then is not None:
                    await then(s)
        except IntegrityError:
            await self.check_idle()
            raise Conflict("another fabric job is running") from None

    async def delete_config_and_queue(
        self, summary: JobSummary, request: dict, registered: set[str] | None
    ) -> tuple[DeleteResult, dict[str, str]]:
        """Delete the config (404 when none) and, when VTEPs of still-registered nodes are
        allocated, queue their teardown in the same transaction."""
        try:
            async with self.db.session() as s, s.begin():
                await store.lock(s)  # store.delete refuses while a job runs, under this lock
                rows = (await s.exec(select(VtepAllocationRow))).all()
                allocated = {
                    r.node_ip: r.vtep_ip for r in rows if registered is None or r.node_ip in registered
                }
                result = await store.delete(s)
                if allocated:
                    summary = summary.model_copy(update={"total_nodes": len(allocated)})
                    request = request | {"node_ips": sorted(allocated)}
                    await (await s.connection()).execute(self._insert(summary, "", request))
        except IntegrityError:
            await self.check_idle()
            raise Conflict("another fabric job is running") from None
        return result, allocated

    async def claim(self, job_id: str, lease_s: float) -> FabricJobRow | None:
        """Take a queued job (no owner yet) or one whose lease expired. Atomic: of several
        replicas trying at once exactly one gets the row."""
        stmt = (
            sa.update(Row)
            .where(Row.job_id == job_id, Row.job_status == RUNNING, sa.or_(Row.owner == "", _stale(lease_s)))  # type: ignore[arg-type]
            .values(owner=self.owner, heartbeat_at=sa.func.now())
            .returning(Row.job_id)  # type: ignore[arg-type]
        )
        if (await self._exec(stmt)).scalar_one_or_none() is None:
            return None
        return await self.get_row(job_id)

    async def requeue(self, job_id: str) -> None:
        """Give a claimed job back (its command is redelivered): owner cleared, lease fresh."""
        with contextlib.suppress(Exception):
            stmt = (
                sa.update(Row).where(*_held(job_id, self.owner)).values(owner="", heartbeat_at=sa.func.now())
            )
            await self._exec(stmt)

    async def heartbeat(self, job_id: str, summary: JobSummary | None = None) -> bool | None:
        """Renew this replica's lease (and store the current summary). Returns the job's
        ``cancel_requested``, or None when the lease is lost (job ended or taken over)."""
        values: dict = {"heartbeat_at": sa.func.now()}
        if summary is not None:
            values |= {"summary": _data(summary), "updated_at": datetime.now(UTC)}
        stmt = sa.update(Row).where(*_held(job_id, self.owner)).values(**values)
        res = await self._exec(stmt.returning(Row.cancel_requested))  # type: ignore[arg-type]
        return res.scalar_one_or_none()

    async def finish(self, summary: JobSummary, rollout_status: str | None = None) -> bool:
        """Store the terminal summary if this replica still holds the job (False: lease lost);
        its baselines go. ``rollout_status``: the configuration's status, set in the same
        transaction — no reader sees the job ended while the configuration still says
        ``rolling_out``."""
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            stmt = sa.update(Row).where(*_held(summary.job_id, self.owner))
            values = {"job_status": str(summary.job_status), "summary": _data(summary)}
            res = await conn.execute(stmt.values(**values, updated_at=datetime.now(UTC)))
            await conn.execute(sa.delete(NodeBaselineRow).where(NodeBaselineRow.job_id == summary.job_id))  # type: ignore[arg-type]
            if res.rowcount and rollout_status is not None:
                await _mark_rollout(s, rollout_status)
                if rollout_status in _APPLIED:  # what the nodes carry now: drift checks it while
                    await _keep_applied(s)  # a later edit is pending
        return bool(res.rowcount)

    async def release(self, job_id: str) -> None:
        """Graceful stop: drop the heartbeat so a peer takes the job over at once."""
        with contextlib.suppress(Exception):
            await self._exec(sa.update(Row).where(*_held(job_id, self.owner)).values(heartbeat_at=None))

    async def stale_jobs(self, lease_s: float) -> list[str]:
        """Running jobs nobody holds: their replica died (or stopped), or nobody picked them up."""
        waiting = Row.job_id.not_in(waiting_job_ids())  # type: ignore[attr-defined]  # its command not yet sent
        async with self.db.session() as s:
            return list(
                (
                    await s.exec(
                        select(Row.job_id).where(Row.job_status == RUNNING, _stale(lease_s), waiting)
                    )
                ).all()
            )

    async def request_cancel(self, job_id: str) -> bool:
        """Mark the running apply ``job_id`` cancelled (idempotent); False when it is not running."""
        where = (Row.job_id == job_id, Row.job_type == str(JobType.APPLY), Row.job_status == RUNNING)
        res = await self._exec(sa.update(Row).where(*where).values(cancel_requested=True))  # type: ignore[arg-type]
        return bool(res.rowcount)

    # -- node baselines (SecretBox ciphertext: their frr.conf holds the BGP password) -----------

    async def keep_baseline(self, job_id: str, node_ip: str, baseline_enc: str) -> None:
        stmt = pg_insert(NodeBaselineRow.__table__).values(  # type: ignore[attr-defined]
            job_id=job_id, node_ip=node_ip, baseline_enc=baseline_enc, recorded_at=datetime.now(UTC)
        )
        await self._exec(stmt.on_conflict_do_nothing(index_elements=["job_id", "node_ip"]))  # first = real

    async def baselines(self, job_id: str) -> dict[str, str]:
        async with self.db.session() as s:
            rows = (await s.exec(select(NodeBaselineRow).where(NodeBaselineRow.job_id == job_id))).all()
        return {r.node_ip: r.baseline_enc for r in rows}

    # -- drift detection: one replica per round (a lease on the drift_round row) --------------

    async def claim_drift_round(self, interval_s: float) -> bool:
        """True when this replica runs the next drift round: the row's ``started_at`` is older
        than `interval_s` (database clock) and our UPDATE moved it first."""
        cutoff = sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, 0, interval_s)
        started = DriftRoundRow.started_at
        stmt = (
            sa.update(DriftRoundRow)
            .where(DriftRoundRow.id == 1, sa.or_(started.is_(None), started <= cutoff))  # type: ignore[union-attr,operator]
            .values(owner=self.owner, started_at=sa.func.now())
        )
        return bool((await self._exec(stmt)).rowcount)

    async def finish_drift_round(self) -> None:
        stmt = (
            sa.update(DriftRoundRow)
            .where(DriftRoundRow.id == 1, DriftRoundRow.owner == self.owner)  # type: ignore[arg-type]
            .values(finished_at=sa.func.now())
        )
        await self._exec(stmt)

    async def drift_round(self) -> DriftRoundRow | None:
        async with self.db.session() as s:
            return await s.get(DriftRoundRow, 1)

    async def drift_rows(self, node_ip: str = "") -> list[NodeDriftRow]:
        stmt = select(NodeDriftRow).order_by(NodeDriftRow.node_ip)
        if node_ip:
            stmt = stmt.where(NodeDriftRow.node_ip == node_ip)
        async with self.db.session() as s:
            return list((await s.exec(stmt)).all())

    async def store_drift(self, row: NodeDriftRow) -> bool:
        """Upsert one node's check; True when its drift state changed: drifted flipped, or the
        kinds of its findings changed (or it is new and drifted). ``since`` moves on a flip only."""
        kinds = sorted(f["kind"] for f in row.findings)
        async with self.db.session() as s, s.begin():
            old = await s.get(NodeDriftRow, row.node_ip, with_for_update=True)
            if old is None:
                changed = row.drifted
            else:
                changed = old.drifted != row.drifted or sorted(f["kind"] for f in old.findings) != kinds
                if old.drifted == row.drifted:
                    row.since = old.since
            await s.merge(row)
        return changed

    async def forget_drift(self, keep: list[str]) -> None:
        """Drop the rows of nodes no longer registered."""
        await self._exec(sa.delete(NodeDriftRow).where(NodeDriftRow.node_ip.not_in(keep)))  # type: ignore[attr-defined]

    async def applied_config(self) -> FabricConfigRow | None:
        """The configuration the last apply gave the nodes (None: never applied, or deleted)."""
        async with self.db.session() as s:
            row = await s.get(AppliedConfigRow, 1)
        return FabricConfigRow(**row.config) if row is not None else None

    async def keep_applied(self) -> None:
        """Record the stored configuration as the applied one (a deployment older than 0007)."""
        async with self.db.session() as s, s.begin():
            await _keep_applied(s)

    async def forget_applied(self) -> None:
        await self._exec(sa.delete(AppliedConfigRow))


_APPLIED = ("ready", "degraded")
_NOT_APPLIED_FIELDS = {"id", "rollout_status", "created_at", "updated_at"}


async def _keep_applied(s: Any) -> None:
    """Copy the config row into ``applied_config`` inside the caller's transaction."""
    row = await store.load(s)
    if row is None:
        return
    config = row.model_dump(mode="json", exclude=_NOT_APPLIED_FIELDS)
    values = {"id": 1, "config": config, "applied_at": datetime.now(UTC)}
    stmt = pg_insert(AppliedConfigRow.__table__).values(**values)  # type: ignore[attr-defined]
    set_ = {"config": stmt.excluded.config, "applied_at": stmt.excluded.applied_at}
    await (await s.connection()).execute(stmt.on_conflict_do_update(index_elements=["id"], set_=set_))


async def _mark_rollout(s: Any, status: str) -> None:
    """The configuration's rollout status, inside the caller's transaction."""
    row = await store.load(s, for_update=True)
    if row is not None:  # deleted meanwhile: nothing to mark
        row.rollout_status = status
        s.add(row)
