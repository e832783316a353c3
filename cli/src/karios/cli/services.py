"""The five services: how to build each one's app and which port setting it listens on."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str
    port_setting: str
    #: ``karios run``'s HTTP server unless ``--server``/``KARIOS_RUN_SERVER`` says otherwise: the
    #: gateway on granian (its answers' p99 at 100 connections: uvicorn 300-800 ms, granian
    #: 30-90 ms, benchmarks/hot_paths.py section 2); the provisioner on uvicorn (its zero-copy
    #: ``/media`` and ``/images`` need uvicorn's httptools transport); the rest as they were.
    server: str = "uvicorn"

    def create_app(self) -> FastAPI:
        return importlib.import_module(self.module).create_app()  # type: ignore[no-any-return]


SERVICES: dict[str, ServiceSpec] = {
    s.name: s
    for s in (
        ServiceSpec("inventory", "karios.inventory.app", "inventory_port"),
        ServiceSpec("provisioner", "karios.provisioner.app", "provisioner_port"),
        ServiceSpec("fabric-worker", "karios.fabric_worker.app", "fabric_worker_port"),
        ServiceSpec("bootapi", "karios.bootapi.app", "bootapi_port"),
        ServiceSpec("api-gateway", "karios.api_gateway.app", "gateway_port", server="granian"),
    )
}


def serves_tls(name: str, settings: Any) -> bool:
    """Whether service ``name`` serves HTTPS: the gateway with KARIOS_TLS_CERTFILE/_KEYFILE, the
    provisioner when KARIOS_PROVISIONER_TLS is set too (media and images, docs/operations.md)."""
    if settings.tls_certfile is None:
        return False
    return name == "api-gateway" or (name == "provisioner" and bool(settings.provisioner_tls))


def server_tls(name: str, settings: Any) -> dict[str, str]:
    """uvicorn's TLS arguments for service ``name`` (empty: plain HTTP)."""
    if not serves_tls(name, settings):
        return {}
    return {"ssl_certfile": str(settings.tls_certfile), "ssl_keyfile": str(settings.tls_keyfile)}
