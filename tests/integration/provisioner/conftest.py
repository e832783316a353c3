"""Fixtures for provisioning tests: a sushy-tools Redfish emulator and a wired gateway + provisioner."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.app import create_app as gateway_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.cpio import read_initrd
from tests.conftest import ADMIN, RunningApp, free_port
from tests.lab.redfish_lab import RedfishEmulator, fake_system


@pytest.fixture(scope="module")
def emulator():
    try:
        emu = RedfishEmulator([fake_system(f"node{i}") for i in range(1, 6)], auth=True)
        emu.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


@dataclass
class Stack:
    gw: str
    prov: str
    cfg: ProvisionerConfig
    app: object  # provisioner FastAPI app
    emu: RedfishEmulator
    bmc_ips: list[str]
    running: RunningApp | None = None  # the provisioner's server (tests may stop it)


async def retire_leftover_jobs(database_url: str) -> None:
    """Earlier tests share the database: their unfinished jobs must not be resumed (or block a BMC) here."""
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as c:
            await c.execute(
                sa.text(
                    "DO $$ BEGIN IF to_regclass('provision.jobs') IS NOT NULL THEN "
                    "UPDATE provision.jobs SET state = 'cancelled', lease_until = NULL "
                    "WHERE state NOT IN ('completed', 'failed', 'cancelled'); END IF; "
                    # and in the gateway's read model, which refuses a BMC with a running job
                    "IF to_regclass('gateway.jobs') IS NOT NULL THEN "
                    "UPDATE gateway.jobs SET job_status = 'cancelled', status = 'cancelled' "
                    "WHERE job_type NOT LIKE '%_batch' "
                    "AND job_status NOT IN ('completed', 'failed', 'cancelled'); END IF; END $$"
                )
            )
    finally:
        await engine.dispose()


async def start_app_at(app, port: int) -> RunningApp:  # type: ignore[no-untyped-def]
    """Like tests.conftest.start_app, on a port chosen beforehand (so the config knows its URL)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    for _ in range(600):
        if server.started:
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    else:
        raise RuntimeError("app did not start")
    return RunningApp(app, server, task, f"http://127.0.0.1:{port}")


@pytest.fixture
async def replicas(settings, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Start extra provisioner replicas: ``await replicas(cfg, wrap=None)`` → (RunningApp, JobService).

    Each replica gets its own media directory and media URL (its medium lives on its disk); it
    knows its URL before it starts, so jobs it resumes at start-up are mounted from the right place.
    """
    running: list[RunningApp] = []

    async def start(cfg: ProvisionerConfig, prepare=None):  # type: ignore[no-untyped-def]
        port = free_port()
        own = cfg.model_copy(
            update={
                "media_dir": tmp_path_factory.mktemp("replica-media"),
                "media_url": f"http://127.0.0.1:{port}",
                "bmc_endpoints": dict(cfg.bmc_endpoints),
            }
        )
        app = provisioner_app(settings, own)
        if prepare is not None:
            prepare(app.state.jobs)
        r = await start_app_at(app, port)
        running.append(r)
        return r, app.state.jobs

    yield start
    for r in reversed(running):
        await r.stop()


@pytest.fixture
async def stack(settings, serve, emulator, tmp_path_factory):
    await retire_leftover_jobs(settings.database_url)
    ips = [f"10.99.0.{i}" for i in range(1, 6)]
    cache = Path(tempfile.gettempdir()) / "karios-test-media-cache"  # base artifacts shared across tests
    cfg = ProvisionerConfig(
        cache_dir=cache,
        media_dir=tmp_path_factory.mktemp("media"),
        stage_deadline=600,
        stuck_check_interval=0.5,
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=15,  # InsertMedia makes the emulator download the ISO: slow on a busy 2-core box
        power_deadline=20,
        build_concurrency=2,
        lease_seconds=3,
        claim_interval=0.3,
        bmc_endpoints={
            ip: {
                "url": emulator.url,
                "system_id": sid,
                "username": emulator.username,
                "password": emulator.password,
            }
            for ip, sid in zip(ips, emulator.system_ids, strict=True)
        },
    )
    prov_app = provisioner_app(settings, cfg)
    prov = await serve(prov_app)
    gw = await serve(gateway_app(settings))
    cfg.media_url, cfg.callback_url = prov.url, gw.url
    for sid in emulator.system_ids:  # start from a clean slate per test
        emulator.request(
            "POST", f"/redfish/v1/Systems/{sid}/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia", {}
        )
    return Stack(gw.url, prov.url, cfg, prov_app, emulator, ips, prov)


async def read_sse(client: httpx.AsyncClient, url: str, until, timeout: float = 60):  # type: ignore[no-untyped-def]
    """SSE events (name, data) until ``until(events)`` is true."""
    events: list[tuple[str, dict]] = []

    async def run() -> None:
        async with client.stream("GET", url, headers=ADMIN, timeout=timeout) as r:
            cur: dict = {}
            async for line in r.aiter_lines():
                if line == "":
                    if "data" in cur:
                        events.append((cur.get("event", ""), json.loads(cur["data"])))
                        if until(events):
                            return
                    cur = {}
                elif not line.startswith(":"):
                    k, _, v = line.partition(": ")
                    cur[k] = v

    await asyncio.wait_for(run(), timeout)
    return events


async def wait_job(client: httpx.AsyncClient, job_id: str, states: set[str], timeout: float = 60) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    last: dict = {}
    while asyncio.get_running_loop().time() < deadline:
        r = await client.get(f"/controlnode/job/{job_id}", headers=ADMIN)
        if r.status_code == 200:
            last = r.json()
            if last["job_status"] in states:
                return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {states}; last {last}")


def medium_token(iso: Path) -> tuple[str, dict[str, bytes]]:
    """Read the job token from the medium the way the installer does: initrd → /karios/cb.sh."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "initrd.gz"
        subprocess.run(
            ["xorriso", "-osirrox", "on", "-indev", str(iso), "-extract", "/install.amd/initrd.gz", str(out)],
            check=True,
            capture_output=True,
        )
        files = read_initrd(out.read_bytes())
    m = re.search(r"TOKEN='([^']+)'", files["karios/cb.sh"].decode())
    assert m
    return m.group(1), files


def bmc_posts(emu: RedfishEmulator, system_id: str, action: str, since: int = 0) -> int:
    """Accepted (2xx) POSTs of ``action`` for one system, from the emulator's own request log."""
    sys_path = f"/redfish/v1/Systems/{re.escape(system_id)}/"
    tail = r"\S* HTTP/[\d.]+\S*\" 2\d\d"
    return len(re.findall(rf"POST {sys_path}\S*{re.escape(action)}{tail}", emu.log()[since:]))


def resets_seen(emu: RedfishEmulator, system_id: str, since: int = 0) -> int:
    return bmc_posts(emu, system_id, "Actions/ComputerSystem.Reset", since)


def inserts_seen(emu: RedfishEmulator, system_id: str, since: int = 0) -> int:
    return bmc_posts(emu, system_id, "Actions/VirtualMedia.InsertMedia", since)


async def wait_resets(
    emu: RedfishEmulator, system_id: str, since: int, n: int = 1, timeout: float = 15
) -> int:
    """Resets seen once at least ``n`` arrived (the job shows booting just before the reset is sent),
    after a short settle so a duplicate would be counted too."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while resets_seen(emu, system_id, since) < n and loop.time() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    return resets_seen(emu, system_id, since)
