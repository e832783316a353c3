"""PostgreSQL adapter of the rollout: job summaries, first-seen host keys, and the rollout
fields of the config row (status, preflight results). VTEP allocations go through
:mod:`karios.fabric_worker.store` (one pool, one lock)."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.contracts.fabric import FabricJobView, PreflightOverride
from karios.fabric_worker import store
from karios.fabric_worker.models import FabricJobRow, NodeHostKeyRow, VtepAllocationRow
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
