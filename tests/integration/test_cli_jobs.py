"""``karios jobs --all/--since/--status``, ``job show PREFIX`` and full ids in a pipe, against a real
gateway (NATS, PostgreSQL) whose job read model holds a history (issue 26 item 4), and the
``GET /controlnode/jobs`` route behind them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.readmodel import JobRow
from tests.fixtures.apps import ADMIN
from tests.fixtures.cli import run_karios

pytestmark = pytest.mark.integration

OLD_FAILED = "cafe0001-0000-4000-8000-00000000000a"
TWIN = "cafe0001-0000-4000-8000-00000000000b"
RUNNING = "beef0002-0000-4000-8000-00000000000c"
UNDERSCORE = "cafe_003-0000-4000-8000-00000000000d"
REASON = (
    "Building media: installer for Debian 12 not found at /usr/lib/debian-installer/images/12/amd64/"
    "text/debian-installer/amd64/linux (apt install debian-installer-12-netboot-amd64)"
)


async def _history(db) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    days_ago = now - timedelta(days=3)
    async with db.session() as s, s.begin():
        s.add(
            JobRow(
                id=OLD_FAILED,
                bmc_ip="192.0.2.11",
                job_status="failed",
                status="failed",
                message=REASON,
                created_at=days_ago,
                updated_at=days_ago,
            )
        )
        s.add(
            JobRow(
                id=TWIN,
                bmc_ip="192.0.2.12",
                job_status="cancelled",
                status="cancelled",
                message="cancelled by operator",
                created_at=now - timedelta(hours=1),
            )
        )
        s.add(
            JobRow(
                id=RUNNING,
                bmc_ip="192.0.2.13",
                job_status="booting",
                status="running",
                message="Booting",
                created_at=now - timedelta(minutes=5),
            )
        )
        s.add(JobRow(id=UNDERSCORE, bmc_ip="192.0.2.14", job_status="completed", status="completed",
                     message="Completed", created_at=now - timedelta(minutes=1)))  # fmt: skip


async def test_history_prefix_lookup_and_full_ids_through_the_cli(settings, serve):
    app = gateway_app(settings)
    gw = await serve(app)
    await _history(app.state.runtime.db)

    # The route: newest first, filters, a prefix that is no LIKE pattern.
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=30) as c:
        page = (await c.get("/controlnode/jobs")).json()
        ids = [j["id"] for j in page["items"]]
        assert ids == [UNDERSCORE, RUNNING, TWIN, OLD_FAILED] and page["total"] == 4
        r = await c.get("/controlnode/jobs", params={"id_prefix": "cafe000"})
        assert [j["id"] for j in r.json()["items"]] == [TWIN, OLD_FAILED]  # `_` matched literally only
        r = await c.get("/controlnode/jobs", params={"id_prefix": "cafe_"})
        assert [j["id"] for j in r.json()["items"]] == [UNDERSCORE]
        r = await c.get("/controlnode/jobs", params=[("status", "failed"), ("status", "cancelled")])
        assert {j["id"] for j in r.json()["items"]} == {OLD_FAILED, TWIN}
        since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
        r = await c.get("/controlnode/jobs", params={"since": since, "limit": 2})
        assert r.json()["total"] == 3 and len(r.json()["items"]) == 2
        r = await c.get("/controlnode/jobs", params={"id_prefix": "a%"})
        assert r.status_code == 422 and r.json()["field"] == "id_prefix", r.text
        r = await c.get("/controlnode/jobs", params={"status": "bogus"})
        assert r.status_code == 422, r.text
        r = await c.get("/controlnode/jobs", params={"since": "9999-12-31T23:59:59-14:00"})
        assert r.status_code == 422 and r.json()["field"] == "since", r.text
        r = await c.get("/controlnode/jobs", params={"bmc_ip": "a\x00b"})
        assert r.status_code == 422, r.text

    # In a pipe at 80 columns: every id whole, the failure reason whole.
    code, out, err = await run_karios(gw.url, "jobs", "--all", env={"COLUMNS": "80"})
    assert code == 0, err
    for jid in (OLD_FAILED, TWIN, RUNNING, UNDERSCORE):
        assert jid in out, out
    assert REASON in out and "…" not in out

    code, out, err = await run_karios(gw.url, "jobs", "--since", "1d")
    assert code == 0, err
    assert RUNNING in out and TWIN in out and OLD_FAILED not in out
    code, out, err = await run_karios(gw.url, "-o", "json", "jobs", "--status", "failed")
    assert code == 0, err
    assert [j["id"] for j in json.loads(out)["items"]] == [OLD_FAILED]
    code, out, err = await run_karios(gw.url, "jobs", "--since", "yesterday")
    assert code == 2 and "--since 'yesterday'" in err

    # A unique prefix resolves; an ambiguous one lists the candidates; none is a 404-style error.
    code, out, err = await run_karios(gw.url, "-o", "json", "job", "show", "beef")
    assert code == 0, err
    assert json.loads(out)["id"] == RUNNING
    code, out, err = await run_karios(gw.url, "job", "show", RUNNING)
    assert code == 0 and RUNNING in out, err
    code, out, err = await run_karios(gw.url, "job", "show", "cafe0001")
    assert code == 1 and "ambiguous" in err and OLD_FAILED in err and TWIN in err, err
    code, out, err = await run_karios(gw.url, "job", "cancel", "cafe0001")
    assert code == 1 and "ambiguous" in err, err
    code, out, err = await run_karios(gw.url, "job", "show", "dead")
    assert code == 1 and "no job 'dead' (404)" in err and "Traceback" not in err, err
