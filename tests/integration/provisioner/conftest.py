"""Fixtures for provisioning tests: a sushy-tools Redfish emulator and a wired inventory + gateway +
provisioner (helpers are in tests/fixtures/provision.py)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import RunningApp, free_port
from tests.fixtures.provision import (
    EXTRA_BMCS,
    STACK_BMCS,
    retire_leftover_jobs,
    start_app_at,
    use_installer_media,
    write_inventory,
)
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
        use_installer_media(app.state.jobs)
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
    ips = list(STACK_BMCS)
    inventory = write_inventory(tmp_path_factory.mktemp("inventory") / "inventory.yaml", ips + EXTRA_BMCS)
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    cache = Path(tempfile.gettempdir()) / "karios-test-media-cache"  # base artifacts shared across tests
    cfg = ProvisionerConfig(
        cache_dir=cache,
        media_dir=tmp_path_factory.mktemp("media"),
        images_dir=tmp_path_factory.mktemp("images"),
        stage_deadline=600,
        stuck_check_interval=0.5,
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=15,  # InsertMedia makes the emulator download the ISO: slow on a busy 2-core box
        power_deadline=20,
        build_concurrency=2,
        install_method="preseed",  # these tests read the installer's files from the medium
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
    use_installer_media(prov_app.state.jobs)
    prov = await serve(prov_app)
    gw = await serve(gateway_app(settings))
    cfg.media_url, cfg.callback_url = prov.url, gw.url
    for sid in emulator.system_ids:  # start from a clean slate per test
        emulator.request(
            "POST", f"/redfish/v1/Systems/{sid}/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia", {}
        )
    return Stack(gw.url, prov.url, cfg, prov_app, emulator, ips, prov)
