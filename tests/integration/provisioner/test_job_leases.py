"""Worker leases live in ``provision.job_leases`` (migration 0011), not in the job row: the
heartbeat renews every job a replica works every ``lease_seconds / 3`` — at a 3,000-host storm
that left 56,530 dead job-row versions (18.8 KiB of table per host), growing with the queue's
wait. Shown on the real database: a renewal writes no job row, a job another replica took is
reported lost, a claim takes only expired or handed-back leases, the migration carries the
leases of existing jobs over (and back), and the three interleavings of a heartbeat and another
replica's sweep end with one owner (each fails if its lock is taken out of the repository: the
sweep's lock of the lease row, the heartbeat's share lock of the job row, ``SKIP LOCKED``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

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


async def _expired(url: str, job_id: str) -> None:
    await _rows(
        url,
        "UPDATE provision.job_leases SET lease_until = now() - interval '1 s' WHERE job_id = :id",
        id=job_id,
    )


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
    await _expired(url, ids[0])
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


# -- the renewal/claim race, interleaved on the real database ------------------------------
# Each test pauses one replica's transaction at a chosen point with a test-only trigger that
# waits on an advisory lock the test holds, lets the other replica run into it, then releases.
# The repository code runs unchanged; the database decides who waits and what is re-checked.


class _Pause:
    """A statement trigger on ``table`` (``timing``: ``BEFORE UPDATE`` or ``AFTER UPDATE``) that
    blocks its transaction until :meth:`release`; :meth:`waiting` names what our database's
    backends wait on."""

    def __init__(self, url: str, table: str, timing: str) -> None:
        self.url, self.table, self.timing = url, table, timing
        self.key = int.from_bytes(os.urandom(4), "big")  # advisory locks are cluster-wide
        self.engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
        self.holder: Any = None

    async def __aenter__(self) -> _Pause:
        self.holder = await self.engine.connect()
        await self.holder.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": self.key})
        await self.holder.execute(
            sa.text(
                "CREATE OR REPLACE FUNCTION provision.test_pause() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN PERFORM pg_advisory_xact_lock_shared({self.key}); RETURN NULL; END $$"
            )
        )
        await self.holder.execute(
            sa.text(
                f"CREATE TRIGGER test_pause {self.timing} ON {self.table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION provision.test_pause()"
            )
        )
        return self

    async def waiting(self) -> list[str]:
        async with self.engine.connect() as c:
            res = await c.execute(
                sa.text(
                    "SELECT wait_event FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )
            )
            return sorted(r[0] for r in res)

    async def until(self, *events: str, timeout: float = 20.0) -> None:
        for _ in range(int(timeout / 0.02)):
            if await self.waiting() == sorted(events):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"backends wait on {await self.waiting()}, expected {sorted(events)}")

    async def release(self) -> None:
        # (The trigger stays until the end: dropping it waits for the paused transaction.)
        await self.holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})

    async def __aexit__(self, *exc: object) -> None:
        await self.holder.execute(sa.text(f"DROP TRIGGER IF EXISTS test_pause ON {self.table}"))
        await self.holder.execute(sa.text("DROP FUNCTION IF EXISTS provision.test_pause()"))
        await self.holder.execute(sa.text("SELECT pg_advisory_unlock_all()"))
        await self.holder.close()
        await self.engine.dispose()


async def _expired_job(repo: JobRepository, url: str, job_id: str, i: int) -> None:
    """A job ``repo`` owns whose lease has just expired (what a sweep may take)."""
    assert (await repo.insert({**_job(job_id, i), "owner": repo.replica}))[0]
    await _expired(url, job_id)


async def _lease_writer(url: str, job_id: str) -> dict:
    """Who wrote the job's row and its lease row last (transaction ids), and the owner."""
    (row,) = await _rows(
        url,
        "SELECT j.owner, j.xmin::text AS job_tx, l.xmin::text AS lease_tx FROM provision.jobs j "
        "JOIN provision.job_leases l ON l.job_id = j.id WHERE j.id = :id",
        id=job_id,
    )
    return row


async def test_a_renewal_committed_after_a_claims_snapshot_keeps_the_job(repos, settings):
    """Replica-b's sweep reads the lease expired (its statement's snapshot), then replica-a's
    heartbeat renews it and commits, then the sweep locks the rows: the lease row changed, the
    sweep re-checks it renewed and takes nothing — one owner, the machine reset once."""
    a, b = repos
    url, job_id = settings.database_url, "race-snapshot"
    await _expired_job(a, url, job_id, 40)
    # The pause fires when the claim's UPDATE starts: after its snapshot, before any row is locked.
    async with _Pause(url, "provision.jobs", "BEFORE UPDATE") as pause:
        claim = asyncio.create_task(b.claim_expired(limit=10))
        await pause.until("advisory")
        assert await a.renew([job_id]) == []  # the heartbeat is not held up by the sweep
        await pause.release()
        taken = [j for j, _ in await asyncio.wait_for(claim, 20)]
    assert job_id not in taken
    after = await _lease_writer(url, job_id)
    assert after["owner"] == a.replica
    assert await a.renew([job_id]) == []  # still replica-a's
    assert await b.renew([job_id]) == [job_id]  # and never replica-b's


async def test_a_claim_in_flight_makes_the_renewal_report_the_job_lost(repos, settings):
    """Replica-b's sweep has taken the job (its row locked, not yet committed) when replica-a's
    heartbeat comes: the heartbeat waits for it, sees the new owner, reports the job lost and
    leaves the lease the sweep wrote."""
    a, b = repos
    url, job_id = settings.database_url, "race-in-flight"
    await _expired_job(a, url, job_id, 41)
    # The pause fires after the claim's UPDATE of the job row, holding its locks.
    async with _Pause(url, "provision.jobs", "AFTER UPDATE") as pause:
        claim = asyncio.create_task(b.claim_expired(limit=10))
        await pause.until("advisory")
        renewal = asyncio.create_task(a.renew([job_id]))
        await pause.until("advisory", "transactionid")  # the heartbeat waits on the sweep
        await pause.release()
        taken = [j for j, _ in await asyncio.wait_for(claim, 20)]
        lost = await asyncio.wait_for(renewal, 20)
    assert taken == [job_id] and lost == [job_id]
    after = await _lease_writer(url, job_id)
    assert after["owner"] == b.replica
    assert after["lease_tx"] == after["job_tx"]  # the sweep's transaction wrote both; no renewal since


async def test_a_renewal_in_flight_makes_the_sweep_skip_the_job(repos, settings):
    """Replica-a's heartbeat holds the job (share lock, lease being renewed) when replica-b's
    sweep comes: the sweep skips the row rather than wait, and the job stays replica-a's."""
    a, b = repos
    url, job_id = settings.database_url, "race-renewing"
    await _expired_job(a, url, job_id, 42)
    async with _Pause(url, "provision.job_leases", "AFTER UPDATE") as pause:
        renewal = asyncio.create_task(a.renew([job_id]))
        await pause.until("advisory")
        taken = [j for j, _ in await asyncio.wait_for(b.claim_expired(limit=10), 20)]
        await pause.release()
        assert await asyncio.wait_for(renewal, 20) == []
    assert job_id not in taken
    after = await _lease_writer(url, job_id)
    assert after["owner"] == a.replica
