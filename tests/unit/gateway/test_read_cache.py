"""Shared reads of the gateway (``karios.api_gateway.readcache``), on a real ASGI app (no servers):

- concurrent readers of one key share one load; a reader within the TTL gets the kept answer;
- after the TTL the next reader loads again; errors are never kept;
- any write through the app (POST, PUT, PATCH, DELETE) drops the kept answers before and after it
  runs, so a caller reads its own write at once; reads (GET, HEAD) do not;
- a relayed event drops the answers of its channels' namespaces (``fabric:…``, ``discovered:…``).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI, Request

from karios.api_gateway.readcache import InvalidateOnWrite, ReadCache, read_cache


class Source:
    """What the cache reads from: a value, a count of reads, and a gate to hold a read open.
    ``snapshot``: a read answers the value as it was when the read started (else when it ends)."""

    def __init__(self, snapshot: bool = False) -> None:
        self.value, self.reads, self.fail, self.snapshot = 0, 0, False, snapshot
        self.gate = asyncio.Event()
        self.gate.set()

    async def read(self) -> dict[str, int]:
        self.reads += 1
        taken = self.value
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("source down")
        return {"value": taken if self.snapshot else self.value}


def app_with(source: Source, ttl: float) -> FastAPI:
    app = FastAPI()
    app.state.read_cache = ReadCache(ttl=ttl)
    app.add_middleware(InvalidateOnWrite)

    @app.get("/thing")
    async def get_thing(request: Request) -> dict[str, int]:
        return await read_cache(request.app).get("thing", source.read)

    @app.post("/thing")
    async def set_thing(body: dict[str, int]) -> dict[str, int]:
        source.value = body["value"]
        return {"value": source.value}

    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_concurrent_readers_share_one_load_and_the_ttl_bounds_staleness():
    src = Source()
    async with client(app_with(src, ttl=0.3)) as c:
        src.gate.clear()
        pending = [asyncio.create_task(c.get("/thing")) for _ in range(20)]
        await asyncio.sleep(0.05)
        src.gate.set()
        answers = await asyncio.gather(*pending)
        assert [a.json() for a in answers] == [{"value": 0}] * 20
        assert src.reads == 1

        src.value = 7  # changed behind the gateway's back (another replica, a worker)
        assert (await c.get("/thing")).json() == {"value": 0}  # within the TTL: the kept answer
        assert src.reads == 1
        await asyncio.sleep(0.35)
        assert (await c.get("/thing")).json() == {"value": 7}  # past it: read again
        assert src.reads == 2


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_a_write_through_the_app_drops_kept_reads(method):
    src = Source()
    app = app_with(src, ttl=60)
    async with client(app) as c:
        assert (await c.get("/thing")).json() == {"value": 0}
        if method == "POST":
            assert (await c.post("/thing", json={"value": 5})).status_code == 200
            assert (await c.get("/thing")).json() == {"value": 5}  # its own write, at once
        else:
            src.value = 5
            assert (await c.request(method, "/thing")).status_code == 405  # not a route: still a write
            assert (await c.get("/thing")).json() == {"value": 5}
        assert src.reads == 2
        assert app.state.read_cache.loads == 2


async def test_reads_do_not_drop_and_errors_are_not_kept():
    src = Source()
    async with client(app_with(src, ttl=60)) as c:
        src.fail = True
        with pytest.raises(RuntimeError):
            await c.get("/thing")
        src.fail = False
        assert (await c.get("/thing")).json() == {"value": 0}  # the error was not kept
        await c.head("/thing")
        await c.get("/thing")
        assert src.reads == 2


async def test_a_kept_json_answer_is_encoded_once_and_matches_the_value():
    from karios.common.contracts.nodes import ComputeNode, ComputeNodePage

    cache = ReadCache(ttl=60)
    page = ComputeNodePage(items=[ComputeNode(node_ip="10.0.0.1", hostname="n1")], total=1, offset=0, limit=1)

    async def load() -> ComputeNodePage:
        return page

    first = await cache.response("p", load)
    second = await cache.response("p", load)
    assert first.media_type == "application/json" and first.body == second.body
    assert ComputeNodePage.model_validate_json(first.body) == page
    assert cache.loads == 1

    async def load_dict() -> dict:
        return {"entries": [{"job_id": "j", "position": 0}], "queued": 0, "active": 1}

    assert json.loads((await cache.response("q", load_dict)).body) == await load_dict()


async def test_a_relayed_event_drops_only_its_channels_namespaces():
    """``fabric:…`` answers are dropped by a fabric event (and ``discovered:…`` by a provision
    one), never the others; a load in flight when the event comes is answered but not kept."""
    cache = ReadCache(ttl=60, refresh_after=None)
    fabric, queue = Source(), Source()
    assert await cache.get("fabric:config", fabric.read) == {"value": 0}
    assert await cache.get("queue", queue.read) == {"value": 0}
    fabric.value = queue.value = 1
    cache.on_event(frozenset({"provision", "job:x"}))  # not a fabric event: both kept
    assert await cache.get("fabric:config", fabric.read) == {"value": 0}
    cache.on_event(frozenset({"fabric", "node:10.0.0.1"}))
    assert await cache.get("fabric:config", fabric.read) == {"value": 1}
    assert await cache.get("queue", queue.read) == {"value": 0}  # no namespace of its channel
    assert (fabric.reads, queue.reads) == (2, 1)

    fabric.gate.clear()  # a load in flight across an event: its readers get it, it is not kept
    fabric.value = 2
    cache.on_event(frozenset({"fabric"}))
    pending = asyncio.create_task(cache.get("fabric:config", fabric.read))
    await asyncio.sleep(0.01)
    cache.on_event(frozenset({"fabric"}))
    fabric.value = 3
    fabric.gate.set()
    assert (await pending)["value"] == 3
    fabric.value = 4
    assert await cache.get("fabric:config", fabric.read) == {"value": 4}

    discovered = Source()
    assert await cache.get("discovered::0:100", discovered.read) == {"value": 0}
    discovered.value = 5
    cache.on_event(frozenset({"provision"}))
    assert await cache.get("discovered::0:100", discovered.read) == {"value": 5}
