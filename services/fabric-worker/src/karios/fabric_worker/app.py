"""Fabric worker: the fabric configuration (``config/``) and its rollout to the compute nodes
(``rollout/``), both answered on the bus; this module only wires them into a service."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from fastapi import FastAPI

from karios.common.crypto import SecretBox
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings
from karios.fabric_worker import metrics
from karios.fabric_worker.config.handlers import register_config
from karios.fabric_worker.models import SCHEMA
from karios.fabric_worker.rollout import recovery
from karios.fabric_worker.rollout.drift_watch import DriftWatch
from karios.fabric_worker.rollout.handlers import register_rollout
from karios.fabric_worker.settings import FabricWorkerSettings

SERVICE = "fabric-worker"


def create_app(
    settings: KariosSettings | None = None, *, rollout_settings: FabricWorkerSettings | None = None
) -> FastAPI:
    settings = settings or KariosSettings()
    rt = ServiceRuntime(SERVICE, settings, schema=SCHEMA, migrations=Path(__file__).parent / "migrations")
    metrics.install(rt.registry)
    box = SecretBox.from_settings(settings)
    rollout = register_rollout(rt, box, rollout_settings or FabricWorkerSettings())
    register_config(rt, box, rollout)
    watch = DriftWatch(rollout)

    rt.extra_checks["outbox"] = rollout.outbox.healthy

    async def on_start(_rt: ServiceRuntime) -> None:
        await rollout.outbox.start()  # relays commands an earlier process committed but never sent
        await rollout.start(partial(recovery.recover_stale, rollout))  # jobs a dead replica left running
        watch.start()

    async def on_stop(_rt: ServiceRuntime) -> None:
        await watch.stop()
        await rollout.stop()
        await rollout.outbox.stop()

    app = build_app(rt, title="Karios fabric-worker", on_start=on_start, on_stop=on_stop)
    app.state.rollout = rollout
    app.state.drift = watch
    return app
