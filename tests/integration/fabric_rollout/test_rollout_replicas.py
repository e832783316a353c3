"""Fabric jobs across worker replicas, against the real NATS + PostgreSQL (no lab needed).

Two fabric-worker apps on one bus prefix and one database are two replicas. The "nodes" are
TCP listeners on 127.0.0.x:22 that never answer the SSH banner, so an apply (or a teardown)
stays in flight for `connect_timeout` seconds: long enough to cancel it from the *other*
replica, or to stop the replica running it.

- cancel reaches the replica running the apply: answered by any replica from the job row
  (404 otherwise), broadcast on core NATS (reacts in well under the heartbeat), and the
  durable `cancel_requested` flag alone is enough (the runner polls it);
- a second apply is a 409 on every replica while one runs;
- a job left running by a dead replica (stale lease) is recovered at start-up: failed with a
  clear error, rollout_status failed, a new apply possible;
- the whole-fabric teardown is a durable command: stopping the replica running it hands it
  to the other replica, which runs it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncssh
import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.common.contracts.fabric_rollout import CancelFabricApply
from karios.common.errors import Conflict, NotFound
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.rollout.apply import cancel, check_apply
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import SilentSsh, finished, sql
from tests.fixtures.wait import wait_until

NODES = ["127.0.0.3", "127.0.0.4"]
BMCS = ["198.18.77.1", "198.18.77.2"]
CONFIG = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_nos": "other",
    "fabric_switch_peering_ip": "198.18.0.254",
    "fabric_switch_role": "spine",
    "management_cidr": "127.0.0.0/24",
    "router_id_cidr": "198.19.7.1/24",
    "vxlan_mtu": 1500,
    "ospf_enabled": False,
    "expected_nodes": 2,
}
CONNECT_TIMEOUT = 4.0

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="binds 127.0.0.x:22 (needs root)")


@pytest.fixture
async def silent_nodes():
    """SSH 'nodes' that accept TCP and never send a banner (connect hangs until the timeout)."""
    async with SilentSsh(NODES) as nodes:
        yield nodes


def rollout_settings(tmp_path: Path, **kw) -> FabricWorkerSettings:
    key = tmp_path / "id_ed25519"
    if not key.exists():
        key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    base = {
        "ssh_key": key,
        "vnis": "100",
        "connect_timeout": CONNECT_TIMEOUT,
        "verify_timeout": 5,
        "heartbeat_interval": 5,  # cancel must not wait for it: the broadcast is immediate
        "lease": 15,
        "ack_wait": 10,
    }
    return FabricWorkerSettings(**(base | kw))


@pytest.fixture
async def cluster(settings, serve, silent_nodes, tmp_path):
    """inventory + two fabric-worker replicas + gateway; the nodes registered, a config stored."""
    await serve(inventory_app(settings))
    a = await serve(worker_app(settings, rollout_settings=rollout_settings(tmp_path)))
    b = await serve(worker_app(settings, rollout_settings=rollout_settings(tmp_path)))
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=ADMIN) as c:
        for bmc, ip in zip(BMCS, NODES, strict=True):
            r = await c.post("/controlnode/register", json={"bmc_ip": bmc, "os_ip": ip, "fqdn": f"n-{ip}"})
            assert r.status_code == 200, r.text
        r = await c.post("/controlnode/fabric-config", json=CONFIG)
        assert r.status_code in (200, 201), r.text
        yield c, [a, b]
        with contextlib.suppress(Exception):
            await c.delete("/controlnode/fabric-config")
    await sql(settings, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = ANY(:b)", b=BMCS)


def svc(app):  # the replica's RolloutService
    return app.app.state.rollout


async def runner_of(replicas, job_id: str, timeout: float = 10):
    def running():
        for r in replicas:
            job = svc(r).registry.running_job()
            if job is not None and job.job_id == job_id:
                return r
        return None

    return await wait_until(running, timeout=timeout, what=f"a replica to run {job_id}")


def cancel_seen(rep) -> bool:
    job = svc(rep).registry.running_job()
    return job is None or job.cancel_requested


async def test_cancel_reaches_the_replica_running_the_apply(cluster, settings) -> None:
    c, replicas = cluster
    r = await c.post("/controlnode/fabric-config/apply")
    assert r.status_code == 202, r.text
    job_id = r.json()["apply_job_id"]
    owner = await runner_of(replicas, job_id)
    other = next(x for x in replicas if x is not owner)
    assert svc(other).registry.running_job() is None

    # Busy on every replica, not only the one running it.
    for rep in replicas:
        with pytest.raises(Conflict, match=job_id):
            await check_apply(svc(rep))
    assert (await c.post("/controlnode/fabric-config/apply")).status_code == 409

    # The replica NOT running the job answers the cancel: the row says it is in flight.
    with pytest.raises(NotFound):
        await cancel(svc(other), CancelFabricApply(job_id=str(uuid.uuid4())))
    accepted = await cancel(svc(other), CancelFabricApply(job_id=job_id))
    assert accepted.state == "apply_cancelling"
    await wait_until(
        lambda: cancel_seen(owner),
        timeout=1.0,
        interval=0.02,
        what="the cancel broadcast to reach the running replica",
    )
    # Through the gateway (either replica answers): idempotent, 202 while the job is in flight.
    # A cancel bites at once now (issue 13: no waiting for the SSH connect in progress), so the
    # job may already be terminal: then 404, as the seed says, and never 202 again.
    codes = [
        (await c.post(f"/controlnode/fabric-config/apply/{job_id}/cancel")).status_code for _ in range(3)
    ]
    assert set(codes) <= {202, 404} and codes == sorted(codes), codes
    assert (await c.post("/controlnode/fabric-config/apply/nope/cancel")).status_code == 404

    done = await finished(c, job_id, timeout=30)
    assert done["job_status"] == "cancelled" and done["completed_nodes"] == 0, done
    assert (await c.post(f"/controlnode/fabric-config/apply/{job_id}/cancel")).status_code == 404
    cfg = (await c.get("/controlnode/fabric-config")).json()
    assert cfg["rollout_status"] == "failed" and cfg["last_job"]["job_id"] == job_id


async def test_durable_cancel_flag_alone_cancels(settings, serve, silent_nodes, tmp_path) -> None:
    """A replica that missed the broadcast still cancels: the runner polls the job row."""
    await serve(inventory_app(settings))
    w = await serve(worker_app(settings, rollout_settings=rollout_settings(tmp_path, heartbeat_interval=0.3)))
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=ADMIN) as c:
        for bmc, ip in zip(BMCS, NODES, strict=True):
            assert (
                await c.post("/controlnode/register", json={"bmc_ip": bmc, "os_ip": ip})
            ).status_code == 200
        assert (await c.post("/controlnode/fabric-config", json=CONFIG)).status_code in (200, 201)
        try:
            job_id = (await c.post("/controlnode/fabric-config/apply")).json()["apply_job_id"]
            await runner_of([w], job_id)
            await sql(
                settings, "UPDATE fabric.fabric_jobs SET cancel_requested = true WHERE job_id = :j", j=job_id
            )
            await wait_until(lambda: cancel_seen(w), timeout=2.0, what="the cancel flag to be polled")
            assert (await finished(c, job_id, timeout=30))["job_status"] == "cancelled"
        finally:
            await c.delete("/controlnode/fabric-config")
            await sql(settings, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = ANY(:b)", b=BMCS)


async def test_job_left_running_by_a_dead_replica_is_failed_at_startup(settings, serve, tmp_path) -> None:
    """The minimum after a crash: no replica holds the job → a starting replica ends it."""
    w0 = await serve(worker_app(settings, rollout_settings=rollout_settings(tmp_path)))
    gw = await serve(gateway_app(settings))
    job_id = str(uuid.uuid4())
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=ADMIN) as c:
        assert (await c.post("/controlnode/fabric-config", json=CONFIG)).status_code in (200, 201)
        await w0.stop()  # no replica runs while the "crashed" row is planted
        summary = {"job_id": job_id, "job_type": "fabric_apply", "job_status": "running", "total_nodes": 2}
        await sql(
            settings,
            "INSERT INTO fabric.fabric_jobs (job_id, job_type, job_status, summary, created_at, updated_at,"
            " owner, heartbeat_at, cancel_requested, request) VALUES (:j, 'fabric_apply', 'running',"
            " CAST(:s AS json), now(), now(), 'dead-host:1:x', :hb, false, CAST(:r AS json))",
            j=job_id,
            s=json.dumps(summary),
            hb=datetime.now(UTC) - timedelta(minutes=5),
            r='{"node_ip": "", "vnis": [100]}',
        )
        await sql(settings, "UPDATE fabric.fabric_config SET rollout_status = 'rolling_out'")
        try:
            await serve(worker_app(settings, rollout_settings=rollout_settings(tmp_path)))
            done = await finished(c, job_id, timeout=15)
            assert done["job_status"] == "failed" and "interrupted" in done["error"], done
            assert "dead-host:1:x" in done["error"]
            cfg = (await c.get("/controlnode/fabric-config")).json()
            assert cfg["rollout_status"] == "failed" and cfg["last_job"]["job_id"] == job_id
            rows = await sql(
                settings, "SELECT count(*) AS n FROM fabric.fabric_jobs WHERE job_status = 'running'"
            )
            assert rows[0]["n"] == 0
        finally:
            await c.delete("/controlnode/fabric-config")


async def test_fabric_teardown_is_a_durable_command_taken_over_by_a_peer(cluster, settings) -> None:
    c, replicas = cluster
    # VTEPs allocated to both nodes (what an apply does first), so DELETE queues a teardown.
    await sql(
        settings,
        "INSERT INTO fabric.vtep_allocations (vtep_ip, node_ip, allocated_at) VALUES"
        " ('198.19.7.1', :a, now()), ('198.19.7.2', :b, now())",
        a=NODES[0],
        b=NODES[1],
    )
    r = await c.delete("/controlnode/fabric-config")
    assert r.status_code == 200, r.text
    job_id = r.json()["teardown_job_id"]
    assert job_id and "queued" in r.json()["message"]

    # Whichever replica took the command: stop it while the teardown waits on the nodes.
    async def owner_of() -> str:
        rows = await sql(settings, "SELECT owner FROM fabric.fabric_jobs WHERE job_id = :j", j=job_id)
        return rows[0]["owner"]

    first_owner = await wait_until(owner_of, timeout=10, what="a replica to pick the teardown command up")
    running = next(x for x in replicas if svc(x).instance == first_owner)
    peer = next(x for x in replicas if x is not running)
    await running.stop()
    done = await finished(c, job_id, timeout=30)
    rows = await sql(settings, "SELECT owner FROM fabric.fabric_jobs WHERE job_id = :j", j=job_id)
    assert rows[0]["owner"] == svc(peer).instance, "the peer did not take the teardown over"
    assert done["job_type"] == "fabric_teardown" and done["total_nodes"] == 2, done
    # The silent nodes never answer SSH: the rerun ends, reporting them unreachable.
    assert done["job_status"] == "failed" and all(not n["reachable"] for n in done["nodes"]), done
