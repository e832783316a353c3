"""The gateway's read model applies a fetch's events in one transaction (``apply_many``): it must
leave exactly what applying them one by one leaves (``apply_progress``, the rules of
``test_projector_order.py``) — for any order the replicas hand them over in, with redeliveries,
events of one job side by side in a batch, jobs the POST did or did not write yet, and jobs the
gateway already ended. 30 random deliveries, each applied both ways on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import col, select

import karios.api_gateway
from karios.api_gateway.readmodel import Delivered, JobRow, ProvisionProgress, apply_many, apply_progress
from karios.common.contracts.provision import JobProgress
from karios.common.db import Database
from karios.common.db.migrate import upgrade

pytestmark = pytest.mark.integration
MIGRATIONS = Path(karios.api_gateway.__file__).parent / "migrations"
STATES = [("queued", "Queued", 0), ("building_media", "Building ISO", 10), ("mounting", "Mounting ISO", 30)]
STATES += [("booting", "Booting", 60), ("installing", "Installing OS", 80), ("completed", "Completed", 100)]


@pytest.fixture
async def db(settings) -> AsyncIterator[Database]:
    await asyncio.to_thread(upgrade, MIGRATIONS, settings.database_url, "gateway")
    db = Database(settings.database_url)
    yield db
    await db.close()


def scenario(rng: random.Random, tag: str) -> tuple[list[JobRow], list[Delivered]]:
    """Jobs and the deliveries of their events (ids carry ``tag``: each way has its own rows)."""
    t0, seq = datetime(2026, 12, 6, tzinfo=UTC), 1000
    rows: list[JobRow] = []
    stream: list[Delivered] = []
    for j in range(rng.randint(1, 4)):
        job = f"{tag}-job{j}"
        ended = rng.random() < 0.2  # the gateway ended it (never reached a provisioner)
        if ended or rng.random() < 0.7:  # the POST wrote the row before the first event came
            rows.append(JobRow(id=job, bmc_ip=f"10.94.0.{j}", job_status="failed" if ended else "queued"))
        for k in range(rng.randint(1, len(STATES))):
            state, stage, pct = STATES[k]
            seq += rng.randint(1, 3)
            ev = JobProgress(
                job_id=job,
                bmc_ip=f"10.94.0.{j}",
                job_type="provision",
                state=state,
                status="completed" if state == "completed" else "running",
                stage=stage,
                percent=pct,
                message=f"{stage} ({k})",
                node_ip="10.94.1.1" if k >= 4 else "",
                log_tail=[f"line {k}"] if k % 2 else [],
            )
            stream.append(Delivered(f"{tag}-m{seq}", ev, seq, t0 + timedelta(seconds=seq)))
    delivered = list(stream)
    for _ in range(rng.randint(0, 4)):  # redeliveries (an unacked fetch of a replica that died)
        delivered.insert(rng.randint(0, len(delivered)), rng.choice(stream))
    for _ in range(rng.randint(0, 3)):  # replicas' batches interleave: a few events arrive late
        i, k = rng.randrange(len(delivered)), rng.randrange(len(delivered))
        delivered.insert(k, delivered.pop(i))
    return rows, delivered


def retag(d: Delivered, tag: str, other: str) -> Delivered:
    ev = d.event.model_copy(update={"job_id": d.event.job_id.replace(other, tag, 1)})
    return Delivered(d.message_id.replace(other, tag, 1), ev, d.seq, d.sent)


async def shown(db: Database, tag: str) -> tuple[list[tuple], list[tuple]]:
    def strip(v: str) -> str:
        return v.split("-", 1)[1]

    async with db.session() as s:
        jobs = (
            await s.exec(select(JobRow).where(col(JobRow.id).startswith(f"{tag}-")).order_by(JobRow.id))
        ).all()
        hist = (
            await s.exec(
                select(ProvisionProgress)
                .where(col(ProvisionProgress.job_id).startswith(f"{tag}-"))
                .order_by(ProvisionProgress.id)
            )
        ).all()
    return (
        [
            (strip(j.id), j.job_status, j.status, j.progress, j.message, j.node_ip, j.log_tail, j.event_seq)
            for j in jobs
        ],
        [(strip(p.job_id), p.stage, p.percent_complete, p.status) for p in hist],
    )


async def test_a_fetch_applied_at_once_leaves_what_one_by_one_leaves(db):
    batched_any = False
    for n in range(30):
        rng = random.Random(n)
        one, many = f"s{n}one", f"s{n}many"
        rows, delivered = scenario(rng, one)
        async with db.session() as s, s.begin():
            for r in rows:
                s.add(JobRow(**r.model_dump()))
                s.add(JobRow(**{**r.model_dump(), "id": r.id.replace(one, many, 1)}))
        singly = [await apply_progress(db, d.message_id, d.event, d.seq, d.sent) for d in delivered]
        together: list[bool] = []
        rest = [retag(d, many, one) for d in delivered]
        while rest:  # fetches of random sizes, as a replica pulls them
            size = rng.randint(1, 8)
            batch, rest = rest[:size], rest[size:]
            batched_any |= len({d.event.job_id for d in batch}) < len(batch)
            together += await apply_many(db, batch)
        assert together == singly, n
        assert await shown(db, many) == await shown(db, one), n
    assert batched_any  # some batch held several events of one job
