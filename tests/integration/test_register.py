"""The first slice end to end: gateway → inventory → bmc_infos → event → SSE."""

from __future__ import annotations

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.app import create_app as gateway_app
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.sse import open_sse


async def test_register_round_trip_reaches_sse_and_stores_encrypted(settings, serve):
    await serve(inventory_app(settings))
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        async with open_sse(c, "/controlnode/events?channel=provision") as stream:
            body = {
                "bmc_ip": "10.0.0.5",
                "os_hostname": "mgmt-01",
                "os_ip": "10.1.0.5",
                "bmc_username": "admin",
                "bmc_password": "bmc-s3cret",
                "os_password": "os-s3cret",
                "primary_mac": "AA-BB-CC-DD-EE-01",
            }
            r = await c.post("/controlnode/register", json=body, headers=ADMIN)
            assert r.status_code == 200, r.text
            assert r.json() == {
                "created": True,
                "hostname": "mgmt-01",
                "message": "node 10.0.0.5 registered",
                "node_ip": "10.1.0.5",
                "success": True,
            }
            events = await stream.collect(1)
        assert events[0].event == "node_registered"
        data = events[0].json()
        assert data["data"]["bmc_ip"] == "10.0.0.5" and data["data"]["created"] is True
        assert "s3cret" not in events[0].data

        r2 = await c.post(
            "/controlnode/register", json={"bmc_ip": "10.0.0.5", "os_ip": "10.1.0.6"}, headers=ADMIN
        )
        assert r2.status_code == 200 and r2.json()["created"] is False and r2.json()["node_ip"] == "10.1.0.6"
    eng = create_async_engine(settings.database_url)
    async with eng.connect() as conn:
        rows = (
            (await conn.execute(sa.text("SELECT * FROM inventory.bmc_infos WHERE bmc_ip = '10.0.0.5'")))
            .mappings()
            .all()
        )
    await eng.dispose()
    assert len(rows) == 1
    row = rows[0]
    assert row["primary_mac"] == "aa:bb:cc:dd:ee:01"
    assert row["os_hostname"] == "mgmt-01"  # kept from the first POST
    assert row["bmc_password_enc"].startswith("v1:k1:") and "bmc-s3cret" not in row["bmc_password_enc"]


async def test_register_rejects_bad_fields_with_422_naming_them(settings, serve):
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for body, field in (
            ({"bmc_ip": "10.0.0.999"}, "bmc_ip"),
            ({"bmc_ip": "10.0.0.1", "primary_mac": "zz"}, "primary_mac"),
            ({"bmc_ip": "10.0.0.1", "os_ip": "nope"}, "os_ip"),
            ({}, "bmc_ip"),
        ):
            r = await c.post("/controlnode/register", json=body, headers=ADMIN)
            assert r.status_code == 422, r.text
            assert r.json()["field"] == field


async def test_register_without_inventory_is_503_not_500(settings, serve):
    settings.request_timeout = 0.5
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/controlnode/register", json={"bmc_ip": "10.0.0.1"}, headers=ADMIN)
    assert r.status_code == 503
    assert r.json()["code"] == "SERVICE_UNAVAILABLE"


async def test_trace_context_flows_from_http_through_the_bus_into_the_event(settings, serve):
    await serve(inventory_app(settings))
    gw = await serve(gateway_app(settings))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with httpx.AsyncClient(base_url=gw.url) as c, open_sse(c, "/controlnode/events") as stream:
        r = await c.post(
            "/controlnode/register",
            json={"bmc_ip": "10.0.0.7"},
            headers={**ADMIN, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
        )
        assert r.status_code == 200
        [ev] = await stream.collect(1)
    env = ev.json()
    assert env["traceparent"].split("-")[1] == trace_id
    m = (await httpx.AsyncClient().get(f"{gw.url}/metrics")).text
    assert 'karios_http_requests_total{method="POST",route="/controlnode/register",status="200"} 1.0' in m
