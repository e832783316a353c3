"""bootapi service (capabilities land with their issues)."""

from __future__ import annotations

from fastapi import FastAPI

from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings

SERVICE = "bootapi"


def create_app(settings: KariosSettings | None = None) -> FastAPI:
    settings = settings or KariosSettings()
    rt = ServiceRuntime(SERVICE, settings)
    return build_app(rt, title="Karios bootapi")
