"""Provisioner: provision/unprovision jobs, boot media (served here with range requests), BMC drivers."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response

from karios.common.crypto import SecretBox
from karios.common.db import Database
from karios.common.errors import NotFound
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings
from karios.common.tasks import cancel_and_wait
from karios.provisioner import metrics
from karios.provisioner.bmc.tlspins import TlsPins, wire_tls_pins
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.handlers import wire
from karios.provisioner.jobs.service import JobService
from karios.provisioner.media import MediaBuilder
from karios.provisioner.media.serve import ServedFile, medium_response, ranged_response
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

    async def on_start(_rt: ServiceRuntime) -> None:
        rt.state["stuck_task"] = asyncio.create_task(svc.stuck_loop())
        # Heartbeat our leases and resume jobs whose worker died (first sweep right away).
        rt.state["lease_task"] = asyncio.create_task(svc.lease_loop())

    async def on_stop(_rt: ServiceRuntime) -> None:
        await cancel_and_wait(*(rt.state.pop(name, None) for name in ("stuck_task", "lease_task")))
        await svc.stop()

    app = build_app(rt, title="Karios provisioner", on_start=on_start, on_stop=on_stop)
    app.state.jobs = svc
    app.state.config = cfg

    @app.api_route(
        "/media/{name}.iso",
        methods=["GET", "HEAD"],
        summary="A job's boot medium: the release's base ISO with the job's slot patched in "
        "(single-range requests, ETag, Last-Modified)",
        response_class=Response,
    )
    async def get_media(name: str, request: Request) -> Response:
        served = await asyncio.to_thread(media.open, name) if _NAME.match(name) else None
        if served is not None:
            return medium_response(served, request, f"{name}.iso")
        legacy = media.legacy_iso(name) if _NAME.match(name) else None
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

    return app
