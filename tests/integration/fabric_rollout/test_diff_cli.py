"""``karios fabric diff`` / ``karios fabric apply`` (issue 15 item 2) as a user runs them: the CLI
in a subprocess (``python -m karios.cli``, ``KARIOS_URL`` / ``KARIOS_TOKEN``) against the
in-process gateway, inventory and fabric-worker, the lab's 3 namespace nodes and a route
reflector.

``fabric diff`` prints each node's frr.conf diff (secrets redacted) and vtep0 to create;
``fabric apply --yes --watch`` prints the same preview, then follows the job to the node table and
exits 0; after it, ``fabric diff`` says "no change" for each node and ``fabric apply --yes``
applies nothing (exit 0, no new job) unless ``--force``.

Needs root (namespaces): skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import forget_jobs, lab_config, sql
from tests.fixtures.wait import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"
BGP_PW = "Cli-Preview-S3cret"
CONFIG = lab_config()
BMCS = [f"198.18.6.{i}" for i in (1, 2, 3)]
NODE_IPS = [fabric_lab.underlay_ip(i) for i in (1, 2, 3)]


@pytest.fixture(scope="module")
def lab():
    fabric_lab.require_lab()
    with fabric_lab.FabricLab(n_nodes=3, prefix="kdc") as lab:
        yield lab


async def _forget(settings) -> None:
    await sql(settings, "DELETE FROM fabric.node_host_keys WHERE node_ip = ANY(:n)", n=NODE_IPS)
    await sql(settings, "DELETE FROM fabric.vtep_allocations WHERE node_ip = ANY(:n)", n=NODE_IPS)
    await sql(
        settings,
        "DELETE FROM inventory.bmc_infos WHERE os_ip = ANY(:n) OR bmc_ip = ANY(:b)",
        n=NODE_IPS,
        b=BMCS,
    )


async def _idle(settings) -> bool:
    rows = await sql(settings, "SELECT count(*) AS n FROM fabric.fabric_jobs WHERE job_status = 'running'")
    return rows[0]["n"] == 0


@pytest.fixture
async def gateway(settings, serve, lab):
    await serve(inventory_app(settings))
    rollout = FabricWorkerSettings(
        _env_file=None,
        ssh_key=Path(lab.client_key_path),
        vnis="100",
        frr_log_file="/run/frr/frr.log",
        connect_timeout=5,
        verify_timeout=30,
        drift_interval=0,
    )
    await serve(worker_app(settings, rollout_settings=rollout))
    await forget_jobs(settings)
    await _forget(settings)
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, timeout=120, headers=ADMIN) as c:
        c.url = gw.url  # type: ignore[attr-defined]
        yield c
        await c.delete("/controlnode/fabric-config")
        await wait_until(lambda: _idle(settings), timeout=60, interval=0.3, what="the teardown to end")
    await _forget(settings)


async def karios(url: str, *args: str, timeout: float = 180) -> tuple[int, str]:
    """Run the CLI (non-interactive: no terminal, so one line per change), as a user would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env |= {
        "KARIOS_URL": url,
        "KARIOS_TOKEN": ADMIN["Authorization"].split()[1],
        "KARIOS_CONFIG": "/nonexistent/karios.json",
        "COLUMNS": "200",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "karios.cli",
        *args,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode()


async def _latest_id(c: httpx.AsyncClient) -> str:
    r = await c.get("/controlnode/fabric-config/latest")
    return r.json()["job_id"] if r.status_code == 200 else ""


async def test_fabric_diff_and_apply_from_the_cli(gateway, lab) -> None:
    c, url = gateway, gateway.url  # type: ignore[attr-defined]
    for i, n in enumerate(lab.nodes):
        body = {"bmc_ip": BMCS[i], "os_ip": n.underlay_ip, "os_username": "root", "fqdn": n.name}
        assert (await c.post("/controlnode/register", json=body)).status_code == 200
    assert (
        await c.post("/controlnode/fabric-config", json={**CONFIG, "bgp_password": BGP_PW})
    ).status_code in (
        200,
        201,
    )

    code, out = await karios(url, "fabric", "diff")
    assert code == 0, out
    assert BGP_PW not in out and "password <redacted>" in out, out
    for n in lab.nodes:
        assert f"{n.name} ({n.underlay_ip}): changes" in out, out
    assert out.count("/etc/frr/frr.conf (create)") == 3 and "+router bgp 65000" in out, out
    assert "link vtep0" in out and "3 of 3 node(s) would change" in out, out

    code, out = await karios(url, "--output", "json", "fabric", "diff", "--node", NODE_IPS[0])
    assert code == 0 and '"nodes_total": 1' in out and BGP_PW not in out, out

    # The lab's RR has no password: clear it, then apply with the preview printed first.
    clear = {**CONFIG, "clear_bgp_password": True}
    assert (await c.post("/controlnode/fabric-config", json=clear)).status_code in (200, 201)
    code, out = await karios(url, "fabric", "apply", "--yes", "--watch")
    assert code == 0, out
    assert out.index("3 of 3 node(s) would change") < out.index("accepted"), out
    assert "completed" in out and all(ip in out for ip in NODE_IPS), out  # the node table
    job_id = await _latest_id(c)
    job = (await c.get("/controlnode/fabric-config/latest")).json()
    assert (job["job_status"], job["completed_nodes"]) == ("completed", 3), job

    code, out = await karios(url, "fabric", "diff")
    assert code == 0 and out.count(": no change") == 3 and "0 of 3 node(s) would change" in out, out

    code, out = await karios(url, "fabric", "apply", "--yes")
    assert code == 0 and "nothing applied" in out, out
    assert await _latest_id(c) == job_id  # no new job

    code, out = await karios(url, "fabric", "apply", "--yes", "--force", "--watch")
    assert code == 0 and "completed" in out, out
    assert await _latest_id(c) != job_id
