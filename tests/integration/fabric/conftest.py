"""Fixtures: the real fabric-worker and gateway on the test's own bus prefix and database."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.auth import Role, create_token
from karios.fabric_worker.app import create_app as worker_app
from tests.conftest import ADMIN

OPERATOR_TOKEN = "kt_test-operator-token"
VIEWER_TOKEN = "kt_test-viewer-token"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}


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
    worker = await serve(worker_app(settings))
    gw = await serve(gateway_app(settings))
    db = gw.app.state.runtime.db
    await create_token(db, "ops-olga", Role.operator, OPERATOR_TOKEN)
    await create_token(db, "viewer-vic", Role.viewer, VIEWER_TOKEN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        f = Fabric(c, worker, gw)
        yield f
        await c.delete("/controlnode/fabric-config", headers=ADMIN)


BASE = {
    "as": 65000,
    "fabric_switch_as": 65000,
    "fabric_switch_name": "leaf-01",
    "fabric_switch_nos": "eos",
    "fabric_switch_peering_ip": "10.255.0.254",
    "fabric_switch_role": "leaf",
    "management_cidr": "192.168.111.0/24",
    "router_id_cidr": "10.255.0.1/24",
    "vxlan_mtu": 9216,
    "expected_nodes": 12,
    "expected_vms": 300,
    "ospf_enabled": True,
    "ospf_area": "0.0.0.0",
    "bfd_enabled": True,
}
