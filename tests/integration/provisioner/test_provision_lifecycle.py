"""Stuck detection, unprovision, batches and job PATCH — through the gateway."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.conftest import ADMIN
from tests.integration.provisioner.conftest import medium_token, read_sse, wait_job

pytestmark = [pytest.mark.integration, pytest.mark.lab]


async def test_job_without_steps_becomes_stuck_and_a_step_revives_it(stack):
    stack.cfg.stage_deadline = 1.0
    ip = stack.bmc_ips[3]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        job = (
            await c.post(
                "/controlnode/provision/supermicro",
                json={"bmc_IP": ip, "vendor": "supermicro"},
                headers=ADMIN,
            )
        ).json()["job_id"]
        sse = asyncio.create_task(  # noqa: RUF006 - awaited below
            read_sse(
                c,
                f"/controlnode/events?channel=job:{job}",
                lambda evs: any(n == "job_stuck" for n, _ in evs),
                timeout=40,
            )
        )
        stuck = await wait_job(c, job, {"stuck"}, timeout=40)
        assert stuck["status"] == "stuck" and "deadline" in stuck["message"]
        assert any(d["data"]["job_id"] == job for _, d in await sse)
        token, _ = medium_token(stack.cfg.media_dir / f"{job}.iso")
        stack.cfg.stage_deadline = 600
        r = await c.post(
            f"/controlnode/job/{job}/step",
            json={"step": "late", "state": "active", "percent": 70},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code == 200 and r.json()["state"] == "installing"


async def test_unprovision_boots_a_wipe_medium_with_request_credentials(stack):
    ip = stack.bmc_ips[4]
    stack.cfg.bmc_endpoints[ip] = {
        k: v for k, v in stack.cfg.bmc_endpoints[ip].items() if k not in ("username", "password")
    }
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        r = await c.post(
            "/controlnode/unprovision",
            json={
                "bmc_ip": ip,
                "bmc_user": stack.emu.username,
                "bmc_pass": stack.emu.password,
                "vendor": "dell",
            },
            headers=ADMIN,
        )
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        got = await wait_job(c, job, {"booting"})
        assert got["job_type"] == "unprovision"
        token, files = medium_token(stack.cfg.media_dir / f"{job}.iso")
        assert "wipefs" in files["karios/wipe.sh"].decode()
        assert stack.emu.password not in json.dumps(got)
        r = await c.post(f"/controlnode/job/{job}/complete", json={}, headers={"X-Karios-Job-Token": token})
        assert r.status_code == 200 and r.json()["state"] == "completed"


async def test_batch_parent_counts_its_jobs_and_patch_updates_metadata(stack):
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        ids = []
        for ip in ("10.98.0.1", "10.98.0.2"):
            stack.cfg.bmc_endpoints[ip] = {"url": "http://127.0.0.1:9"}
            r = await c.post(
                "/controlnode/provision/dell",
                json={"bmc_IP": ip, "vendor": "dell", "parent_id": "batch-1", "rack_number": "r7"},
                headers=ADMIN,
            )
            assert r.status_code == 202
            ids.append(r.json()["job_id"])
        parent = (await c.get("/controlnode/job/batch-1", headers=ADMIN)).json()
        assert parent["total_jobs"] == 2 and parent["job_type"] == "provision_batch"
        child = (await c.get(f"/controlnode/job/{ids[0]}", headers=ADMIN)).json()
        assert child["parent_id"] == "batch-1" and json.loads(child["metadata"]) == {"rack_number": "r7"}
        r = await c.patch(f"/controlnode/job/{ids[0]}", json={"metadata": {"note": "x"}}, headers=ADMIN)
        assert r.status_code == 200 and json.loads(r.json()["metadata"]) == {"note": "x"}
        r = await c.patch(f"/controlnode/job/{ids[0]}", json={"job_status": "completed"}, headers=ADMIN)
        assert r.status_code == 422
