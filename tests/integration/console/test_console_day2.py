"""The console's day-2 pages against a real gateway (NATS + PostgreSQL) with its read model and
audit trail filled as the projector and the audit layer fill them: the job history searched,
filtered and paged; the job page says who started the job (the audit record) and, with no
provisioner answering, says so instead of failing; the servers view lists every BMC with a job;
a bad filter is a 422 naming it; the discovered page and the login's way back."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.audit import AuditRecord
from karios.api_gateway.auth import Role, create_token
from karios.api_gateway.readmodel import JobRow

ADMIN_TOKEN = "kt_test-admin-token"
VIEWER_TOKEN = "kt_test-day2-viewer"
T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _job(i: int, bmc: str, status: str, host: str) -> JobRow:
    at = T0 + timedelta(minutes=i)
    return JobRow(
        id=f"{i:08x}-aaaa-4bbb-8ccc-{i:012x}",
        bmc_ip=bmc,
        job_status=status,
        status=status,
        resource_name=host,
        message=f"job {i}",
        created_at=at,
        updated_at=at,
    )


JOBS = [
    _job(1, "10.20.0.1", "completed", "web-1"),
    _job(2, "10.20.0.2", "failed", "db-1"),
    _job(3, "10.20.0.1", "failed", "web-1"),
    _job(4, "10.20.0.3", "cancelled", "cache-1"),
    _job(5, "10.20.0.4", "running", "edge-1"),
]


async def login(c: httpx.AsyncClient, token: str, next_: str = "") -> httpx.Response:
    form = {"token": token, **({"next": next_} if next_ else {})}
    return await c.post("/console/login", data=form, headers={"Origin": str(c.base_url).rstrip("/")})


def job_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-job-id="([^"]+)"', html)


async def test_history_servers_job_facts_and_filters(settings, serve):
    gw = await serve(gateway_app(settings))
    db = gw.app.state.runtime.db
    await create_token(db, "day2-viewer", Role.viewer, VIEWER_TOKEN)
    async with db.session() as s, s.begin():
        s.add_all(JOBS)
        s.add(
            AuditRecord(
                actor="alice",
                role="operator",
                method="POST",
                route="/controlnode/provision",
                target="10.20.0.2",
                job_id=JOBS[1].id,
                status=202,
                at=T0,
            )
        )
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        # Not logged in: the login page, which then brings the browser back to the page asked for.
        r = await c.get("/console/servers?state=failed")
        assert (
            r.status_code == 303
            and r.headers["location"] == "/console/login?next=%2Fconsole%2Fservers%3Fstate%3Dfailed"
        )
        form = await c.get(r.headers["location"])
        assert '<input type="hidden" name="next" value="/console/servers?state=failed">' in form.text
        r = await login(c, ADMIN_TOKEN, "/console/servers?state=failed")
        assert r.status_code == 303 and r.headers["location"] == "/console/servers?state=failed"
        await login(c, ADMIN_TOKEN, "//evil.example/console/jobs")  # never another site
        assert (await login(c, ADMIN_TOKEN, "https://evil.example/")).headers["location"] == "/console/jobs"

        # History: newest first, paged, searched (BMC, hostname, job id prefix), filtered by status.
        assert job_ids((await c.get("/console/jobs")).text) == [j.id for j in reversed(JOBS)]  # 50 a page
        page1 = await c.get("/console/jobs?size=2")
        assert job_ids(page1.text) == [JOBS[4].id, JOBS[3].id]
        assert 'href="/console/jobs?size=2&amp;page=2" id="page-next"' in page1.text
        assert 'id="page-prev"' not in page1.text
        page2 = await c.get("/console/jobs?size=2&page=2")
        assert job_ids(page2.text) == [JOBS[2].id, JOBS[1].id] and 'id="page-prev"' in page2.text
        page3 = await c.get("/console/jobs?size=2&page=3")
        assert job_ids(page3.text) == [JOBS[0].id] and 'id="page-next"' not in page3.text
        assert 'data-live="/console/jobs/live?size=2&amp;page=3"' in page3.text  # live keeps the page
        assert job_ids((await c.get("/console/jobs/live?size=2&page=3")).text) == [JOBS[0].id]
        r = await c.get("/console/jobs?status=failed")
        assert job_ids(r.text) == [JOBS[2].id, JOBS[1].id]
        assert job_ids((await c.get("/console/jobs?q=web-1")).text) == [JOBS[2].id, JOBS[0].id]
        assert job_ids((await c.get("/console/jobs?q=10.20.0.3")).text) == [JOBS[3].id]
        assert job_ids((await c.get(f"/console/jobs?q={JOBS[4].id[:8]}")).text) == [JOBS[4].id]
        assert job_ids((await c.get("/console/jobs?q=%25")).text) == []  # LIKE wildcards are text
        assert "No job matches." in (await c.get("/console/jobs?q=nothing-like-it")).text
        live = await c.get("/console/jobs/live?status=failed")
        assert job_ids(live.text) == [JOBS[2].id, JOBS[1].id]
        bad = await c.get("/console/jobs?status=bogus")
        assert bad.status_code == 422 and bad.json()["field"] == "status"
        assert (await c.get("/console/jobs?page=0")).json()["field"] == "page"

        # The job page: who started it (the audit trail); the provisioner is away: said, no 500.
        r = await c.get(f"/console/jobs/{JOBS[1].id}")
        assert r.status_code == 200
        assert re.search(r'id="job-started-by">alice \(operator\) at 10:00:00<', r.text), r.text
        assert 'id="job-hostname">db-1<' in r.text
        assert "the job&#39;s request (provisioner)" in r.text  # a note: nobody answered
        assert 'id="retry-form"' not in r.text  # the request is unknown: nothing to send again
        assert 'id="job-started-by">not recorded<' in (await c.get(f"/console/jobs/{JOBS[0].id}")).text

        # Servers: every BMC with a job, its newest job; searched and filtered by that job.
        r = await c.get("/console/servers")
        assert r.status_code == 200
        rows = re.findall(r'<tr data-bmc="([^"]+)" data-state="([^"]+)">', r.text)
        assert rows == [("10.20.0.1", "failed"), ("10.20.0.2", "failed"), ("10.20.0.3", "cancelled"),
                        ("10.20.0.4", "running")]  # fmt: skip
        assert 'id="servers-count">4 servers<' in r.text
        r = await c.get("/console/servers?q=DB-1")
        assert re.findall(r'<tr data-bmc="([^"]+)"', r.text) == ["10.20.0.2"]
        r = await c.get("/console/servers?state=cancelled")
        assert re.findall(r'<tr data-bmc="([^"]+)"', r.text) == ["10.20.0.3"]
        assert (await c.get("/console/servers?state=nope")).json()["field"] == "state"

        # Discovered: the provisioner is away here: a note, an empty table, no 500.
        r = await c.get("/console/discovered")
        assert r.status_code == 200 and "discovered servers (provisioner)" in r.text

        # The fabric worker is away: its note, and no create form (a config may well exist).
        r = await c.get("/console/fabric")
        assert "fabric config: " in r.text and 'id="fabric-create-form"' not in r.text

        # A viewer: the filter forms (GET) but no write control.
        await c.post("/console/logout", headers={"Origin": gw.url})
        await login(c, VIEWER_TOKEN)
        for path in (
            "/console/jobs",
            "/console/servers",
            "/console/discovered",
            f"/console/jobs/{JOBS[1].id}",
        ):
            text = (await c.get(path)).text
            assert "data-write" not in text, path
            assert "fabric-create-form" not in (await c.get("/console/fabric")).text
