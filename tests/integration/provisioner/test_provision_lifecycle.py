"""Stuck detection, unprovision, batches and job PATCH — through the gateway."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import medium_token, wait_bmc_clean, wait_job
from tests.fixtures.sse import open_sse

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
        # Open before the stage deadline passes (1 s after booting, which is seconds away).
        async with open_sse(c, f"/controlnode/events?channel=job:{job}", timeout=40) as sse:
            stuck = await wait_job(c, job, {"stuck"}, timeout=40)
            assert stuck["status"] == "stuck" and "deadline" in stuck["message"]
            events = await sse.collect(until=lambda evs: any(e.event == "job_stuck" for e in evs), timeout=40)
        assert any(e.json()["data"]["job_id"] == job for e in events)
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
        wiped = "/dev/sda: wiped (both ends, discard); /dev/nvme0n1: wiped (both ends)"
        r = await c.post(
            f"/controlnode/job/{job}/complete", json={"message": wiped}, headers={"X-Karios-Job-Token": token}
        )
        assert r.status_code == 200 and r.json()["state"] == "completed"
        assert r.json()["message"] == wiped  # the wipe's per-disk results are the job's last word
        await wait_bmc_clean(stack.emu, stack.emu.system_ids[4])


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


async def test_installer_failure_fails_the_job_at_once_with_its_words_and_log(stack):
    """A failed step: the job is ``failed`` at once with "<stage label>: <message>", the log tail is
    on the job view and the SSE event, the BMC is left clean and the medium removed."""
    ip, sid = stack.bmc_ips[2], stack.emu.system_ids[2]
    log = [f"line {i} " + "x" * 400 for i in range(80)]  # bounded server-side: 50 lines × 300 chars
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        job = (
            await c.post("/controlnode/provision/dell", json={"bmc_IP": ip, "vendor": "dell"}, headers=ADMIN)
        ).json()["job_id"]
        await wait_job(c, job, {"booting"})
        token, _ = medium_token(stack.cfg.media_dir / f"{job}.iso")
        h = {"X-Karios-Job-Token": token}
        async with open_sse(c, f"/controlnode/events?channel=job:{job}", timeout=30) as sse:
            r = await c.post(
                f"/controlnode/job/{job}/step", json={"step": "network", "state": "done"}, headers=h
            )
            assert r.status_code == 200 and r.json()["message"] == "Network configured: done", r.text
            step = await wait_job(c, job, {"installing"})
            assert step["progress"] == 52  # the stage's percentage when the report names none
            r = await c.post(
                f"/controlnode/job/{job}/step",
                json={
                    "step": "mirror",
                    "state": "failed",
                    "message": "Bad archive mirror " + "y" * 2000,
                    "log": log,
                },
                headers=h,
            )
            assert r.status_code == 200 and r.json()["state"] == "failed", r.text
            failed = await wait_job(c, job, {"failed"}, timeout=10)
            events = await sse.collect(until=lambda evs: any(e.event == "job_failed" for e in evs))
        assert failed["message"].startswith("Install source reached: Bad archive mirror")
        assert len(failed["message"].encode()) <= len("Install source reached: ") + 1024
        assert len(failed["log_tail"]) == 50 and failed["log_tail"][-1].startswith("line 79 ")
        assert all(len(line) <= 300 for line in failed["log_tail"])
        last = next(e.json()["data"] for e in events if e.event == "job_failed")
        assert last["log_tail"] == failed["log_tail"] and last["message"] == failed["message"]
        bmc = await wait_bmc_clean(stack.emu, sid)
        assert not bmc["image"] and bmc["target"] == "None"
        assert not (stack.cfg.media_dir / f"{job}.slot").exists()
        # The failure is final: a late report changes nothing.
        r = await c.post(
            f"/controlnode/job/{job}/step", json={"step": "packages", "state": "active"}, headers=h
        )
        assert r.status_code == 409


async def test_stuck_job_that_then_fails_loses_its_medium_and_leaves_the_bmc_clean(stack):
    stack.cfg.stage_deadline = 1.0
    ip, sid = stack.bmc_ips[1], stack.emu.system_ids[1]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        job = (
            await c.post("/controlnode/provision/dell", json={"bmc_IP": ip, "vendor": "dell"}, headers=ADMIN)
        ).json()["job_id"]
        await wait_job(c, job, {"stuck"}, timeout=40)
        stack.cfg.stage_deadline = 600
        iso = stack.cfg.media_dir / f"{job}.slot"  # the job's medium record
        token, _ = medium_token(iso)
        r = await c.post(
            f"/controlnode/job/{job}/step",
            json={"step": "partitioning", "state": "failed", "message": "No root file system is defined."},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code == 200 and r.json()["state"] == "failed", r.text
        failed = await wait_job(c, job, {"failed"})
    assert failed["message"] == "Partitioning disks: No root file system is defined."
    assert not iso.exists()
    await wait_bmc_clean(stack.emu, sid)


async def test_images_are_served_read_only_with_ranges(stack):
    root = stack.cfg.images_dir / "bookworm"
    root.mkdir(parents=True, exist_ok=True)
    (root / "root.tar.zst").write_bytes(bytes(range(256)) * 4)
    (stack.cfg.images_dir.parent / "outside.txt").write_text("secret")
    async with httpx.AsyncClient(base_url=stack.prov, timeout=30) as c:
        full = await c.get("/images/bookworm/root.tar.zst")
        assert full.status_code == 200 and len(full.content) == 1024
        part = await c.get("/images/bookworm/root.tar.zst", headers={"Range": "bytes=256-511"})
        assert part.status_code == 206 and part.content == bytes(range(256))
        for bad in ("../outside.txt", "bookworm/../../outside.txt", "%2e%2e/outside.txt", "bookworm/none"):
            r = await c.get(f"/images/{bad}")
            assert r.status_code == 404, (bad, r.status_code)
        assert (await c.put("/images/bookworm/root.tar.zst", content=b"x")).status_code == 405
