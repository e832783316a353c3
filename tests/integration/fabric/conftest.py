"""Fixtures: the real fabric-worker and gateway on the test's own bus prefix and database.
Shared names (tokens, BASE config) live in :mod:`tests.fixtures.fabric`."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.auth import Role, create_token
from karios.fabric_worker.app import create_app as worker_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import OPERATOR_TOKEN, VIEWER_TOKEN, forget_fabric_config, forget_jobs


@dataclass
class Fabric:
    client: httpx.AsyncClient
    worker: object
    gateway: object

    async def post(self, body: dict, headers: dict | None = None) -> httpx.Response:
        return await self.client.post("/controlnode/fabric-config", json=body, headers=headers or ADMIN)

    async def get(self, headers: dict | None = None) -> httpx.Response:
        return await self.client.get("/controlnode/fabric-config", headers=headers or ADMIN)


@pytest.fixture
async def fabric(settings, serve):
    # The worker migrates the module's database (fresh: no fabric schema before it starts); then
    # start from no configuration and no job, whatever an earlier test of the module left.
    worker = await serve(worker_app(settings))
    await forget_jobs(settings)
    await forget_fabric_config(settings)
    gw = await serve(gateway_app(settings))
    db = gw.app.state.runtime.db
    await create_token(db, "ops-olga", Role.operator, OPERATOR_TOKEN)
    await create_token(db, "viewer-vic", Role.viewer, VIEWER_TOKEN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        f = Fabric(c, worker, gw)
        yield f
        await c.delete("/controlnode/fabric-config", headers=ADMIN)
