"""Worker leases live in ``provision.job_leases`` (migration 0011), not in the job row: the
heartbeat renews every job a replica works every ``lease_seconds / 3`` — at a 3,000-host storm
that left 56,530 dead job-row versions (18.8 KiB of table per host), growing with the queue's
wait. Shown on the real database: a renewal writes no job row, a job another replica took is
reported lost, a claim takes only expired or handed-back leases, and the migration carries the
leases of existing jobs over (and back)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import karios.provisioner
from karios.common.db import Database
from karios.common.db.migrate import alembic_config, upgrade
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.jobs.repository import JobRepository, now
from karios.provisioner.statemachine import State

pytestmark = pytest.mark.integration

MIGRATIONS = Path(karios.provisioner.__file__).parent / "migrations"


async def _rows(url: str, stmt: str, **params: object) -> list[dict]:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as c:
            res = await c.execute(sa.text(stmt), params)
            return [dict(r._mapping) for r in res] if res.returns_rows else []
    finally:
        await engine.dispose()


def _job(job_id: str, i: int) -> dict:
    return {
        "id": job_id,
        "bmc_ip": f"10.96.0.{i + 1}",
        "vendor": "dell",
        "spec": {"pad": "x" * 900},  # a job row is wide (its spec): what a renewal no longer copies
        "created_at": now(),
        "updated_at": now(),
    }


@pytest.fixture
async def repos(settings):
    await asyncio.to_thread(upgrade, MIGRATIONS, settings.database_url, "provision")
    cfg = ProvisionerConfig(lease_seconds=30)
    a = JobRepository(Database(settings.database_url), cfg, "replica-a")
    b = JobRepository(Database(settings.database_url), cfg, "replica-b")
    try:
        yield a, b
    finally:
        await a.db.close()
        await b.db.close()


async def test_a_heartbeat_renews_leases_without_rewriting_job_rows(repos, settings):
    a, _b = repos
    ids = [f"lease-renew-{i}" for i in range(3)]
    for i, job_id in enumerate(ids):
        assert (await a.insert({**_job(job_id, i), "owner": a.replica}))[0]
    url = settings.database_url
    ask = (
        "SELECT j.id, j.xmin::text AS version, l.lease_until FROM provision.jobs j "
        "JOIN provision.job_leases l ON l.job_id = j.id WHERE j.id LIKE 'lease-renew-%' ORDER BY j.id"
    )
    before = await _rows(url, ask)
    assert [r["id"] for r in before] == ids  # every new job holds a lease
    await asyncio.sleep(0.05)
    assert await a.renew(ids) == []
    after = await _rows(url, ask)
    assert [r["version"] for r in after] == [r["version"] for r in before]  # no job row written
    assert all(n["lease_until"] > o["lease_until"] for n, o in zip(after, before, strict=True))

    # Another replica took the first job: the next heartbeat reports it lost and leaves its lease.
    await _rows(url, "UPDATE provision.jobs SET owner = 'replica-b' WHERE id = :id", id=ids[0])
    taken = (await _rows(url, ask))[0]["lease_until"]
    assert await a.renew(ids) == [ids[0]]
    assert (await _rows(url, ask))[0]["lease_until"] == taken


async def test_a_claim_takes_expired_and_handed_back_leases_only(repos, settings):
    a, b = repos
    url = settings.database_url
    ids = [f"lease-claim-{i}" for i in range(3)]
    for i, job_id in enumerate(ids):
        assert (await a.insert({**_job(job_id, 10 + i), "owner": a.replica}))[0]
    await _rows(
        url,
        "UPDATE provision.job_leases SET lease_until = now() - interval '1 s' WHERE job_id = :id",
        id=ids[0],
    )
    mine = [j for j, _ in await b.claim_expired(limit=10) if j.startswith("lease-claim-")]
    assert mine == [ids[0]]  # the live leases stay with replica-a
    # A graceful stop hands every lease back: claimable at once, no expiry to wait for.
    await a.release_leases()
    mine = sorted(j for j, _ in await b.claim_expired(limit=10) if j.startswith("lease-claim-"))
    assert mine == ids[1:]
    owners = await _rows(
        url, "SELECT owner, attempts FROM provision.jobs WHERE id LIKE 'lease-claim-%' ORDER BY id"
    )
    assert [o["owner"] for o in owners] == ["replica-b"] * 3
    # The claim leased them to replica-b: its heartbeat keeps them, replica-a's does not.
    assert await b.renew(ids) == [] and sorted(await a.renew(ids)) == ids

    # Past the worker phase a job has no lease (nothing left to claim).
    await b.move(ids[0], State.failed, "given up", percent=None, owned=True, values={})
    left = await _rows(
        url, "SELECT job_id FROM provision.job_leases WHERE job_id LIKE 'lease-claim-%' ORDER BY 1"
    )
    assert [r["job_id"] for r in left] == ids[1:]


async def test_the_migration_carries_leases_over_and_back(pg_admin_url):
    """0010 → 0011 → 0010 on a database with jobs in each kind of state."""
    name = "karios_test_leases_migration"
    admin = create_async_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as c:
        await c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        await c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = str(sa.engine.make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False))
    try:
        await asyncio.to_thread(upgrade, MIGRATIONS, url, "provision", "0010")
        await _rows(
            url,
            "INSERT INTO provision.jobs (id, job_type, bmc_ip, state, spec, created_at, updated_at, "
            "lease_until) VALUES "
            "('m-leased', 'provision', '10.95.0.1', 'queued', '{}', now(), now(), '2030-01-01T00:00:00Z'), "
            "('m-handed-back', 'provision', '10.95.0.2', 'mounting', '{}', now(), now(), NULL), "
            "('m-booting', 'provision', '10.95.0.3', 'booting', '{}', now(), now(), NULL)",
        )
        await asyncio.to_thread(upgrade, MIGRATIONS, url, "provision")
        leases = await _rows(
            url, "SELECT job_id, lease_until::text AS until FROM provision.job_leases ORDER BY 1"
        )
        assert [(r["job_id"], r["until"][:10]) for r in leases] == [
            ("m-handed-back", "-infinity"),
            ("m-leased", "2030-01-01"),
        ]
        cols = await _rows(
            url,
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'provision' AND table_name = 'jobs'",
        )
        assert "lease_until" not in {r["column_name"] for r in cols}

        from alembic import command

        await asyncio.to_thread(command.downgrade, alembic_config(MIGRATIONS, url, "provision"), "0010")
        back = await _rows(url, "SELECT id, lease_until FROM provision.jobs ORDER BY id")
        assert {r["id"]: r["lease_until"] is None for r in back} == {
            "m-booting": True,
            "m-handed-back": True,
            "m-leased": False,
        }
    finally:
        async with admin.connect() as c:
            await c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()
