"""PostgreSQL adapter of the rollout: job summaries, first-seen host keys, and the rollout
fields of the config row (status, preflight results). VTEP allocations go through
:mod:`karios.fabric_worker.store` (one pool, one lock).

Jobs across replicas (migration 0003): the job row is the source of truth. A running row has a
lease (``owner`` + ``heartbeat_at``, compared with the database clock); a partial unique index
lets only one job run at a time; ``cancel_requested`` is the durable half of a cancel; each
node's baseline is kept encrypted in ``node_baselines`` until the job ends."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.contracts.fabric import FabricJobView, PreflightOverride
from karios.fabric_worker import store
from karios.fabric_worker.models import (
    FabricJobRow,
    NodeBaselineRow,
    NodeHostKeyRow,
    VtepAllocationRow,
)
from karios.fabric_worker.rollout.summary import JobSummary


def job_view(summary: JobSummary) -> FabricJobView:
    return FabricJobView.model_validate(summary.model_dump(mode="json"))


async def save_job(session: AsyncSession, summary: JobSummary) -> None:
    """Insert or update the job's row with its current summary."""
    now = datetime.now(UTC)
    data = job_view(summary).model_dump(mode="json")
    stmt = pg_insert(FabricJobRow.__table__).values(  # type: ignore[attr-defined]
        job_id=summary.job_id,
        job_type=str(summary.job_type),
        job_status=str(summary.job_status),
        summary=data,
        created_at=now,
        updated_at=now,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id"],
        set_={"job_status": stmt.excluded.job_status, "summary": stmt.excluded.summary, "updated_at": now},
    )
    await (await session.connection()).execute(stmt)


async def get_job(session: AsyncSession, job_id: str) -> FabricJobView | None:
    row = await session.get(FabricJobRow, job_id)
    return FabricJobView.model_validate(row.summary) if row is not None else None


async def latest_job(session: AsyncSession) -> FabricJobView | None:
    row = (await session.exec(select(FabricJobRow).order_by(FabricJobRow.seq.desc()).limit(1))).first()  # type: ignore[union-attr]
    return FabricJobView.model_validate(row.summary) if row is not None else None


async def host_keys(session: AsyncSession) -> dict[str, str]:
    rows = (await session.exec(select(NodeHostKeyRow))).all()
    return {r.node_ip: r.host_key for r in rows}


async def remember_host_keys(session: AsyncSession, keys: dict[str, str]) -> int:
    """Store first-seen keys; a node that already has one keeps it (a change is never accepted here)."""
    if not keys:
        return 0
    now = datetime.now(UTC)
    stmt = (
        pg_insert(NodeHostKeyRow.__table__)  # type: ignore[attr-defined]
        .values([{"node_ip": ip, "host_key": k, "first_seen_at": now} for ip, k in keys.items()])
        .on_conflict_do_nothing(index_elements=["node_ip"])
    )
    res = await (await session.connection()).execute(stmt)
    return res.rowcount or 0


async def allocations(session: AsyncSession) -> dict[str, str]:
    rows = (await session.exec(select(VtepAllocationRow))).all()
    return {r.node_ip: r.vtep_ip for r in rows}


async def set_rollout_status(session: AsyncSession, status: str) -> bool:
    """False when no config is stored (deleted meanwhile)."""
    row = await store.load(session, for_update=True)
    if row is None:
        return False
    row.rollout_status = status
    session.add(row)
    return True


async def store_preflight(
    session: AsyncSession,
    *,
    underlay_cidr: str,
    underlay_mtu: int,
    hmac_sha_capable: bool | None,
    overrides: list[PreflightOverride],
) -> bool:
    """Keep what preflight learned on the config row (the MTU/HMAC rules read it on the next POST)."""
    row = await store.load(session, for_update=True)
    if row is None:
        return False
    row.underlay_cidr = underlay_cidr
    row.underlay_mtu = underlay_mtu
    if hmac_sha_capable is not None:  # no node probed: keep what an earlier preflight found
        row.frr_hmac_sha_capable = hmac_sha_capable
    row.node_overrides = [o.model_dump() for o in overrides]
    session.add(row)
    return True


async def lock(session: AsyncSession) -> None:
    await (await session.connection()).execute(
        sa.text("SELECT pg_advisory_xact_lock(hashtext('karios.fabric.config'))")
    )


# -- jobs across replicas -------------------------------------------------------------------

RUNNING = "running"


def _stale(lease_s: float) -> sa.ColumnElement[bool]:
    cutoff = sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, 0, lease_s)
    return sa.or_(FabricJobRow.heartbeat_at.is_(None), FabricJobRow.heartbeat_at < cutoff)  # type: ignore[union-attr,operator]


async def start_job(
    session: AsyncSession, summary: JobSummary, *, owner: str, request: dict, heartbeat: bool = True
) -> None:
    """Insert the job as running under ``owner``'s lease. The partial unique index raises
    IntegrityError when another job runs (the caller turns it into a 409)."""
    now = datetime.now(UTC)
    stmt = pg_insert(FabricJobRow.__table__).values(  # type: ignore[attr-defined]
        job_id=summary.job_id,
        job_type=str(summary.job_type),
        job_status=RUNNING,
        summary=job_view(summary).model_dump(mode="json"),
        created_at=now,
        updated_at=now,
        owner=owner,
        heartbeat_at=sa.func.now() if heartbeat else None,
        cancel_requested=False,
        request=request,
    )
    await (await session.connection()).execute(stmt)


async def get_row(session: AsyncSession, job_id: str) -> FabricJobRow | None:
    q = select(FabricJobRow).where(FabricJobRow.job_id == job_id).execution_options(populate_existing=True)
    return (await session.exec(q)).first()


async def running_row(session: AsyncSession) -> FabricJobRow | None:
    return (await session.exec(select(FabricJobRow).where(FabricJobRow.job_status == RUNNING))).first()


async def heartbeat(
    session: AsyncSession, job_id: str, owner: str, summary: JobSummary | None = None
) -> bool | None:
    """Renew ``owner``'s lease (and store the current summary). Returns the job's
    ``cancel_requested``, or None when the lease is lost (job ended or taken over)."""
    values: dict = {"heartbeat_at": sa.func.now()}
    if summary is not None:
        values |= {"summary": job_view(summary).model_dump(mode="json"), "updated_at": datetime.now(UTC)}
    stmt = (
        sa.update(FabricJobRow)
        .where(FabricJobRow.job_id == job_id, FabricJobRow.owner == owner, FabricJobRow.job_status == RUNNING)  # type: ignore[arg-type]
        .values(**values)
        .returning(FabricJobRow.cancel_requested)  # type: ignore[arg-type]
    )
    res = await (await session.connection()).execute(stmt)
    return res.scalar_one_or_none()


async def finish_job(session: AsyncSession, summary: JobSummary, owner: str) -> bool:
    """Store the terminal summary if ``owner`` still holds the job (False: lease lost)."""
    stmt = (
        sa.update(FabricJobRow)
        .where(
            FabricJobRow.job_id == summary.job_id,  # type: ignore[arg-type]
            FabricJobRow.owner == owner,  # type: ignore[arg-type]
            FabricJobRow.job_status == RUNNING,  # type: ignore[arg-type]
        )
        .values(
            job_status=str(summary.job_status),
            summary=job_view(summary).model_dump(mode="json"),
            updated_at=datetime.now(UTC),
        )
    )
    res = await (await session.connection()).execute(stmt)
    return bool(res.rowcount)


async def release_lease(session: AsyncSession, job_id: str, owner: str) -> None:
    """Graceful stop: drop the heartbeat so a peer takes the job over at once."""
    await (await session.connection()).execute(
        sa.update(FabricJobRow)
        .where(FabricJobRow.job_id == job_id, FabricJobRow.owner == owner, FabricJobRow.job_status == RUNNING)  # type: ignore[arg-type]
        .values(heartbeat_at=None)
    )


async def claim(session: AsyncSession, job_id: str, owner: str, lease_s: float) -> FabricJobRow | None:
    """Take over a running job whose lease expired, or a queued one (no owner yet). Atomic:
    of several replicas trying at once exactly one gets the row."""
    stmt = (
        sa.update(FabricJobRow)
        .where(
            FabricJobRow.job_id == job_id,  # type: ignore[arg-type]
            FabricJobRow.job_status == RUNNING,  # type: ignore[arg-type]
            sa.or_(FabricJobRow.owner == "", _stale(lease_s)),  # type: ignore[arg-type]
        )
        .values(owner=owner, heartbeat_at=sa.func.now())
        .returning(FabricJobRow.job_id)  # type: ignore[arg-type]
    )
    res = await (await session.connection()).execute(stmt)
    if res.scalar_one_or_none() is None:
        return None
    return await get_row(session, job_id)


async def stale_jobs(session: AsyncSession, lease_s: float) -> list[str]:
    """Running jobs nobody holds: their replica died (or stopped), or nobody picked them up."""
    q = select(FabricJobRow.job_id).where(FabricJobRow.job_status == RUNNING, _stale(lease_s))
    return list((await session.exec(q)).all())


async def request_cancel(session: AsyncSession, job_id: str) -> bool:
    """Mark the running apply ``job_id`` cancelled (idempotent); False when it is not running."""
    stmt = (
        sa.update(FabricJobRow)
        .where(
            FabricJobRow.job_id == job_id,  # type: ignore[arg-type]
            FabricJobRow.job_type == "fabric_apply",  # type: ignore[arg-type]
            FabricJobRow.job_status == RUNNING,  # type: ignore[arg-type]
        )
        .values(cancel_requested=True)
    )
    res = await (await session.connection()).execute(stmt)
    return bool(res.rowcount)


async def keep_baseline(session: AsyncSession, job_id: str, node_ip: str, baseline_enc: str) -> None:
    stmt = pg_insert(NodeBaselineRow.__table__).values(  # type: ignore[attr-defined]
        job_id=job_id, node_ip=node_ip, baseline_enc=baseline_enc, recorded_at=datetime.now(UTC)
    )
    stmt = stmt.on_conflict_do_nothing(index_elements=["job_id", "node_ip"])  # first = the real baseline
    await (await session.connection()).execute(stmt)


async def baselines(session: AsyncSession, job_id: str) -> dict[str, str]:
    rows = (await session.exec(select(NodeBaselineRow).where(NodeBaselineRow.job_id == job_id))).all()
    return {r.node_ip: r.baseline_enc for r in rows}


async def drop_baselines(session: AsyncSession, job_id: str) -> None:
    await (await session.connection()).execute(
        sa.delete(NodeBaselineRow).where(NodeBaselineRow.job_id == job_id)  # type: ignore[arg-type]
    )
