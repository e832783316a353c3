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

from karios.api_gateway.app import create_app as gateway_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.cpio import read_initrd
from tests.conftest import ADMIN
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


@pytest.fixture
async def stack(settings, serve, emulator, tmp_path_factory):
    ips = [f"10.99.0.{i}" for i in range(1, 6)]
    cache = Path(tempfile.gettempdir()) / "karios-test-media-cache"  # base artifacts shared across tests
    cfg = ProvisionerConfig(
        cache_dir=cache,
        media_dir=tmp_path_factory.mktemp("media"),
        stage_deadline=600,
        stuck_check_interval=0.5,
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=5,
        power_deadline=20,
        build_concurrency=2,
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
    return Stack(gw.url, prov.url, cfg, prov_app, emulator, ips)


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
