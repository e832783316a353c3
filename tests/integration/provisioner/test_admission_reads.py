"""Admission's reads on the real database (migration 0012) give what the whole queue would:
each vendor's oldest waiting jobs (a skip scan over the vendors, then each vendor's first rows
of ``ix_jobs_waiting``) equal :func:`oldest_per_vendor` over every queued row, and the admitted
counts equal a count of every admitted worker-phase row — for random queues (vendors, ties in
``created_at``, admitted and ended jobs mixed in)."""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

import karios.provisioner
from karios.common.db.migrate import upgrade
from karios.provisioner.jobs.admission import Waiting, oldest_per_vendor
from karios.provisioner.jobs.repository import _OLDEST_PER_VENDOR, _admission_rows
from karios.provisioner.jobs.repository import T as JOBS

pytestmark = pytest.mark.integration

MIGRATIONS = Path(karios.provisioner.__file__).parent / "migrations"
VENDORS = ("dell", "hpe", "supermicro", "", "lenovo")
STATES = ("queued", "queued", "queued", "building_media", "mounting", "booting", "completed", "failed")


def _queue(rng: random.Random, n: int) -> list[dict]:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(n):
        state = rng.choice(STATES)
        admitted = state in ("building_media", "mounting") or (state == "queued" and rng.random() < 0.2)
        rows.append(
            {
                "id": f"adm-{i:04d}-{rng.randrange(10**6):06d}",
                "bmc_ip": f"10.94.{i // 250}.{i % 250 + 1}",
                "vendor": rng.choice(VENDORS[: rng.randint(1, len(VENDORS))]),
                "state": state,
                # few distinct times: ties are ordered by id, as in the whole-queue read
                "created_at": t0 + timedelta(seconds=rng.randrange(max(1, n // 3))),
                "admitted_at": t0 if admitted else None,
            }
        )
    return rows


async def test_each_vendors_oldest_and_the_admitted_counts_equal_the_whole_queue_reads(settings):
    await asyncio.to_thread(upgrade, MIGRATIONS, settings.database_url, "provision")
    engine = create_async_engine(settings.database_url)
    rng = random.Random(20261206)
    try:
        for case in range(30):
            rows = _queue(rng, rng.choice((0, 1, 7, 40, 300)))
            n = rng.choice((1, 2, 3, 8, 32))
            async with engine.connect() as conn:
                tx = await conn.begin()
                s = AsyncSession(bind=conn)
                if rows:
                    await conn.execute(JOBS.insert(), rows)
                active, candidates = await _admission_rows(s, n)
                whole_active, whole = await _admission_rows(s)  # the unbounded read: every queued row
                await tx.rollback()
            queued = sorted(
                (r for r in rows if r["state"] == "queued" and r["admitted_at"] is None),
                key=lambda r: (r["created_at"], r["id"]),
            )
            assert whole == [Waiting(r["id"], r["vendor"]) for r in queued], case
            assert candidates == oldest_per_vendor(whole, n), case
            admitted = Counter(
                r["vendor"]
                for r in rows
                if r["admitted_at"] is not None and r["state"] in ("queued", "building_media", "mounting")
            )
            assert active == dict(admitted) == whole_active, case
    finally:
        await engine.dispose()


async def test_a_round_reads_the_same_rows_whatever_the_queue_length(settings):
    """The point of the indexes: the rows a round reads do not grow with the queue (EXPLAIN
    ANALYZE's row counts of the candidates query, 200 vs 4,000 queued jobs of 4 vendors)."""
    await asyncio.to_thread(upgrade, MIGRATIONS, settings.database_url, "provision")
    engine = create_async_engine(settings.database_url)
    read: list[int] = []
    try:
        for n in (200, 4000):
            t0 = datetime(2026, 1, 1, tzinfo=UTC)
            rows = [
                {
                    "id": f"len-{n}-{i:05d}",
                    "bmc_ip": f"10.93.{i // 250}.{i % 250 + 1}",
                    "vendor": VENDORS[i % 4],
                    "state": "queued",
                    "created_at": t0 + timedelta(milliseconds=i),
                }
                for i in range(n)
            ]
            async with engine.connect() as conn:
                tx = await conn.begin()
                await conn.execute(JOBS.insert(), rows)
                await conn.execute(sa.text("ANALYZE provision.jobs"))
                plan = "\n".join(
                    r[0]
                    for r in await conn.execute(
                        sa.text("EXPLAIN (ANALYZE, FORMAT TEXT) " + _OLDEST_PER_VENDOR.text), {"n": 32}
                    )
                )
                await tx.rollback()
            assert "ix_jobs_waiting" in plan, plan
            # every "actual ... rows=R loops=L" of the plan: rows handled in all
            read.append(
                sum(int(r) * int(lp) for r, lp in re.findall(r"actual time=\S+ rows=(\d+) loops=(\d+)", plan))
            )
        assert read[1] <= read[0] * 1.5, read  # not 20 times more for 20 times the queue
    finally:
        await engine.dispose()
