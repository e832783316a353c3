"""Fabric worker: fabric configuration, plans, switch configs and the VTEP pool.

Answers request/reply on ``req.fabric.*`` (writes) and ``q.fabric.*`` (reads); the
rollout (apply/teardown commands) builds on it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from karios.common.contracts.fabric import (
    AllocateVtep,
    DeleteFabricConfig,
    DeleteResult,
    FabricConfigQuery,
    FabricConfigView,
    FabricPlan,
    FabricPlanRequest,
    ReleaseVtep,
    UpsertFabricConfig,
    VtepAllocation,
    VtepPoolQuery,
    VtepPoolStatus,
)
from karios.common.crypto import SecretBox
from karios.common.errors import NotFound
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings
from karios.fabric_worker import store
from karios.fabric_worker.models import SCHEMA
from karios.fabric_worker.plan import plan_fabric
from karios.fabric_worker.rollout_service import RolloutSettings, register_rollout

SERVICE = "fabric-worker"


def create_app(
    settings: KariosSettings | None = None, *, rollout_settings: RolloutSettings | None = None
) -> FastAPI:
    settings = settings or KariosSettings()
    rt = ServiceRuntime(SERVICE, settings, schema=SCHEMA, migrations=Path(__file__).parent / "migrations")
    box = SecretBox.from_settings(settings)
    rollout = register_rollout(rt, box, rollout_settings)
    subjects = rt.bus.subjects

    def db():  # type: ignore[no-untyped-def]
        assert rt.db is not None
        return rt.db

    async def upsert_config(req: UpsertFabricConfig) -> FabricConfigView:
        async with db().session() as s, s.begin():
            return await store.upsert(s, req, box)

    async def get_config(_q: FabricConfigQuery) -> FabricConfigView:
        async with db().session() as s:
            row = await store.load(s)
        if row is None:
            raise NotFound("no fabric configuration is stored")
        return await rollout.decorate(store.view_of(row))

    async def delete_config(q: DeleteFabricConfig) -> DeleteResult:
        return await rollout.delete_config(q.caller)  # 409 while a job runs; teardown is a command

    async def plan(req: FabricPlanRequest) -> FabricPlan:
        return plan_fabric(req)

    async def vtep_pool(_q: VtepPoolQuery) -> VtepPoolStatus:
        async with db().session() as s:
            return await store.pool_status(s)

    async def allocate_vtep(req: AllocateVtep) -> VtepAllocation:
        async with db().session() as s, s.begin():
            return await store.allocate(s, req.node_ip)

    async def release_vtep(req: ReleaseVtep) -> VtepAllocation:
        async with db().session() as s, s.begin():
            return await store.release(s, req.node_ip)

    rt.bus.query_responder(subjects.request("fabric", "upsert_config"), UpsertFabricConfig, upsert_config)
    rt.bus.query_responder(subjects.request("fabric", "delete_config"), DeleteFabricConfig, delete_config)
    rt.bus.query_responder(subjects.request("fabric", "allocate_vtep"), AllocateVtep, allocate_vtep)
    rt.bus.query_responder(subjects.request("fabric", "release_vtep"), ReleaseVtep, release_vtep)
    rt.bus.query_responder(subjects.query("fabric", "config"), FabricConfigQuery, get_config)
    rt.bus.query_responder(subjects.query("fabric", "plan"), FabricPlanRequest, plan)
    rt.bus.query_responder(subjects.query("fabric", "vtep_pool"), VtepPoolQuery, vtep_pool)

    async def on_start(_rt: ServiceRuntime) -> None:
        await rollout.start()  # recovers jobs a dead replica left running

    async def on_stop(_rt: ServiceRuntime) -> None:
        await rollout.stop()

    app = build_app(rt, title="Karios fabric-worker", on_start=on_start, on_stop=on_stop)
    app.state.rollout = rollout
    return app
