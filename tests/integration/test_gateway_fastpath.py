"""The gateway's fast reads (``karios.api_gateway.fastpath``) answer exactly what FastAPI answers.

Two gateway replicas on the same NATS, PostgreSQL, inventory and provisioner: ``plain`` without
the fast path (every request through FastAPI) and ``fast`` with it. For the shared reads here —
``/controlnode/provision/queue``, ``/controlnode/nodes`` (any query string FastAPI answers),
``/controlnode/nodes/{node_ip}`` — the fast replica's answer (status, body bytes, every header
but ``date``) equals the plain one's, for an admin and a viewer token, no token, a bad token, a
revoked one, another scheme, and query strings; ``karios_gateway_fast_reads_total`` shows which
answers the fast path gave (a valid token on a kept answer of a target FastAPI answered from a
shared read before) and which it left to FastAPI (every error, every route without a shared
read such as ``/controlnode/tokens/self``). A write through the fast replica is visible to its
next read at once, and the fast answers are counted in ``karios_http_requests_total`` under the
route's template.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import httpx
import pytest
from fastapi import Depends
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Counter, Histogram

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.auth import Role, TokenCache, create_token, require
from karios.api_gateway.fastpath import FastReads, fast_reads_counter
from karios.api_gateway.readcache import ANSWERED_FROM, QUEUE_KEY, ReadCache
from karios.common.service import HttpMetrics
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import retire_leftover_jobs

pytestmark = pytest.mark.integration

NODES = [("10.77.0.1", "10.78.0.1"), ("10.77.0.2", "10.78.0.2"), ("10.77.0.3", "10.78.0.3")]


@dataclass
class Replicas:
    plain: httpx.AsyncClient
    fast: httpx.AsyncClient
    fast_app: object
    viewer: dict[str, str]
    viewer_name: str

    def fast_count(self, route: str) -> float:
        registry = self.fast_app.state.runtime.registry  # type: ignore[attr-defined]
        return registry.get_sample_value("karios_gateway_fast_reads_total", {"route": route}) or 0.0

    def http_count(self, route: str) -> float:
        registry = self.fast_app.state.runtime.registry  # type: ignore[attr-defined]
        labels = {"route": route, "method": "GET", "status": "200"}
        return registry.get_sample_value("karios_http_requests_total", labels) or 0.0


def answer(r: httpx.Response) -> tuple[int, bytes, dict[str, str]]:
    """What a client sees: status, body bytes and headers (``date`` differs by the second, the
    correlation id per request: each answer names one)."""
    assert r.headers.get("x-correlation-id")
    return (
        r.status_code,
        r.content,
        {k: v for k, v in r.headers.items() if k not in ("date", "x-correlation-id")},
    )


@pytest.fixture
async def replicas(settings, serve, tmp_path):
    await retire_leftover_jobs(settings.database_url)
    await serve(inventory_app(settings))
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache", media_dir=tmp_path / "media", images_dir=tmp_path / "images"
    )
    await serve(provisioner_app(settings, cfg))
    plain_app = gateway_app(settings, fast_reads=False)
    plain = await serve(plain_app)
    fast_app = gateway_app(settings, fast_reads=True)
    fast = await serve(fast_app)
    name = f"fp-viewer-{uuid.uuid4().hex[:8]}"
    viewer = await create_token(fast_app.state.runtime.db, name, Role.viewer)
    async with (
        httpx.AsyncClient(base_url=plain.url, timeout=10) as pc,
        httpx.AsyncClient(base_url=fast.url, timeout=10) as fc,
    ):
        for bmc, os_ip in NODES:
            body = {"bmc_ip": bmc, "os_ip": os_ip, "vendor": "generic"}
            r = await fc.post("/controlnode/register", json=body, headers=ADMIN)
            assert r.status_code == 200, r.text
        yield Replicas(pc, fc, fast_app, {"Authorization": f"Bearer {viewer}"}, name)


async def fast_answer(rep: Replicas, route: str, url: str, headers: dict[str, str]) -> httpx.Response:
    """The fast replica's answer given by the fast path: the first read of a pair may go through
    FastAPI (and fill the caches); the second, within the read cache's 250 ms, is the fast one."""
    for _ in range(5):
        await rep.fast.get(url, headers=headers)
        fast, counted = rep.fast_count(route), rep.http_count(route)
        r = await rep.fast.get(url, headers=headers)
        if rep.fast_count(route) == fast + 1:
            assert rep.http_count(route) == counted + 1  # in the request metrics like any answer
            return r
    raise AssertionError(f"the fast path never answered GET {url}")


async def same_as_plain(rep: Replicas, url: str, headers: dict[str, str]) -> httpx.Response:
    """GET ``url`` on both replicas: identical answers, none of them given by the fast path."""
    counts = {route: rep.fast_count(route) for route in ROUTES.values()}
    r = await rep.fast.get(url, headers=headers)
    assert answer(r) == answer(await rep.plain.get(url, headers=headers)), url
    assert {route: rep.fast_count(route) for route in ROUTES.values()} == counts, f"fast path answered {url}"
    return r


QUEUE = "/controlnode/provision/queue"
ROUTES = {
    QUEUE: QUEUE,
    "/controlnode/nodes": "/controlnode/nodes",
    "/controlnode/nodes/10.78.0.2": "/controlnode/nodes/{node_ip}",
}


@pytest.mark.parametrize("who", ["admin", "viewer"])
async def test_a_valid_token_gets_the_routes_own_answer_from_the_fast_path(replicas, who):
    rep = replicas
    headers = ADMIN if who == "admin" else rep.viewer
    for url, route in ROUTES.items():
        fast = await fast_answer(rep, route, url, headers)
        plain = await rep.plain.get(url, headers=headers)
        assert plain.status_code == 200, plain.text
        assert answer(fast) == answer(plain), url
        assert fast.headers["content-type"] == "application/json"
    # No shared read behind it: always FastAPI's (only the token check, p99 within its limit).
    await rep.fast.get("/controlnode/tokens/self", headers=headers)
    me = (await same_as_plain(rep, "/controlnode/tokens/self", headers)).json()
    assert me == (
        {"name": "bootstrap-admin", "role": "fabric_admin"}
        if who == "admin"
        else {"name": rep.viewer_name, "role": "viewer"}
    )
    nodes = (await fast_answer(rep, "/controlnode/nodes", "/controlnode/nodes", headers)).json()
    assert {n["node_ip"] for n in nodes["items"]} >= {os_ip for _, os_ip in NODES}


async def test_every_refusal_is_fastapis_own(replicas):
    rep = replicas
    refusals = {
        "no token": {},
        "bad token": {"Authorization": "Bearer kt_not-a-real-token"},
        "bearer, no token": {"Authorization": "Bearer"},
        "lower-case scheme, bad token": {"Authorization": "bearer kt_nope"},
        "another scheme": {"Authorization": "Basic " + ADMIN["Authorization"].split()[1]},
    }
    for url in ROUTES:
        await fast_answer(rep, ROUTES[url], url, ADMIN)  # the answers are kept: only the token differs
        for what, headers in refusals.items():
            r = await same_as_plain(rep, url, headers)
            assert r.status_code == 401, (url, what, r.text)
            assert r.json()["code"] == "UNAUTHORIZED"


async def test_a_revoked_token_is_refused_at_once(replicas):
    rep = replicas
    name = f"fp-gone-{uuid.uuid4().hex[:8]}"
    r = await rep.fast.post("/controlnode/tokens", json={"name": name, "role": "operator"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    headers = {"Authorization": f"Bearer {r.json()['token']}"}
    assert (await rep.fast.get("/controlnode/tokens/self", headers=headers)).status_code == 200  # kept now
    await fast_answer(rep, QUEUE, QUEUE, headers)  # and answered fast
    assert (await rep.fast.delete(f"/controlnode/tokens/{name}", headers=ADMIN)).status_code == 200
    for url in ROUTES:
        r = await same_as_plain(rep, url, headers)
        assert r.status_code == 401 and r.json()["message"] == "invalid or revoked token"


async def test_query_strings_are_answered_alike(replicas):
    rep = replicas
    handled = [  # FastAPI answers each from a shared page; the fast path then answers it alike
        "/controlnode/nodes?limit=2",
        "/controlnode/nodes?offset=1&limit=1",
        "/controlnode/nodes?offset=0",
        "/controlnode/nodes?limit=02",
        "/controlnode/nodes?limit=1&limit=2",
        "/controlnode/nodes?limit=2&unknown=1",
        "/controlnode/provision/queue?access_token=kt_x",
    ]
    for url in handled:
        fast = await fast_answer(rep, ROUTES[url.split("?")[0]], url, ADMIN)
        assert answer(fast) == answer(await rep.plain.get(url, headers=ADMIN)), url
    assert len((await rep.fast.get("/controlnode/nodes?limit=2", headers=ADMIN)).json()["items"]) == 2
    left_to_fastapi = [
        "/controlnode/nodes?limit=0",  # 422
        "/controlnode/nodes?limit=1001",  # 422
        "/controlnode/nodes?limit=abc",  # 422
        "/controlnode/nodes?offset=-1",  # 422
        "/controlnode/tokens/self?verbose=1",  # no shared read
        "/controlnode/nodes/not-an-ip",  # 422
        "/controlnode/nodes/10.78.9.9",  # 404, never kept
    ]
    for url in left_to_fastapi:
        await rep.fast.get(url, headers=ADMIN)  # FastAPI answered it once: nothing to learn
        await same_as_plain(rep, url, ADMIN)
    statuses = {url: (await rep.fast.get(url, headers=ADMIN)).status_code for url in left_to_fastapi[:4]}
    assert set(statuses.values()) == {422}


async def test_a_write_is_visible_to_the_next_fast_read(replicas):
    rep = replicas
    before = (await fast_answer(rep, "/controlnode/nodes", "/controlnode/nodes", ADMIN)).json()
    assert "10.78.0.9" not in {n["node_ip"] for n in before["items"]}
    body = {"bmc_ip": "10.77.0.9", "os_ip": "10.78.0.9", "vendor": "generic"}
    assert (await rep.fast.post("/controlnode/register", json=body, headers=ADMIN)).status_code == 200
    after = (await rep.fast.get("/controlnode/nodes", headers=ADMIN)).json()  # at once, not in 250 ms
    assert "10.78.0.9" in {n["node_ip"] for n in after["items"]}
    assert after["total"] == before["total"] + 1
    fast = await fast_answer(rep, "/controlnode/nodes", "/controlnode/nodes", ADMIN)
    assert fast.json() == after


async def test_a_role_below_the_routes_falls_through(replicas):
    """The fast path applies the least role of the route FastAPI answered the target with (here
    a route that would need operator): learnt from the route, not written by hand."""
    rep = replicas
    tokens: TokenCache = rep.fast_app.state.token_cache  # type: ignore[attr-defined]
    viewer = rep.viewer["Authorization"].split()[1]
    assert (await tokens.authenticate(viewer)) is not None  # verified and kept
    reads = ReadCache(ttl=60)

    async def queue() -> dict:
        return {"entries": []}

    await reads.response(QUEUE_KEY, queue)
    seen: list[str] = []

    def layer(role: Role) -> FastReads:
        route = APIRoute(QUEUE, queue, dependencies=[Depends(require(role))])

        async def fastapi(scope, receive, send):  # type: ignore[no-untyped-def]
            seen.append(scope["path"])  # as FastAPI would: the route it chose, the key it answered from
            scope["route"], scope[ANSWERED_FROM] = route, QUEUE_KEY
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        registry = CollectorRegistry()
        metrics = HttpMetrics(
            Counter("r", "r", ["route", "method", "status"], registry=registry),
            Histogram("d", "d", ["route", "method"], registry=registry),
        )
        return FastReads(
            fastapi, tokens=tokens, reads=reads, metrics=metrics, answered=fast_reads_counter(registry)
        )

    headers = {"Authorization": f"Bearer {viewer}"}
    for role, through in ((Role.operator, [QUEUE, QUEUE]), (Role.viewer, [QUEUE])):
        seen.clear()
        transport = httpx.ASGITransport(app=layer(role))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            first = await c.get(QUEUE, headers=headers)  # through "FastAPI": learnt
            second = await c.get(QUEUE, headers=headers)
        assert (first.status_code, second.status_code) == (200, 200)
        assert seen == through, role
        if role is Role.viewer:
            assert second.content == b'{"entries":[]}'  # the kept answer, not the route's
