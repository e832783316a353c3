"""A request that was sent but not answered in time says its outcome is unknown (and how to check)."""

from __future__ import annotations

import asyncio

import httpx

from karios.api_gateway.app import create_app as gateway_app
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import RegisterNode, RegisterNodeResult
from tests.fixtures.apps import ADMIN


async def test_register_unanswered_in_time_says_it_may_have_been_applied(settings, serve):
    settings.request_timeout = 1.0
    applied: list[str] = []
    slow = Bus.from_settings(settings, "inventory")

    async def register_slowly(cmd: RegisterNode) -> RegisterNodeResult:
        applied.append(str(cmd.bmc_ip))  # the "commit" happens...
        await asyncio.sleep(3)  # ...but the answer comes after the gateway stopped waiting
        return RegisterNodeResult(created=True, hostname="h", node_ip="", bmc_ip=str(cmd.bmc_ip))

    slow.query_responder(slow.subjects.request("inventory", "register_node"), RegisterNode, register_slowly)
    await slow.start()
    try:
        gw = await serve(gateway_app(settings))
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            r = await c.post("/controlnode/register", json={"bmc_ip": "10.7.0.1"}, headers=ADMIN)
        assert applied == ["10.7.0.1"]
        assert r.status_code == 503 and r.headers["Retry-After"]
        body = r.json()
        assert body["details"] == {"outcome": "unknown", "bmc_ip": "10.7.0.1"}
        assert "may have been registered" in body["message"] and "retrying is safe" in body["message"]
    finally:
        await slow.stop()
