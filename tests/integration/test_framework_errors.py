"""Issue 24 D9: every error the framework raises (no route, wrong method, OPTIONS, a body that is
not UTF-8) answers the documented ``ErrorResponse`` with a ``code``, from the real gateway and
inventory (both built by ``build_app``, so every service answers the same)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN

pytestmark = pytest.mark.integration

JSON = {**ADMIN, "Content-Type": "application/json"}


@pytest.fixture
async def urls(settings, serve) -> AsyncIterator[dict[str, str]]:
    inv = await serve(inventory_app(settings))
    gw = await serve(gateway_app(settings))
    yield {"gateway": gw.url, "inventory": inv.url}


def _error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"], body
    assert body["retryable"] is False, body
    return body


@pytest.mark.parametrize("service", ["gateway", "inventory"])
async def test_unknown_path_is_404_not_found(urls, service):
    async with httpx.AsyncClient(base_url=urls[service], timeout=30) as c:
        body = _error(await c.get("/no/such/route", headers=ADMIN), 404, "NOT_FOUND")
    assert "/no/such/route" in body["message"]


async def test_options_and_a_wrong_method_name_every_method_of_the_path(urls):
    async with httpx.AsyncClient(base_url=urls["gateway"], timeout=30) as c:
        for method in ("OPTIONS", "PUT", "PATCH"):
            r = await c.request(method, "/controlnode/tokens", headers=ADMIN)
            _error(r, 405, "METHOD_NOT_ALLOWED")
            assert r.headers["allow"] == "GET, POST", (method, r.headers)  # two routes, one path
        r = await c.options("/controlnode/tokens/someone", headers=ADMIN)
        _error(r, 405, "METHOD_NOT_ALLOWED")
        assert r.headers["allow"] == "DELETE", r.headers
    async with httpx.AsyncClient(base_url=urls["inventory"], timeout=30) as c:
        r = await c.options("/healthz")
        _error(r, 405, "METHOD_NOT_ALLOWED")
        assert r.headers["allow"] == "GET", r.headers


async def test_a_body_that_is_not_utf8_is_400_bad_request(urls):
    async with httpx.AsyncClient(base_url=urls["gateway"], timeout=30) as c:
        r = await c.post("/controlnode/tokens", content=b'{"name": "\xff\xfe"}', headers=JSON)
        _error(r, 400, "BAD_REQUEST")
        r = await c.post("/controlnode/tokens", content=b'{"name": ', headers=JSON)
        _error(r, 422, "VALIDATION_FAILED")
