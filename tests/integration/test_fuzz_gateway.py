"""Fuzz the live gateway from its published OpenAPI document (schemathesis, issue 12).

The gateway and inventory run in-process (real NATS and PostgreSQL); schemathesis runs as a
subprocess (its client is synchronous) with the admin token, bounded to 25 examples per
operation. Checks: no 5xx, and every response conforms to its documented schema.

Here: the operations that need no provisioner or fabric worker. The provisioning, callback and
fabric operations are fuzzed by ``test_fuzz_provisioning.py`` (a confined system with the
Redfish emulator), bootapi by ``test_fuzz_bootapi.py``; the SSE stream is left out (it never
ends). ``test_fuzz_counts_failures`` proves the runner reports what it finds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.app import create_app as gateway_app
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.fuzz import OPENAPI, run_schemathesis

EXCLUDE = (
    r"^/controlnode/(events|fabric-config.*|provision(/(cisco|dell|hp|lenovo|supermicro))?"
    r"|provision/queue|unprovision|firstboot|job/\{id\}/(cancel|complete|step))$"
)


async def _registered(url: str) -> set[str]:
    eng = create_async_engine(url)
    try:
        async with eng.connect() as conn:
            return set((await conn.execute(sa.text("SELECT bmc_ip FROM inventory.bmc_infos"))).scalars())
    finally:
        await eng.dispose()


async def _forget(url: str, bmc_ips: set[str]) -> None:
    """Fuzzed registrations must not outlive the test: other tests reach registered nodes."""
    eng = create_async_engine(url)
    try:
        async with eng.begin() as conn:
            await conn.execute(
                sa.text("DELETE FROM inventory.bmc_infos WHERE bmc_ip = ANY(:ips)"), {"ips": list(bmc_ips)}
            )
    finally:
        await eng.dispose()


@pytest.fixture
async def gateway_url(settings, serve) -> AsyncIterator[str]:
    await serve(inventory_app(settings))
    gw = await serve(gateway_app(settings))
    before = await _registered(settings.database_url)
    yield gw.url
    await _forget(settings.database_url, await _registered(settings.database_url) - before)


async def test_fuzz_gateway_no_server_errors_and_schema_conformant(gateway_url, tmp_path):
    result = await run_schemathesis(
        OPENAPI / "gateway.json", gateway_url, tmp_path, headers=ADMIN, exclude=EXCLUDE
    )
    print("gateway fuzz:", result.summary())
    assert len(result.operations) >= 7, result.operations  # the document was read and every operation ran
    assert result.generated > 100, result.text[-3000:]
    assert (result.server_errors, result.schema_failures) == (0, 0), result.text[-20000:]
    assert result.returncode == 0, result.text[-20000:]


class Item(BaseModel):
    name: str
    size: int


def _broken_app() -> FastAPI:
    app = FastAPI()

    @app.get("/crash/{n}", response_model=Item)
    async def crash(n: int) -> Item:
        if n % 2:
            raise HTTPException(500, "boom")
        return Item(name="ok", size=n)

    @app.get("/lies", response_model=Item)
    async def lies() -> Item:
        return Item.model_construct(name="x", size="not a number")  # type: ignore[arg-type]

    return app


async def test_fuzz_counts_failures(serve, tmp_path):
    """The runner can fail: a 500 and a body that breaks its schema are both counted."""
    app = _broken_app()
    schema = tmp_path / "openapi.json"
    schema.write_text(json.dumps(app.openapi()))
    running = await serve(app)
    result = await run_schemathesis(schema, running.url, tmp_path, headers={}, max_examples=10)
    assert len(result.operations) == 2 and result.returncode != 0, result.text[-3000:]
    assert result.server_errors >= 1 and result.schema_failures >= 1, result.text[-5000:]
