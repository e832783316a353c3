"""The fabric-worker's outbox (issue 12 item 4, ADR 0002): the apply job row and its
``cmd.fabric.apply`` commit together. A worker SIGKILLed between that commit and the relay
(``KARIOS_CHAOS_KILL_AFTER_OUTBOX_COMMIT=1``) leaves the queued row and the command in
``fabric.command_outbox``; the next worker to start — after the job's lease expired, so the reaper
would have failed a queued job without a command — relays the command, and the apply runs once
on the lab's 3 nodes (one publish on ``cmd.fabric.apply``, one job, completed, Established).

Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.common.outbox import KILL_AFTER_COMMIT_ENV
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN, free_port
from tests.fixtures.fabric import finished, forget_jobs, lab_config, sql
from tests.fixtures.wait import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
CONFIG = lab_config()
BMCS = [f"198.18.7.{i}" for i in (1, 2, 3)]
NODE_IPS = [fabric_lab.underlay_ip(i) for i in (1, 2, 3)]
LEASE = 2.0
WORKER_MAIN = """
import sys, uvicorn
from karios.fabric_worker.app import create_app
uvicorn.run(create_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


@pytest.fixture(scope="module")
def lab():
    fabric_lab.require_lab()
    with fabric_lab.FabricLab(n_nodes=3, prefix="kob") as lab:
        yield lab


def worker_process(settings, lab) -> subprocess.Popen:
    """A fabric-worker in its own process that SIGKILLs itself right after the outbox commit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")} | {
        "KARIOS_DEV_MODE": "true",
        "KARIOS_NATS_URL": settings.nats_url,
        "KARIOS_DATABASE_URL": settings.database_url,
        "KARIOS_BUS_PREFIX": settings.bus_prefix,
        "KARIOS_LOG_JSON": "false",
        "KARIOS_FABRIC_SSH_KEY": lab.client_key_path,
        "KARIOS_FABRIC_VNIS": "100",
        "KARIOS_FABRIC_FRR_LOG_FILE": "/run/frr/frr.log",
        "KARIOS_FABRIC_LEASE": str(LEASE),
        "KARIOS_FABRIC_DRIFT_INTERVAL": "0",
        KILL_AFTER_COMMIT_ENV: "1",
    }
    return subprocess.Popen([sys.executable, "-c", WORKER_MAIN, str(free_port())], env=env)


async def _forget(settings) -> None:
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=NODE_IPS)
    await sql(settings, "DELETE FROM fabric.vtep_allocations WHERE node_ip = ANY(:n)", n=NODE_IPS)
    await sql(
        settings,
        "DELETE FROM inventory.bmc_infos WHERE os_ip = ANY(:n) OR bmc_ip = ANY(:b)",
        n=NODE_IPS,
        b=BMCS,
    )


async def test_worker_killed_between_commit_and_relay_applies_once_after_restart(
    settings, serve, lab
) -> None:
    await serve(inventory_app(settings))
    gw = await serve(gateway_app(settings))
    proc = worker_process(settings, lab)
    published: list[str] = []
    nc = await nats.connect(settings.nats_url)

    async def seen(msg) -> None:  # a stream publish is a core publish: every one is heard here
        published.append(msg.headers.get("Nats-Msg-Id", "") if msg.headers else "")

    await nc.subscribe(f"{settings.bus_prefix}.cmd.fabric.apply", cb=seen)
    await nc.flush()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60, headers=ADMIN) as c:

            async def stored() -> httpx.Response | None:
                r = await c.post("/controlnode/fabric-config", json=CONFIG)
                return None if r.status_code == 503 else r

            r = await wait_until(stored, timeout=40, interval=0.3, what="the worker process to come up")
            assert r.status_code in (200, 201), r.text
            await forget_jobs(settings)
            await _forget(settings)
            for i, n in enumerate(lab.nodes):
                body = {"bmc_ip": BMCS[i], "os_ip": n.underlay_ip, "os_username": "root", "fqdn": n.name}
                assert (await c.post("/controlnode/register", json=body)).status_code == 200

            r = await c.post("/controlnode/fabric-config/apply")  # the worker dies after its commit
            assert r.status_code in (503, 504), r.text
            assert proc.wait(20) == -signal.SIGKILL
            (job,) = await sql(settings, "SELECT job_id, job_status, owner FROM fabric.fabric_jobs")
            assert (job["job_status"], job["owner"]) == ("running", ""), job
            waiting = await sql(settings, "SELECT headers->>'karios-msg-id' AS id FROM fabric.command_outbox")
            assert [w["id"] for w in waiting] == [job["job_id"]] and published == []

            async def lease_expired() -> bool:  # the reaper would fail a queued job without a command
                q = "SELECT heartbeat_at < now() - make_interval(secs => :s) AS old FROM fabric.fabric_jobs"
                return (await sql(settings, q, s=LEASE))[0]["old"]

            await wait_until(lease_expired, timeout=10, interval=0.2, what="the queued job's lease to expire")
            t0 = time.monotonic()
            rollout = FabricWorkerSettings(
                _env_file=None,
                ssh_key=Path(lab.client_key_path),
                vnis="100",
                frr_log_file="/run/frr/frr.log",
                connect_timeout=5,
                verify_timeout=30,
                lease=LEASE,
                drift_interval=0,
            )
            await serve(worker_app(settings, rollout_settings=rollout))
            done = await finished(c, job["job_id"], timeout=90)
            ran_s = time.monotonic() - t0
            assert (done["job_status"], done["completed_nodes"]) == ("completed", 3), done
            assert published == [job["job_id"]]  # relayed once
            assert await sql(settings, "SELECT id FROM fabric.command_outbox") == []
            assert len(await sql(settings, "SELECT job_id FROM fabric.fabric_jobs")) == 1
            peers = lab.rr_evpn_peer_states()
            assert {ip: peers.get(ip) for ip in NODE_IPS} == dict.fromkeys(NODE_IPS, "Established")
            print(f"\nworker killed after the outbox commit: apply completed {ran_s:.1f} s after the restart")
            r = await c.delete("/controlnode/fabric-config")
            assert r.status_code == 200, r.text
            if r.json().get("teardown_job_id"):
                await finished(c, r.json()["teardown_job_id"], timeout=60)
    finally:
        await nc.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        await _forget(settings)
