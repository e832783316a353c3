"""Writes during a fabric job answer 409 naming the job (issue 23 item 5), against the real NATS +
PostgreSQL with the inventory, the fabric worker and the gateway in this process.

Before: a config POST during an apply answered 200 (``rollout_status: rolling_out``), the job
rolled the *old* AS out and the status then read ``ready`` with the new AS stored. Now, while an
apply or teardown runs (the "nodes" are TCP listeners that never answer SSH, so the job stays in
flight): ``POST`` / ``DELETE /controlnode/fabric-config`` and adopting / removing a compute node
answer 409 ``FABRIC_JOB_RUNNING`` naming the job and nothing is written; after the job ends the
same POST is taken. The check is taken under the lock a job is queued under: a config write in
flight delays a job start (and the reverse), never both succeed on different configurations.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import asyncssh
import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.common.contracts.fabric import FabricConfigInput, UpsertFabricConfig
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.config import store
from karios.fabric_worker.rollout.summary import JobSummary, JobType
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import SilentSsh, finished, forget_fabric_config, forget_jobs, sql
from tests.fixtures.wait import wait_until

NODES = ["127.0.0.91", "127.0.0.92"]
BMCS = ["198.18.91.1", "198.18.91.2"]
NEW_NODE = "127.0.0.93"  # nothing listens there: adopting it after the job is a 502, not a 409
CONFIG = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_nos": "other",
    "fabric_switch_peering_ip": "198.18.0.254",
    "fabric_switch_role": "spine",
    "management_cidr": "127.0.0.0/24",
    "router_id_cidr": "198.19.91.1/24",
    "vxlan_mtu": 1500,
    "ospf_enabled": False,
    "expected_nodes": 2,
}
CONNECT_TIMEOUT = 12.0  # the apply stays in flight this long (the test cancels it well before)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="binds 127.0.0.x:22 (needs root)")


def rollout_settings(tmp_path: Path) -> FabricWorkerSettings:
    key = tmp_path / "id_ed25519"
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    return FabricWorkerSettings(
        ssh_key=key, vnis="100", connect_timeout=CONNECT_TIMEOUT, verify_timeout=5, lease=15, ack_wait=10
    )


@pytest.fixture
async def fabric(settings, serve, tmp_path):
    """inventory + fabric worker + gateway; two silent nodes registered, CONFIG stored."""
    await serve(inventory_app(settings))
    worker = await serve(worker_app(settings, rollout_settings=rollout_settings(tmp_path)))
    # NEW_NODE is a loopback address (nothing listens): allowed as in a lab on one machine
    gw = await serve(gateway_app(settings.model_copy(update={"adopt_allow_loopback": True})))
    async with SilentSsh(NODES), httpx.AsyncClient(base_url=gw.url, timeout=30, headers=ADMIN) as c:
        await forget_jobs(settings)
        for bmc, ip in zip(BMCS, NODES, strict=True):
            r = await c.post("/controlnode/register", json={"bmc_ip": bmc, "os_ip": ip, "fqdn": f"n-{ip}"})
            assert r.status_code == 200, r.text
        r = await c.post("/controlnode/fabric-config", json=CONFIG)
        assert r.status_code in (200, 201), r.text
        yield c, worker.app.state.rollout
        await forget_jobs(settings, timeout=CONNECT_TIMEOUT + 30)
        await forget_fabric_config(settings)  # no teardown of the silent nodes to wait for
    await sql(settings, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = ANY(:b)", b=BMCS)


async def stored(settings) -> dict:
    """The config row as PostgreSQL holds it (data, secrets' presence, status, last write)."""
    rows = await sql(settings, "SELECT data, rollout_status, updated_at FROM fabric.fabric_config")
    return dict(rows[0]) if rows else {}


async def waiting_for_the_lock(settings) -> bool:
    """Some session of this database waits for an advisory lock (the fabric config lock)."""
    rows = await sql(
        settings,
        "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return rows[0]["n"] > 0


def refused(r: httpx.Response, job_id: str, kind: str) -> dict:
    """A 409 FABRIC_JOB_RUNNING in the ErrorResponse shape naming `job_id` and its kind."""
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "FABRIC_JOB_RUNNING", body
    assert f"fabric job {job_id} ({kind}) is running" in body["message"], body
    assert body["details"]["job_id"] == job_id and body["details"]["kind"] == kind, body
    assert body["detail"] == body["message"]
    return body


async def test_writes_during_a_job_answer_409_naming_it(fabric, settings) -> None:
    c, _svc = fabric
    r = await c.post("/controlnode/fabric-config/apply")
    assert r.status_code == 202, r.text
    job_id = r.json()["apply_job_id"]

    async def rolling_out() -> bool:
        return (await c.get("/controlnode/fabric-config")).json()["rollout_status"] == "rolling_out"

    await wait_until(rolling_out, timeout=10, what="the apply to start")
    view_before, row_before = (await c.get("/controlnode/fabric-config")).json(), await stored(settings)

    # The case: a new AS while the apply runs (the switch's too: iBGP with the route
    # reflector on the gateway node, so the switch's configuration does not change and no ack
    # gate stands in front of the 409).
    body = refused(
        await c.post("/controlnode/fabric-config", json={"as": 65001, "fabric_switch_as": 65001}),
        job_id,
        "apply",
    )
    assert f"(POST /controlnode/fabric-config/apply/{job_id}/cancel)" in body["message"], body
    refused(await c.delete("/controlnode/fabric-config"), job_id, "apply")
    # The node set: adopting (no SSH contact is made) and removing.
    adopt = {"node_ip": NEW_NODE, "ssh_password": "secret-pw"}
    refused(await c.post("/controlnode/nodes", json=adopt), job_id, "apply")
    refused(await c.delete(f"/controlnode/nodes/{NODES[0]}"), job_id, "apply")

    # Nothing written: the config, its status and the node set are what they were.
    assert (await c.get("/controlnode/fabric-config")).json() == view_before
    assert await stored(settings) == row_before
    assert (await c.get(f"/controlnode/nodes/{NEW_NODE}")).status_code == 404
    assert (await c.get(f"/controlnode/nodes/{NODES[0]}")).status_code == 200
    assert not await sql(settings, "SELECT 1 FROM fabric.node_host_keys WHERE node_ip = :n", n=NEW_NODE)

    # Cancelled, the job ends; the same POST is taken.
    assert (await c.post(f"/controlnode/fabric-config/apply/{job_id}/cancel")).status_code in (202, 404)
    assert (await finished(c, job_id, timeout=30))["job_status"] == "cancelled"
    r = await c.post("/controlnode/fabric-config", json={"as": 65001, "fabric_switch_as": 65001})
    assert r.status_code == 200, r.text
    assert r.json()["as"] == 65001 and r.json()["rollout_status"] == "failed"  # the cancelled apply's
    r = await c.post("/controlnode/nodes", json=adopt)
    assert r.status_code == 502 and r.json()["code"] == "NODE_UNREACHABLE", r.text  # asked, not refused
    r = await c.delete(f"/controlnode/nodes/{NODES[0]}")  # the apply allocated its VTEP: that 409 now
    assert r.status_code == 409 and r.json()["code"] != "FABRIC_JOB_RUNNING" and "VTEP" in r.text, r.text

    # A teardown is a job too: DELETE queues it (VTEPs allocated), then every write waits for it.
    r = await c.delete("/controlnode/fabric-config")
    assert r.status_code == 200, r.text
    teardown_id = r.json()["teardown_job_id"]
    body = refused(await c.post("/controlnode/fabric-config", json=CONFIG), teardown_id, "teardown")
    assert "cancel" not in body["details"], body
    refused(await c.delete("/controlnode/fabric-config"), teardown_id, "teardown")
    refused(await c.post("/controlnode/nodes", json=adopt), teardown_id, "teardown")
    assert await stored(settings) == {}  # still deleted: the refused POST created nothing
    await finished(c, teardown_id, timeout=CONNECT_TIMEOUT + 30)
    r = await c.post("/controlnode/fabric-config", json=CONFIG)
    assert r.status_code == 201, r.text


def _upsert(**fields) -> UpsertFabricConfig:
    return UpsertFabricConfig(
        config=FabricConfigInput.model_validate(fields), fields_set=sorted(fields), caller_role="fabric_admin"
    )


async def test_a_config_write_and_a_job_start_are_ordered_by_one_lock(fabric, settings) -> None:
    """Both orders, each held open at the critical point: the second waits for the first, and
    the outcome is consistent (never a job running a config other than the one stored)."""
    c, svc = fabric

    # 1. A job is being queued (its transaction holds the config lock): a POST waits, then 409.
    fake = str(uuid.uuid4())
    inside, release = asyncio.Event(), asyncio.Event()

    async def hold(_session) -> None:
        inside.set()
        await release.wait()

    summary = JobSummary(job_id=fake, job_type=JobType.APPLY, total_nodes=0)
    queuing = asyncio.create_task(svc.repo.queue_job(summary, {"node_ip": "", "vnis": [100]}, then=hold))
    await asyncio.wait_for(inside.wait(), 5)
    row_before = await stored(settings)
    post = asyncio.create_task(
        c.post("/controlnode/fabric-config", json={"as": 65002, "fabric_switch_as": 65002})
    )
    await wait_until(lambda: waiting_for_the_lock(settings), what="the config write to wait for the lock")
    assert not post.done(), "the config write did not wait for the job being queued"
    release.set()
    await queuing
    refused(await post, fake, "apply")
    assert await stored(settings) == row_before
    await sql(settings, "UPDATE fabric.fabric_jobs SET job_status = 'failed' WHERE job_id = :j", j=fake)

    # 2. A config write is in flight (its transaction holds the lock): an apply request waits,
    # then sees the configuration moved under its checks and answers 409; nothing is queued.
    async with svc.rt.db.session() as s, s.begin():
        await store.upsert(s, _upsert(**{"as": 65003, "fabric_switch_as": 65003}), svc.box)
        apply = asyncio.create_task(c.post("/controlnode/fabric-config/apply"))
        await wait_until(lambda: waiting_for_the_lock(settings), what="the apply to wait for the lock")
        assert not apply.done(), "the job was queued while a config write was in flight"
    r = await apply
    assert r.status_code == 409 and "configuration changed while the apply was checked" in r.text, r.text
    assert not await sql(settings, "SELECT 1 FROM fabric.fabric_jobs WHERE job_status = 'running'")
    # Sent again, it runs the configuration that is stored.
    r = await c.post("/controlnode/fabric-config/apply")
    assert r.status_code == 202, r.text
    job_id = r.json()["apply_job_id"]
    assert (await c.get("/controlnode/fabric-config")).json()["as"] == 65003
    await c.post(f"/controlnode/fabric-config/apply/{job_id}/cancel")
    assert (await finished(c, job_id, timeout=30))["job_status"] == "cancelled"
