"""Nothing lost between gateway and workers (issue 12, item 4): the BMC-lock case.

A provision the gateway accepted but no provisioner ever works — its command dead-lettered, or
never delivered — ends ``failed`` with the reason, frees the BMC, and cancel answers 409 (not 404).
Real NATS, PostgreSQL, gateway, inventory, provisioner and Redfish emulator (fixture ``stack``).
"""

from __future__ import annotations

import uuid

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.readmodel import NEVER_REACHED, ProvisionProjector
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import StartProvision
from karios.common.db import Database
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import wait_job
from tests.fixtures.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.lab]


def body(ip: str) -> dict:
    return {"bmc_IP": ip, "vendor": "dell", "hostname": "n1"}


async def _cancel_everything(c: httpx.AsyncClient, *job_ids: str) -> None:
    for job in job_ids:
        await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)


async def test_dead_lettered_provision_fails_the_job_and_frees_the_bmc(stack):
    """The issue's case: the provisioner cannot store the command (vendor longer than its
    varchar(32) column, here forced past the gateway's own checks) and dead-letters it."""
    jobs, ip = stack.app.state.jobs, stack.bmc_ips[0]
    handle_start = jobs.handle_start

    async def too_long_vendor(cmd: StartProvision) -> None:
        spec = cmd.spec.model_copy(update={"vendor": "v" * 33})
        await handle_start(cmd.model_copy(update={"spec": spec}))

    jobs.handle_start = too_long_vendor
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        r = await c.post("/controlnode/provision/dell", json=body(ip), headers=ADMIN)
        assert r.status_code == 202, r.text
        dead = r.json()["job_id"]
        got = await wait_job(c, dead, {"failed"}, timeout=60)
        jobs.handle_start = handle_start
        assert got["status"] == "failed"
        assert got["message"].startswith("the provisioner could not take the job: "), got
        for internal in ("INSERT", "varchar", "provision.jobs", "Error"):
            assert internal not in got["message"], got["message"]
        progress = (
            await c.post("/controlnode/provision/progress", json={"bmc_ip": ip}, headers=ADMIN)
        ).json()
        assert progress["job_id"] == dead and progress["status"] == "failed"
        # Cancel of the dead job says it has ended, and why.
        r = await c.post(f"/controlnode/job/{dead}/cancel", headers=ADMIN)
        assert r.status_code == 409, r.text
        assert "already failed" in r.text
        # The BMC is free: a new provision is accepted and worked.
        r = await c.post("/controlnode/provision/dell", json=body(ip), headers=ADMIN)
        assert r.status_code == 202, r.text
        fresh = r.json()["job_id"]
        await wait_job(c, fresh, {"building", "mounting", "booting", "installing"})
        await _cancel_everything(c, fresh)


async def _insert_gateway_job(database_url: str, job_id: str, bmc_ip: str) -> None:
    """A job row whose command was never published (a gateway crash between commit and publish)."""
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                sa.text(
                    "INSERT INTO gateway.jobs (id, job_type, job_status, status, metadata, node_ip, "
                    "bmc_ip, parent_id, progress, resource_name, total_jobs, message, created_at, "
                    "updated_at) VALUES (:id, 'provision', 'queued', 'running', '{}', '', :ip, '', 0, "
                    "'n1', 1, 'Queued', now() - interval '1 hour', now() - interval '1 hour')"
                ),
                {"id": job_id, "ip": bmc_ip},
            )
    finally:
        await engine.dispose()


async def test_reconcile_fails_jobs_no_provisioner_knows(stack, settings):
    lost_ip, cancel_ip = stack.bmc_ips[1], stack.bmc_ips[2]
    lost, orphan = f"lost-{uuid.uuid4()}", f"orphan-{uuid.uuid4()}"
    await _insert_gateway_job(settings.database_url, lost, lost_ip)
    await _insert_gateway_job(settings.database_url, orphan, cancel_ip)
    bus, db = Bus.from_settings(settings, "test-reconcile"), Database(settings.database_url)
    await bus.start()
    try:
        async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
            # Locked as in the issue: the gateway holds the job live, so the BMC is refused.
            r = await c.post("/controlnode/provision/dell", json=body(lost_ip), headers=ADMIN)
            assert r.status_code == 409 and lost in r.text, r.text
            # Cancel of a job only the gateway has ends it (200), not 404.
            r = await c.post(f"/controlnode/job/{orphan}/cancel", headers=ADMIN)
            assert r.status_code == 200, r.text
            assert r.json()["state"] == "cancelled"
            await wait_job(c, orphan, {"cancelled"})

            found = await ProvisionProjector(bus, db, lost_after=60).reconcile([lost, orphan])
            assert lost in found and orphan not in found
            got = await wait_job(c, lost, {"failed"})
            assert got["status"] == "failed" and got["message"] == NEVER_REACHED
            r = await c.post(f"/controlnode/job/{lost}/cancel", headers=ADMIN)
            assert r.status_code == 409, r.text

            # The BMC is free again; a job a provisioner knows is never failed by the reconcile.
            r = await c.post("/controlnode/provision/dell", json=body(lost_ip), headers=ADMIN)
            assert r.status_code == 202, r.text
            fresh = r.json()["job_id"]

            async def known() -> bool:
                q = (await c.get("/controlnode/provision/queue", headers=ADMIN)).json()
                return any(e["job_id"] == fresh for e in q["entries"])

            await wait_until(known, timeout=30, what="the provisioner knows the new job")
            # (scoped to this test's jobs: the database is shared with other tests' gateways)
            assert await ProvisionProjector(bus, db, lost_after=0).reconcile([fresh]) == []
            assert (await c.get(f"/controlnode/job/{fresh}", headers=ADMIN)).json()["status"] != "failed"
            await _cancel_everything(c, fresh)
    finally:
        await bus.stop()
        await db.engine.dispose()
