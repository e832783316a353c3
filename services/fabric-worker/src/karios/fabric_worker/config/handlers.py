"""Bus wiring of the fabric configuration: ``req.fabric.*`` writes, ``q.fabric.*`` reads.
Each handler takes its typed contract model and is one store call (or the pure planner)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

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
from karios.common.service import ServiceRuntime
from karios.fabric_worker.config import store
from karios.fabric_worker.config.plan import plan_fabric
from karios.fabric_worker.rollout import teardown
from karios.fabric_worker.rollout.service import RolloutService


def register_config(rt: ServiceRuntime, box: SecretBox, rollout: RolloutService) -> None:
    def db():  # type: ignore[no-untyped-def]
        assert rt.db is not None
        return rt.db

    async def upsert_config(req: UpsertFabricConfig) -> FabricConfigView:
        async with db().session() as s, s.begin():
            return await store.upsert(s, req, box)

    async def get_config(_q: FabricConfigQuery) -> FabricConfigView:
        async with db().session() as s:
            row = await store.load(s, preflight=False)
        if row is None:
            raise NotFound("no fabric configuration is stored")
        return await rollout.decorate(store.view_of(row))

    async def delete_config(q: DeleteFabricConfig) -> DeleteResult:
        return await teardown.delete_config(rollout, q.caller)  # 409 while a job runs; teardown is a command

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

    sub = rt.bus.subjects
    routes: list[tuple[str, type, Callable[..., Awaitable]]] = [
        (sub.request("fabric", "upsert_config"), UpsertFabricConfig, upsert_config),
        (sub.request("fabric", "delete_config"), DeleteFabricConfig, delete_config),
        (sub.request("fabric", "allocate_vtep"), AllocateVtep, allocate_vtep),
        (sub.request("fabric", "release_vtep"), ReleaseVtep, release_vtep),
        (sub.query("fabric", "config"), FabricConfigQuery, get_config),
        (sub.query("fabric", "plan"), FabricPlanRequest, plan),
        (sub.query("fabric", "vtep_pool"), VtepPoolQuery, vtep_pool),
    ]
    for subject, model, handler in routes:
        rt.bus.query_responder(subject, model, handler)
