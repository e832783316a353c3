"""Provisioner: provision/unprovision jobs, boot media (served here with range requests), BMC drivers."""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from karios.common.crypto import SecretBox
from karios.common.db import Database
from karios.common.discovery_token import DiscoveryTokens
from karios.common.errors import NotFound
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings
from karios.common.tasks import cancel_and_wait
from karios.provisioner import metrics
from karios.provisioner.bmc import powersync
from karios.provisioner.bmc.rotate import CredentialRotation, wire_rotation
from karios.provisioner.bmc.tlspins import TlsPins, wire_tls_pins
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.firmware.service import FirmwareUpdates, wire_firmware
from karios.provisioner.firmware.store import FirmwareStore
from karios.provisioner.handlers import wire
from karios.provisioner.images.service import ImageCatalog, wire_images
from karios.provisioner.images.store import ImageStore
from karios.provisioner.inspect.discovery_service import DiscoveryService, wire_discovery
from karios.provisioner.inspect.discovery_store import DiscoveryStore
from karios.provisioner.inspect.service import HardwareService, wire_inspection
from karios.provisioner.inspect.store import HardwareStore
from karios.provisioner.jobs.service import JobService
from karios.provisioner.media import MediaBuilder
from karios.provisioner.media.serve import ServedFile, ZeroCopySend, medium_response, ranged_response
from karios.provisioner.media.signing import EXPIRES, SIGNATURE
from karios.provisioner.models import SCHEMA

SERVICE = "provisioner"
# Database connections kept open: a job at work touches its row at each step; 64 admitted jobs on
# the runtime's default pool (5) would open and close a connection per transaction.
DB_POOL_SIZE = 12
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_IMAGE_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$")


def image_file(images_dir: Path | None, path: str) -> Path | None:
    """The file ``path`` names under ``images_dir`` — never outside it (no ``..``, no dot files,
    no symlink escaping it) — or None."""
    parts = path.split("/")
    if images_dir is None or not path or len(parts) > 8 or not all(_IMAGE_PART.match(p) for p in parts):
        return None
    root = Path(images_dir).resolve()
    found = (root / path).resolve()
    if not found.is_relative_to(root) or not found.is_file():
        return None
    return found


def create_app(settings: KariosSettings | None = None, config: ProvisionerConfig | None = None) -> FastAPI:
    settings = settings or KariosSettings()
    cfg = config or ProvisionerConfig.from_env(settings)
    rt = ServiceRuntime(SERVICE, settings, schema=SCHEMA, migrations=Path(__file__).parent / "migrations")
    assert rt.db is not None
    # A larger pool than the runtime's (see DB_POOL_SIZE); its engine has not connected yet.
    rt.db = Database(
        settings.database_url,
        pool_size=DB_POOL_SIZE,
        connect_timeout=settings.db_connect_timeout,
        command_timeout=settings.db_command_timeout,
    )
    media = MediaBuilder(cfg.cache_dir, cfg.media_dir)
    svc = JobService(rt.bus, rt.db, SecretBox.from_settings(settings), cfg, media)
    wire(rt.bus, svc)
    metrics.install(rt.registry, svc.methods)
    svc.bmcs.pins = TlsPins(rt.db)  # BMC TLS: trust on first use (drivers/tls.py)
    wire_tls_pins(rt.bus, svc.bmcs.pins)
    hardware = HardwareService(rt.bus, svc.bmcs, HardwareStore(rt.db), svc.driver_factory)
    wire_inspection(rt.bus, hardware)  # issue 27: inspection and the hardware record (inspect/)
    discovery = DiscoveryService(
        rt.bus,
        DiscoveryStore(rt.db),
        DiscoveryTokens.from_box(SecretBox.from_settings(settings)),
        f"{cfg.callback_url.rstrip('/')}/controlnode",
        list(cfg.nameservers),
    )
    wire_discovery(rt.bus, discovery)  # issue 27: unknown servers (inspect/discovery*.py)
    rotation = CredentialRotation(rt.bus, rt.db, SecretBox.from_settings(settings), svc.bmcs)
    wire_rotation(rt.bus, rotation)  # issue 27: BMC credential rotation (bmc/rotate.py)
    power = powersync.PowerSync(rt.bus, rt.db, svc.bmcs)  # issue 27: power-state sync
    firmware = FirmwareUpdates(
        rt.bus,
        rt.db,
        svc.bmcs,
        FirmwareStore(rt.db),
        cfg.media_url,
        lambda name: image_file(cfg.images_dir, name),
        svc.driver_factory,
    )
    wire_firmware(rt.bus, firmware)  # issue 27: firmware updates (firmware/)
    svc.firmware = firmware  # the policy: held updates run before the install
    powersync.install(rt.registry)
    images = ImageCatalog(ImageStore(rt.db), cfg.images_dir)  # served under /images like the rest
    svc.catalog = images.store  # a provision's `image`
    wire_images(rt.bus, images)  # issue 25: the OS image catalog (images/)

    async def image_sweep() -> None:
        while True:  # a registration whose provisioner died is failed by a live replica
            with contextlib.suppress(Exception):
                await images.sweep()
            await asyncio.sleep(60)

    async def on_start(_rt: ServiceRuntime) -> None:
        rt.state["stuck_task"] = asyncio.create_task(svc.stuck_loop())
        # Heartbeat our leases and resume jobs whose worker died (first sweep right away).
        rt.state["lease_task"] = asyncio.create_task(svc.lease_loop())
        if cfg.power_sync_interval > 0:
            rt.state["power_task"] = asyncio.create_task(power.loop())
        rt.state["image_sweep"] = asyncio.create_task(image_sweep())

    async def on_stop(_rt: ServiceRuntime) -> None:
        await cancel_and_wait(
            *(rt.state.pop(name, None) for name in ("stuck_task", "lease_task", "power_task", "image_sweep"))
        )
        await svc.stop()
        await hardware.stop()
        await firmware.stop()
        await images.stop()

    app = build_app(rt, title="Karios provisioner", on_start=on_start, on_stop=on_stop)
    app.state.jobs = svc
    app.state.hardware = hardware
    app.state.discovery = discovery
    app.state.rotation = rotation
    app.state.power_sync = power
    app.state.firmware = firmware
    app.state.images = images
    app.state.config = cfg
    # Outermost: /images and /media bodies leave by sendfile(2) under uvicorn (media/serve.py).
    app.add_middleware(ZeroCopySend, prefixes=("/images/", "/media/"))

    @app.api_route(
        "/media/{name}.iso",
        methods=["GET", "HEAD"],
        summary="A job's boot medium: the release's base ISO with the job's slot patched in "
        "(single-range requests, ETag, Last-Modified). Only by the signed URL the BMC was given, "
        "while the job consumes its medium: 403 MEDIA_URL_INVALID / MEDIA_URL_EXPIRED / MEDIA_JOB_ENDED",
        response_class=Response,
    )
    async def get_media(
        name: str,
        request: Request,
        expires: str | None = Query(
            None, alias=EXPIRES, description="Expiry of the signed URL (unix seconds)"
        ),
        signature: str | None = Query(None, alias=SIGNATURE, description="HMAC of the signed URL"),
    ) -> Response:
        if not _NAME.match(name):
            raise NotFound(f"no medium {name}")
        await svc.media_access.admit(name, expires, signature)
        served = await asyncio.to_thread(media.open, name)
        if served is not None:
            return medium_response(served, request, f"{name}.iso")
        legacy = media.legacy_iso(name)
        if legacy is None:
            raise NotFound(f"no medium {name}")
        return medium_response(ServedFile.of(legacy), request, f"{name}.iso")

    @app.api_route(
        "/images/{path:path}",
        methods=["GET", "HEAD"],
        summary="A prepared install-method artifact, e.g. a root filesystem archive "
        "(single-range requests as for /media, ETag, Last-Modified)",
        response_class=Response,
    )
    async def get_image(path: str, request: Request) -> Response:
        found = image_file(cfg.images_dir, path)
        if found is None:
            raise NotFound(f"no image {path}")
        return ranged_response(ServedFile.of(found), request, found.name, "application/octet-stream")

    @app.get(
        "/discovery/{token}/overlay.img",
        summary="The overlay of a discovery boot (the live environment's second initrd): its script "
        "reports the machine's hardware with this token. 401 DISCOVERY_TOKEN_INVALID / _EXPIRED",
        response_class=Response,
    )
    async def get_discovery_overlay(token: str) -> Response:
        body = discovery.overlay(token)
        return Response(body, media_type="application/octet-stream", headers={"Cache-Control": "no-store"})

    return app
