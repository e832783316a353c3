"""benchmarks/every_route.py's core with a few requests per route (issue 28, item 1): every
operation of the published OpenAPI document is exercised, and none answers a 5xx.

Gateway, inventory (a file inventory of the run's BMCs), provisioner and fabric-worker run
in-process on the real NATS and PostgreSQL, as in test_fuzz_gateway.py; the sushy-tools emulator
stands in for the BMCs the inspection routes reach. Timings are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import Counter

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from benchmarks.every_route import (
    BMC_PASSWORD,
    HANGING,
    OPS,
    Blackhole,
    World,
    emulator,
    fresh_needed,
    inventory,
    ip,
    measure_all,
    operations,
    run_wrk,
    seed,
    table,
)
from karios.api_gateway.app import create_app as gateway_app
from karios.common.discovery_token import DiscoveryTokens
from karios.fabric_worker.app import create_app as worker_app
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN, REQUIRE

REQUESTS, NODES, JOBS = 3, 12, 6


@pytest.fixture
def bmc():
    try:
        emu = emulator(1).start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        if REQUIRE:
            pytest.fail(f"sushy-tools emulator unavailable: {exc} — CI requires it", pytrace=False)
        pytest.skip(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


def test_every_operation_has_a_request():
    """Pure (in -m quick): each operation of docs/openapi/gateway.json has a request in
    benchmarks/every_route.py OPS, and no request outlives its route. A new route needs one."""
    assert sorted(operations()) == sorted(OPS)


@pytest.mark.slow  # a whole stack, seeded: about a minute
@pytest.mark.timeout(600)
async def test_every_route_exercised_without_server_errors(settings, serve, bmc, tmp_path):
    settings = settings.model_copy(update={"request_timeout": 30.0})  # a loaded CI machine
    tokens = DiscoveryTokens.from_settings(settings)

    async def discovery_token(mac: str) -> str:  # as bootapi issues it for an unknown MAC's boot
        return tokens.issue(mac, now=time.time())

    world = World(
        job_bmcs=[ip(1, k) for k in range(JOBS + fresh_needed(REQUESTS))],
        emulated=[ip(6, 0)],
        hanging=[ip(7, k) for k in range(HANGING)],
        discovery_token=discovery_token,
    )
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(inventory(world.job_bmcs + world.emulated + world.hanging)))
    hole = Blackhole()
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        images_dir=tmp_path / "images",
        install_method="preseed",
        mirror_host="127.0.0.1:9",  # closed: nothing is ever fetched
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=5,
        bmc_default_user="admin",
        bmc_default_password=BMC_PASSWORD,
    )
    cfg.bmc_endpoints = {
        world.emulated[0]: {
            "url": bmc.url,
            "system_id": bmc.system_ids[0],
            "username": bmc.username,
            "password": bmc.password,
        },
        **hole.endpoints(world.hanging),
    }
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inv})))
    prov = await serve(provisioner_app(settings, cfg))
    await serve(worker_app(settings))
    gw = await serve(gateway_app(settings))
    cfg.media_url, cfg.callback_url = prov.url, gw.url
    try:
        async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=120) as c:
            await seed(c, world, nodes=NODES, jobs=JOBS, requests=REQUESTS)
            rows = await measure_all(c, world, requests=REQUESTS, clients=2)
    finally:
        hole.close()
    print(table(rows))
    assert not [r.key for r in rows if r.skipped], table(rows)
    assert {r.key for r in rows} == set(operations())
    assert all(len(r.times) == min(REQUESTS, r.op.n or REQUESTS) for r in rows if r.op), table(rows)
    assert not [(r.key, dict(r.statuses)) for r in rows if r.server_errors], table(rows)
    assert not [(r.key, dict(r.statuses), r.errors) for r in rows if r.unexpected], table(rows)


@pytest.fixture
def wrk() -> str:
    found = shutil.which("wrk")
    if found is None:
        if REQUIRE:
            pytest.fail(
                "wrk is not installed (tests/lab/setup.sh installs it) — CI requires it", pytrace=False
            )
        pytest.skip("wrk is not installed (apt-get install wrk; tests/lab/setup.sh installs it)")
    return found


async def test_wrk_sends_each_prepared_request_once_or_cycles_and_counts_every_answer(serve, wrk):
    """The Lua script behind `every_route.py --connections`: a route whose requests use up what
    they name gets each prepared request exactly once (then "exhausted"); another cycles through
    them for the whole run; every answer's status and body are counted, the token and the JSON
    bodies arrive as prepared."""
    seen: Counter[tuple[str, str, str]] = Counter()

    async def echo(request: Request) -> JSONResponse:
        assert request.headers["authorization"] == "Bearer tok-1"
        body = (await request.body()).decode()
        seen[(request.method, request.url.path + "?" + request.url.query, body)] += 1
        return JSONResponse({"ok": True}, status_code=int(request.query_params.get("status", "200")))

    app = Starlette(routes=[Route("/r/{k}", echo, methods=["GET", "POST", "DELETE"])])
    url = (await serve(app)).url
    prepared = [("DELETE", f"/r/{k}?status={404 if k % 3 == 0 else 200}", None, {}) for k in range(10)] + [
        ("POST", "/r/b?status=202", '{"name":"x \\" y"}', {"X-Extra": "1"})
    ]

    once = await asyncio.to_thread(run_wrk, url, "tok-1", prepared, once=True, connections=4, seconds=1)
    assert once["exhausted"] is True
    assert sorted(seen.values()) == [1] * 11, seen  # every prepared request once, none again
    assert ("POST", "/r/b?status=202", '{"name":"x \\" y"}') in seen
    assert once["statuses"] == {"200": 6, "404": 4, "202": 1}, once  # every answer read, none more
    assert once["requests"] == 11 and once["socket_errors"] == once["timeouts"] == once["fillers"] == 0, once
    assert once["p99_us"] >= once["p50_us"] > 0

    seen.clear()
    cyc = await asyncio.to_thread(run_wrk, url, "tok-1", prepared[:2], once=False, connections=4, seconds=1)
    assert cyc["exhausted"] is False and cyc["requests"] > 20, cyc
    assert set(seen) == {("DELETE", "/r/0?status=404", ""), ("DELETE", "/r/1?status=200", "")}
    assert abs(seen[("DELETE", "/r/0?status=404", "")] - seen[("DELETE", "/r/1?status=200", "")]) <= 8
    assert set(cyc["statuses"]) == {"200", "404"} and sum(cyc["statuses"].values()) == cyc["requests"]
    assert cyc["body_bytes"] == cyc["requests"] * len(b'{"ok":true}')
