"""The per-request span and RED metrics of every service (``service._Observe``, pure ASGI), on a
real app without servers: the route template and the answered status label the metrics, an
exception no handler took counts as 500, and nothing else is hidden by the layer."""

from __future__ import annotations

import httpx
from prometheus_client import generate_latest

from karios.common.errors import NotFound
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings


def make_app():  # type: ignore[no-untyped-def]
    rt = ServiceRuntime("observe-test", KariosSettings(dev_mode=True), use_bus=False)
    app = build_app(rt, title="t")

    @app.get("/things/{name}")
    async def thing(name: str) -> dict[str, str]:
        if name == "missing":
            raise NotFound("no such thing", field="name")
        if name == "boom":
            raise RuntimeError("boom")
        return {"name": name}

    return app, rt


async def test_metrics_carry_the_route_template_and_the_answered_status():
    app, rt = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as c:
        assert (await c.get("/things/a")).json() == {"name": "a"}
        assert (await c.get("/things/b")).status_code == 200
        assert (await c.get("/things/missing")).status_code == 404
        r = await c.get("/things/boom")
        assert r.status_code == 500 and "boom" not in r.text
        assert (await c.get("/nowhere")).status_code == 404
    m = generate_latest(rt.registry).decode()
    assert 'karios_http_requests_total{method="GET",route="/things/{name}",status="200"} 2.0' in m
    assert 'karios_http_requests_total{method="GET",route="/things/{name}",status="404"} 1.0' in m
    assert 'karios_http_requests_total{method="GET",route="/things/{name}",status="500"} 1.0' in m
    assert 'karios_http_requests_total{method="GET",route="unmatched",status="404"} 1.0' in m
    assert 'karios_http_request_duration_seconds_count{method="GET",route="/things/{name}"} 4.0' in m
