"""Issue 26: the audit trail — every state-changing request through the gateway is one record
(who, what, on what, the result, the trace), queryable at ``GET /controlnode/audit`` (fabric_admin).

The real gateway and inventory apps on the real database and bus; the provisioner's cancel
responder is a stand-in on the bus (the audit is the gateway's: the answer is what matters).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from karios.api_gateway.app import create_app as gateway_app
from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import CancelJob, JobView
from karios.inventory.app import create_app as inventory_app
from tests.fixtures.apps import ADMIN
from tests.fixtures.cli import run_karios
from tests.fixtures.provision import write_inventory
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.integration

BMC = "10.95.0.1"
OS_PASSWORD = "os-s3cret-pw"
ROOT_PASSWORD = "root-s3cret-pw"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Gateway:
    c: httpx.AsyncClient
    app: object

    async def written(self) -> None:
        """Every record handed to the writer is in the database."""
        writer = self.app.state.audit  # type: ignore[attr-defined]
        await wait_until(lambda: writer.idle, timeout=10, what="the audit writer to be idle")

    async def audit(self, token: dict[str, str] = ADMIN, **params: object) -> dict:
        await self.written()
        r = await self.c.get("/controlnode/audit", params=params, headers=token)
        assert r.status_code == 200, r.text
        return r.json()

    async def token(self, name: str, role: str) -> str:
        r = await self.c.post("/controlnode/tokens", json={"name": name, "role": role}, headers=ADMIN)
        assert r.status_code == 201, r.text
        return r.json()["token"]


@pytest.fixture
async def gw(settings, serve, tmp_path) -> AsyncIterator[Gateway]:
    inventory = write_inventory(tmp_path / "inventory.yaml", [BMC])
    await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    provisioner = Bus.from_settings(settings, "provisioner-stand-in")

    async def cancel(q: CancelJob) -> JobView:
        return JobView(
            job_id=q.job_id, bmc_ip=BMC, state="cancelled", status="cancelled", message="cancelled"
        )

    provisioner.query_responder(provisioner.subjects.request("provision", "cancel"), CancelJob, cancel)
    await provisioner.start()
    app = gateway_app(settings)
    running = await serve(app)
    try:
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as c:
            yield Gateway(c, app)
    finally:
        await provisioner.stop()


def since_now() -> str:
    return datetime.now(UTC).isoformat()


async def test_provision_cancel_and_token_changes_are_one_record_each(gw, settings, caplog):
    caplog.set_level(logging.INFO)
    t0 = since_now()
    ops_token = await gw.token("ops-audit", "operator")

    r = await gw.c.post(
        "/controlnode/provision/dell",
        json={
            "bmc_IP": BMC,
            "vendor": "dell",
            "hostname": "node-a",
            "os_password": OS_PASSWORD,
            "root_pass": ROOT_PASSWORD,
        },
        headers={**bearer(ops_token), "X-Request-ID": "req-provision-1"},
    )
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    # reads — and a POST that only reads — are no audit events
    assert (await gw.c.get(f"/controlnode/job/{job}", headers=bearer(ops_token))).status_code == 200
    progress = await gw.c.post(
        "/controlnode/provision/progress", json={"bmc_ip": BMC}, headers=bearer(ops_token)
    )
    assert progress.status_code in (200, 404), progress.text

    r = await gw.c.post(f"/controlnode/job/{job}/cancel", headers=bearer(ops_token))
    assert r.status_code == 200, r.text
    r = await gw.c.delete("/controlnode/tokens/ops-audit", headers=ADMIN)
    assert r.status_code == 200, r.text

    page = await gw.audit(since=t0)
    got = [
        (e["actor"], e["role"], e["method"], e["route"], e["target"], e["job_id"], e["status"])
        for e in page["records"]
    ]
    assert got == [  # newest first, one record per request
        ("bootstrap-admin", "fabric_admin", "DELETE", "/controlnode/tokens/{name}", "ops-audit", None, 200),
        ("ops-audit", "operator", "POST", "/controlnode/job/{id}/cancel", job, job, 200),
        ("ops-audit", "operator", "POST", "/controlnode/provision/dell", BMC, job, 202),
        ("bootstrap-admin", "fabric_admin", "POST", "/controlnode/tokens", "ops-audit", None, 201),
    ]
    assert page["next_before"] is None
    provision = page["records"][2]
    assert provision["request_id"] == "req-provision-1"
    assert re.fullmatch(r"[0-9a-f]{32}", provision["trace_id"]) and provision["client"] == "127.0.0.1"
    assert len({e["trace_id"] for e in page["records"]}) == 4  # each request its own trace

    # one structured "audit" line per record, at INFO, in the request's trace
    lines = [r for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "audit"]
    assert len(lines) == 4 and {r.levelname for r in lines} == {"INFO"}
    by_route = {r.msg["route"]: r.msg for r in lines}
    assert by_route["/controlnode/provision/dell"]["trace_id"] == provision["trace_id"]
    assert by_route["/controlnode/provision/dell"]["actor"] == "ops-audit"

    # no secret anywhere: not in the records, not in the table, not in the log lines
    engine = create_async_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            table = str((await conn.execute(sa.text("SELECT * FROM gateway.audit_log"))).all())
    finally:
        await engine.dispose()
    logged = "".join(json.dumps(r.msg, default=str) for r in lines)
    for secret in (ops_token, ADMIN["Authorization"].split()[1], OS_PASSWORD, ROOT_PASSWORD):
        for where, text in (("API", json.dumps(page)), ("table", table), ("log", logged)):
            assert secret not in text, f"a secret in the audit {where}"


async def test_a_refused_write_is_recorded_with_an_unknown_actor(gw):
    t0 = since_now()
    bad = "kt_not-a-real-token-value"
    r = await gw.c.post("/controlnode/tokens", json={"name": "x-1", "role": "viewer"}, headers=bearer(bad))
    assert r.status_code == 401
    r = await gw.c.delete("/controlnode/nodes/10.95.9.9")  # no token at all
    assert r.status_code == 401
    page = await gw.audit(since=t0)
    got = [
        (e["actor"], e["role"], e["method"], e["route"], e["target"], e["status"]) for e in page["records"]
    ]
    assert got == [
        ("unknown", None, "DELETE", "/controlnode/nodes/{node_ip}", "10.95.9.9", 401),
        ("unknown", None, "POST", "/controlnode/tokens", "x-1", 401),
    ]
    assert bad not in json.dumps(page)
    # the installer's callbacks carry job tokens, not operator tokens: no audit events
    r = await gw.c.post(
        "/controlnode/job/no-such-job/step", json={"stage": "x"}, headers={"X-Karios-Job-Token": "t"}
    )
    assert r.status_code in (401, 404, 422)
    assert (await gw.audit(since=t0))["records"] == page["records"]


async def test_reading_needs_fabric_admin_and_a_403_names_the_token(gw):
    t0 = since_now()
    for name, role in (("op-reader", "operator"), ("view-reader", "viewer")):
        token = await gw.token(name, role)
        r = await gw.c.get("/controlnode/audit", headers=bearer(token))
        assert r.status_code == 403, r.text
    op = await gw.token("op-writer", "operator")
    r = await gw.c.delete("/controlnode/tokens/view-reader", headers=bearer(op))
    assert r.status_code == 403
    page = await gw.audit(since=t0, method="DELETE")
    assert [(e["actor"], e["role"], e["target"], e["status"]) for e in page["records"]] == [
        ("op-writer", "operator", "view-reader", 403)
    ]
    r = await gw.c.get("/controlnode/audit")
    assert r.status_code == 401


async def test_filters_and_paging(gw):
    t0 = since_now()
    for i in range(5):
        await gw.token(f"page-{i}", "viewer")
    await gw.c.delete("/controlnode/tokens/page-0", headers=ADMIN)

    first = await gw.audit(since=t0, limit=2)
    assert [e["target"] for e in first["records"]] == ["page-0", "page-4"]
    second = await gw.audit(since=t0, limit=2, before=first["next_before"])
    assert [e["target"] for e in second["records"]] == ["page-3", "page-2"]
    third = await gw.audit(since=t0, limit=2, before=second["next_before"])
    assert [e["target"] for e in third["records"]] == ["page-1", "page-0"] and third["next_before"] is None

    assert [e["method"] for e in (await gw.audit(since=t0, action="DELETE"))["records"]] == ["DELETE"]
    assert len((await gw.audit(since=t0, action="POST /controlnode/tokens"))["records"]) == 5
    assert len((await gw.audit(since=t0, action="tokens/{name}"))["records"]) == 1
    assert [e["target"] for e in (await gw.audit(since=t0, target="page-3"))["records"]] == ["page-3"]
    assert len((await gw.audit(since="10m", actor="bootstrap-admin"))["records"]) >= 6
    assert (await gw.audit(since=t0, actor="nobody"))["records"] == []
    assert (await gw.audit(since=t0, status=201))["records"][0]["target"] == "page-4"

    for params, field in (
        ({"since": "yesterday"}, "since"),
        ({"limit": 1001}, "limit"),
        ({"method": "GET"}, "method"),
    ):
        r = await gw.c.get("/controlnode/audit", params=params, headers=ADMIN)
        assert r.status_code == 422 and field in r.text, r.text


async def test_the_cli_lists_the_trail(gw):
    await gw.token("cli-audit", "viewer")
    await gw.written()
    url = str(gw.c.base_url)
    code, out, err = await run_karios(
        url, "audit", "--since", "10m", "--actor", "bootstrap-admin", "-o", "json"
    )
    assert code == 0, err
    records = json.loads(out)["records"]
    assert records[0]["target"] == "cli-audit" and records[0]["route"] == "/controlnode/tokens"
    code, out, err = await run_karios(url, "audit", "--target", "cli-audit", "--limit", "1")
    assert code == 0, err
    assert "cli-audit" in out and "bootstrap-admin" in out and "201" in out
    viewer = await gw.token("cli-viewer", "viewer")
    code, _, err = await run_karios(url, "audit", token=viewer)
    assert code != 0 and "fabric_admin" in err and "Traceback" not in err, err


async def test_console_sign_in_and_out_are_recorded_without_the_token(gw):
    t0 = since_now()
    token = await gw.token("console-op-1", "operator")
    bad = "kt_not-a-real-console-token"
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = await gw.c.post("/console/login", content=f"token={bad}", headers=form)
    assert r.status_code == 401
    r = await gw.c.post("/console/login", content=f"token={token}", headers=form)
    assert r.status_code == 303, r.text
    r = await gw.c.post("/console/logout")  # the client keeps the session cookie
    assert r.status_code == 303
    page = await gw.audit(since=t0)
    got = [(e["actor"], e["role"], e["method"], e["route"], e["status"]) for e in page["records"]]
    assert got[:3] == [
        ("console-op-1", "operator", "POST", "/console/logout", 303),
        ("console-op-1", "operator", "POST", "/console/login", 303),
        ("unknown", None, "POST", "/console/login", 401),
    ], got
    assert token not in json.dumps(page) and bad not in json.dumps(page)
