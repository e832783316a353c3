"""SSE resume with Last-Event-ID, channel filtering, and operator authentication."""

from __future__ import annotations

import asyncio
import json

import httpx

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.auth import Role, create_token
from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import NodeRegistered
from tests.conftest import ADMIN


async def collect(
    client: httpx.AsyncClient, url: str, n: int, headers: dict | None = None, timeout: float = 10
):
    out: list[dict] = []

    async def run() -> None:
        async with client.stream("GET", url, headers={**ADMIN, **(headers or {})}) as r:
            assert r.status_code == 200, await r.aread()
            cur: dict = {}
            async for line in r.aiter_lines():
                if line == "":
                    if "data" in cur:
                        out.append(cur)
                        if len(out) >= n:
                            return
                    cur = {}
                elif not line.startswith(":"):
                    k, _, v = line.partition(": ")
                    cur[k] = v

    await asyncio.wait_for(run(), timeout)
    return out


async def publish(bus: Bus, i: int, bmc: str = "10.0.0.1") -> None:
    await bus.publish_event(
        NodeRegistered(bmc_ip=bmc, created=True, hostname=f"n{i}"),
        bus.subjects.evt("inventory", "node.registered", bmc),
        entity=bmc,
    )


async def test_last_event_id_resumes_with_no_gap_and_no_duplicate(settings, serve):
    gw = await serve(gateway_app(settings))
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            first = asyncio.create_task(collect(c, "/controlnode/events", 2))
            await asyncio.sleep(0.3)
            for i in range(5):
                await publish(bus, i)
            got = await first  # client reads two then disconnects
            assert [json.loads(e["data"])["data"]["hostname"] for e in got] == ["n0", "n1"]
            last_id = got[-1]["id"]
            for i in range(5, 8):
                await publish(bus, i)
            resumed = await collect(c, "/controlnode/events", 6, headers={"Last-Event-ID": last_id})
            names = [json.loads(e["data"])["data"]["hostname"] for e in resumed]
            assert names == ["n2", "n3", "n4", "n5", "n6", "n7"]
            ids = [int(e["id"]) for e in resumed]
            assert ids == sorted(ids) and len(set(ids)) == 6 and ids[0] == int(last_id) + 1
    finally:
        await bus.stop()


async def test_channel_filter_only_delivers_matching_events(settings, serve):
    gw = await serve(gateway_app(settings))
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            task = asyncio.create_task(collect(c, "/controlnode/events?channel=node:10.0.0.2", 1))
            await asyncio.sleep(0.3)
            await publish(bus, 1, bmc="10.0.0.1")
            await publish(bus, 2, bmc="10.0.0.2")
            [ev] = await task
            assert json.loads(ev["data"])["data"]["bmc_ip"] == "10.0.0.2"
            r = await c.get("/controlnode/events?channel=bogus", headers=ADMIN)
            assert r.status_code == 422 and r.json()["field"] == "channel"
    finally:
        await bus.stop()


async def test_tokens_401_without_or_with_bad_token_403_with_too_low_role(settings, serve):
    app = gateway_app(settings)
    gw = await serve(app)
    viewer = await create_token(app.state.runtime.db, "ui-viewer", Role.viewer)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        r = await c.post("/controlnode/register", json={"bmc_ip": "10.0.0.1"})
        assert r.status_code == 401
        r = await c.post(
            "/controlnode/register",
            json={"bmc_ip": "10.0.0.1"},
            headers={"Authorization": "Bearer kt_not-a-real-token"},
        )
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
        r = await c.post(
            "/controlnode/register",
            json={"bmc_ip": "10.0.0.1"},
            headers={"Authorization": f"Bearer {viewer}"},
        )
        assert r.status_code == 403 and "operator" in r.json()["message"]
        r = await c.get("/readyz")
        assert r.status_code == 200 and r.json()["checks"] == {"bus": True, "database": True}
        assert (await c.get("/metrics")).status_code == 200


async def test_slow_client_is_told_to_reconnect(settings, serve):
    settings.sse_queue_size = 3
    app = gateway_app(settings)
    await serve(app)
    relay = app.state.relay
    gen = relay.stream(None, None)
    assert (await gen.__anext__()).startswith(b"retry:")
    waiter = asyncio.create_task(gen.__anext__())  # registers the client, waits for an event
    await asyncio.sleep(0.1)
    [client] = list(relay.clients)
    bus = Bus.from_settings(settings, "test-publisher")
    await bus.start()
    try:
        for i in range(10):
            await publish(bus, i)
        first = await asyncio.wait_for(waiter, 5)
        assert first.startswith(b"id: ")
        await asyncio.sleep(0.5)
        assert client.overflowed and client.queue.qsize() <= 3
        rest = [await asyncio.wait_for(gen.__anext__(), 5)]
        assert rest[0].startswith(b"event: reconnect")
    finally:
        await gen.aclose()
        await bus.stop()
    assert not relay.clients
