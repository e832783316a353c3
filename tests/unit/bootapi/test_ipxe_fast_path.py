"""The hot-route shortcut of ``GET /ipxe/{mac}`` (``BootapiApp.ipxe_fast_path``) answers exactly
what the FastAPI route answers — bytes, status, headers, metrics — and leaves every other request
to the app."""

from __future__ import annotations

import httpx
import pytest

from karios.bootapi.app import create_app
from karios.common.settings import KariosSettings
from tests.fixtures.bootapi import boot_settings
from tests.fixtures.bootapi_hosts import FixedHosts

SETTINGS = KariosSettings(
    _env_file=None,  # type: ignore[call-arg]
    dev_mode=True,
    nats_url="nats://127.0.0.1:1",
    bus_prefix="unit",
    log_json=False,
)


def _client(app) -> httpx.AsyncClient:  # type: ignore[no-untyped-def]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def _without_fast_path():  # type: ignore[no-untyped-def]
    app = create_app(SETTINGS, boot_settings(), host_source=FixedHosts())
    app.ipxe_fast_path = False
    return app


@pytest.mark.parametrize(
    "path",
    [
        "/ipxe/52:54:00:aa:00:11",  # known host
        "/ipxe/52-54-00-AA-00-13.ipxe",  # other notation, suffix
        "/ipxe/52:54:00:00:00:99",  # unknown MAC: the fallback script
        "/ipxe/not-a-mac",  # bad MAC: the fallback script
    ],
)
async def test_the_fast_path_answers_what_the_route_answers(path: str):
    fast = create_app(SETTINGS, boot_settings(), host_source=FixedHosts())
    assert fast.ipxe_fast_path  # no OTLP export configured here
    async with _client(fast) as f, _client(_without_fast_path()) as s:
        a, b = await f.get(path), await s.get(path)
    assert (a.status_code, a.content) == (b.status_code, b.content)
    assert a.status_code == 200 and a.content.startswith(b"#!ipxe")
    assert a.headers["content-type"] == b.headers["content-type"] == "text/plain; charset=utf-8"
    assert a.headers["content-length"] == b.headers["content-length"] == str(len(a.content))


async def test_requests_are_still_counted_and_other_paths_go_through_the_app():
    app = create_app(SETTINGS, boot_settings(), host_source=FixedHosts())
    async with _client(app) as c:
        assert (await c.get("/ipxe/52:54:00:aa:00:11")).status_code == 200
        assert (await c.get("/ipxe/a/b")).status_code == 404  # no such route, as before
        assert (await c.post("/ipxe/52:54:00:aa:00:11")).status_code == 405
        metrics = (await c.get("/metrics")).text
    assert 'bootapi_http_requests_total{endpoint="ipxe",status="2xx"} 1.0' in metrics
    assert 'bootapi_http_requests_total{endpoint="ipxe",status="4xx"} 2.0' in metrics


async def test_the_fast_path_answers_before_fastapi_routing():
    """Taken, not just equivalent: with FastAPI's whole stack replaced by a 418 the shortcut still
    answers (and the bad-MAC fallback too); without it the request reaches that stack."""
    app = create_app(SETTINGS, boot_settings(), host_source=FixedHosts())

    async def teapot(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app.middleware_stack = teapot
    async with _client(app) as c:
        assert (await c.get("/ipxe/52:54:00:aa:00:11")).status_code == 200
        assert (await c.get("/ipxe/nonsense")).status_code == 200
        assert (await c.get("/healthz")).status_code == 418
        app.ipxe_fast_path = False
        assert (await c.get("/ipxe/52:54:00:aa:00:11")).status_code == 418


def test_the_fast_path_is_off_when_spans_are_exported(monkeypatch):
    """With OTLP export configured every /ipxe request keeps FastAPI's server span."""
    import karios.bootapi.app as app_module

    monkeypatch.setattr(app_module, "otlp_wanted", lambda env: (True, ""))
    assert not create_app(SETTINGS, boot_settings(), host_source=FixedHosts()).ipxe_fast_path
