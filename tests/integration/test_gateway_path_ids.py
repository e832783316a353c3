"""Path ids longer than their column, or holding a NUL byte, answer 422 naming the field (issue 12
item 7) in the one documented error shape, never a lookup or a 500. Real gateway, NATS, PostgreSQL."""

from __future__ import annotations

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from tests.fixtures.apps import ADMIN

pytestmark = pytest.mark.integration
LONG = "j" * 65
CALLS = [
    ("GET", "/controlnode/job/{}", None),
    ("PATCH", "/controlnode/job/{}", {"resource_name": "x"}),
    ("POST", "/controlnode/job/{}/cancel", None),
    ("POST", "/controlnode/job/{}/step", {"step": "s", "state": "running"}),
    ("POST", "/controlnode/fabric-config/apply/{}/cancel", None),
    ("GET", "/controlnode/fabric-config/batches/{}/postdeploy", None),
]


@pytest.mark.parametrize("bad", [LONG, "a%00b"])
async def test_bad_path_ids_answer_422_naming_the_field(settings, serve, bad):
    gw = await serve(gateway_app(settings))
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        for method, path, body in CALLS:
            r = await c.request(method, path.format(bad), json=body, headers=ADMIN)
            assert r.status_code == 422, (method, path, r.status_code, r.text)
            err = r.json()
            assert err["code"] == "VALIDATION_FAILED" and err["field"] in ("id", "job_id", "batch_id"), err
        # a well-formed id that does not exist is still a 404 (the lookup runs)
        r = await c.get("/controlnode/job/" + "j" * 64, headers=ADMIN)
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", r.text
