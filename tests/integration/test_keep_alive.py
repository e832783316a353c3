"""An idle keep-alive connection outlives the client's own idle limit (httpx: 5 s).

With equal limits on both ends a client reuses a connection at the moment the server closes it
and gets no answer at all: ``httpx.ReadError`` on a ``POST /controlnode/tokens`` it cannot
safely retry (the cold CI run of 2026-12-05, under load). Every service's uvicorn keeps idle
connections ``SERVER_KEEP_ALIVE_S`` (75 s): ``karios run``, bootapi's listeners and the tests'
servers alike; granian (the gateway's and bootapi's default) closes no idle connection.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from karios.bootapi.listeners import GranianListener, build_servers
from karios.bootapi.settings import BootapiSettings
from karios.common.http import SERVER_KEEP_ALIVE_S
from tests.fixtures.apps import free_port, start_app

pytestmark = pytest.mark.integration


def _local_port(r: httpx.Response) -> int:
    return int(r.extensions["network_stream"].get_extra_info("socket").getsockname()[1])


async def test_a_connection_idle_past_httpx_default_is_still_served():
    assert httpx.Limits().keepalive_expiry + 55 < SERVER_KEEP_ALIVE_S  # also above balancers' 60 s
    app = Starlette(routes=[Route("/", lambda _r: PlainTextResponse("ok"))])
    running = await start_app(app)
    try:
        async with httpx.AsyncClient(base_url=running.url, limits=httpx.Limits(keepalive_expiry=60)) as c:
            first = await c.get("/")
            port = _local_port(first)
            await asyncio.sleep(6.5)  # past uvicorn's default of 5 s
            second = await c.get("/")
            assert first.text == second.text == "ok"
            assert _local_port(second) == port, "the server closed the idle connection"
    finally:
        await running.stop()


def test_bootapi_uvicorn_listeners_keep_idle_connections(settings):
    boot = BootapiSettings(_env_file=None, server="uvicorn", listen_addr="127.0.0.1:0")  # type: ignore[call-arg]
    servers = build_servers(settings, boot)
    assert [s.config.timeout_keep_alive for s in servers] == [SERVER_KEEP_ALIVE_S]  # type: ignore[attr-defined]


async def test_granian_listener_keeps_idle_connections():
    """The gateway runs on granian (``karios run``'s default for it): it closes no idle
    connection either (granian has no idle timeout on HTTP/1 keep-alive)."""
    app = Starlette(routes=[Route("/", lambda _r: PlainTextResponse("ok"))])
    port = free_port()
    listener = GranianListener(app, "127.0.0.1", port, lifespan=False, threads=1)
    task = asyncio.create_task(listener.serve())
    try:
        for _ in range(200):
            if listener.started:
                break
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", limits=httpx.Limits(keepalive_expiry=60)
        ) as c:
            first = await c.get("/")
            port_used = _local_port(first)
            await asyncio.sleep(6.5)
            second = await c.get("/")
            assert first.text == second.text == "ok"
            assert _local_port(second) == port_used, "the server closed the idle connection"
    finally:
        listener.should_exit = True
        await asyncio.wait_for(task, 30)
