"""``POST /fabric-config/apply`` is one bus request: counted on the real NATS + PostgreSQL with
the real inventory, fabric-worker and gateway in this process, every bus call (request/reply,
JetStream publish of a command or an event) from the HTTP request to the first SSH connection.

Before issue 11 it took four round trips: ``req.fabric.apply_check``, its inventory lookup,
``cmd.fabric.apply``, and the same inventory lookup again in the command handler. Now: the
request, its one inventory lookup, the command; the handler asks the bus nothing before SSH.
The 202 carries the real job id (the row the worker wrote) and the config's id.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import asyncssh
import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.common.bus.runtime import Bus
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import SilentSsh, finished, forget_jobs, sql
from tests.fixtures.wait import wait_until

NODES = ["127.0.0.5", "127.0.0.6"]
BMCS = ["198.18.78.1", "198.18.78.2"]
CONFIG = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_nos": "other",
    "fabric_switch_peering_ip": "198.18.0.254",
    "fabric_switch_role": "spine",
    "management_cidr": "127.0.0.0/24",
    "router_id_cidr": "198.19.8.1/24",
    "vxlan_mtu": 1500,
    "ospf_enabled": False,
}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="binds 127.0.0.x:22 (needs root)")


@pytest.fixture
def bus_calls(monkeypatch):
    """(monotonic time, kind, subject) of every bus round trip made in this process."""
    calls: list[tuple[float, str, str]] = []
    request, publish = Bus.request, Bus._publish

    async def counted_request(self, subject, query, **kw):  # type: ignore[no-untyped-def]
        calls.append((time.monotonic(), "request", subject))
        return await request(self, subject, query, **kw)

    async def counted_publish(self, env, subject):  # type: ignore[no-untyped-def]
        calls.append((time.monotonic(), "publish", subject))
        return await publish(self, env, subject)

    monkeypatch.setattr(Bus, "request", counted_request)
    monkeypatch.setattr(Bus, "_publish", counted_publish)
    return calls


async def test_apply_is_one_request_and_the_handler_asks_the_bus_nothing_before_ssh(
    settings, serve, tmp_path: Path, bus_calls
) -> None:
    key = tmp_path / "id_ed25519"
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    rollout = FabricWorkerSettings(ssh_key=key, vnis="100", connect_timeout=4, heartbeat_interval=0.5)
    await serve(inventory_app(settings))
    await serve(worker_app(settings, rollout_settings=rollout))
    await forget_jobs(settings)
    gw = await serve(gateway_app(settings))
    async with SilentSsh(NODES) as nodes, httpx.AsyncClient(base_url=gw.url, timeout=30, headers=ADMIN) as c:
        try:
            for bmc, ip in zip(BMCS, NODES, strict=True):
                r = await c.post(
                    "/controlnode/register", json={"bmc_ip": bmc, "os_ip": ip, "fqdn": f"n-{ip}"}
                )
                assert r.status_code == 200, r.text
            assert (await c.post("/controlnode/fabric-config", json=CONFIG)).status_code in (200, 201)

            t0 = time.monotonic()
            r = await c.post("/controlnode/fabric-config/apply")
            assert r.status_code == 202, r.text
            accepted = r.json()
            job_id = accepted["apply_job_id"]
            assert accepted["created"] is True and accepted["id"] == 1
            rows = await sql(
                settings, "SELECT job_type, job_status FROM fabric.fabric_jobs WHERE job_id = :j", j=job_id
            )
            assert [dict(x) for x in rows] == [{"job_type": "fabric_apply", "job_status": "running"}]

            first_ssh = await wait_until(
                lambda: nodes.first_connect, timeout=15, what="the first SSH connect"
            )
            before = [(kind, subject) for t, kind, subject in bus_calls if t0 <= t < first_ssh]
            sub = gw.app.state.runtime.bus.subjects
            round_trips = [x for x in before if not x[1].startswith(f"{sub.prefix}.evt.")]
            assert round_trips == [
                ("request", sub.request("fabric", "request_apply")),
                ("request", sub.query("inventory", "node_access")),
                ("publish", sub.cmd("fabric", "apply")),
            ], before
            print(
                f"\nbus round trips before the first SSH of an apply: {len(round_trips)} (+ events: "
                f"{len(before) - len(round_trips)}); POST → first SSH {1000 * (first_ssh - t0):.0f} ms"
            )

            assert (await c.post(f"/controlnode/fabric-config/apply/{job_id}/cancel")).status_code == 202
            done = await finished(c, job_id, timeout=30)
            assert done["job_status"] == "cancelled", done
        finally:
            await c.delete("/controlnode/fabric-config")
            await sql(settings, "DELETE FROM inventory.bmc_infos WHERE bmc_ip = ANY(:b)", b=BMCS)
