"""The five services: how to build each one's app and which port setting it listens on."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from fastapi import FastAPI


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str
    port_setting: str

    def create_app(self) -> FastAPI:
        return importlib.import_module(self.module).create_app()  # type: ignore[no-any-return]


SERVICES: dict[str, ServiceSpec] = {
    s.name: s
    for s in (
        ServiceSpec("inventory", "karios.inventory.app", "inventory_port"),
        ServiceSpec("provisioner", "karios.provisioner.app", "provisioner_port"),
        ServiceSpec("fabric-worker", "karios.fabric_worker.app", "fabric_worker_port"),
        ServiceSpec("bootapi", "karios.bootapi.app", "bootapi_port"),
        ServiceSpec("api-gateway", "karios.api_gateway.app", "gateway_port"),
    )
}
