"""Cancel, BMC failures, token checks, idempotency and validation — through the gateway."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from karios.common.contracts.provision import ProvisionSpec, StartProvision
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import (
    UNKNOWN_BMC,
    bmc_state,
    medium_token,
    resets_seen,
    wait_bmc_clean,
    wait_job,
)
from tests.fixtures.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.lab]


def body(ip: str, **extra) -> dict:
    return {"bmc_IP": ip, "vendor": "dell", "hostname": "n1", **extra}


async def test_cancel_midway_ejects_clears_boot_and_is_idempotent(stack):
    emu, sid, ip = stack.emu, stack.emu.system_ids[0], stack.bmc_ips[0]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        job = (await c.post("/controlnode/provision/dell", json=body(ip), headers=ADMIN)).json()["job_id"]
        booting = await wait_job(c, job, {"booting"})
        # sushy-tools reads back Continuous after Once: the quirk is recorded with its evidence.
        assert "BMC quirk" in booting["message"] and "'Continuous'" in booting["message"], booting
        assert bmc_state(emu, sid)["target"] == "Cd"
        token, _ = medium_token(stack.cfg.media_dir / f"{job}.iso")
        r1 = await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)
        r2 = await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)
        assert r1.status_code == 200 and r2.status_code == 200 and r2.json()["state"] == "cancelled"
        got = await wait_job(c, job, {"cancelled"})
        assert got["status"] == "cancelled"
        bmc = await wait_bmc_clean(emu, sid)
        assert not bmc["image"]
        # sushy-tools always reads back Enabled=Continuous (LAB.md): the target is what changed.
        assert bmc["target"] == "None"
        assert not (stack.cfg.media_dir / f"{job}.slot").exists()  # an ended job keeps no medium
        # A late callback of the cancelled attempt changes nothing.
        r = await c.post(
            f"/controlnode/job/{job}/step",
            json={"step": "x", "state": "active"},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code == 409
        assert (await c.get(f"/controlnode/job/{job}", headers=ADMIN)).json()["job_status"] == "cancelled"
        # After a cancel the BMC may be provisioned again.
        r = await c.post("/controlnode/provision/dell", json=body(ip), headers=ADMIN)
        assert r.status_code == 202
        await wait_job(c, r.json()["job_id"], {"booting"})
        # The older attempt's token is refused as superseded, on firstboot too (which names no job).
        r = await c.post(
            "/controlnode/firstboot",
            json={"bmc_ip": ip, "os_ip": "10.1.0.7"},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code == 409 and "superseded" in r.json()["message"], r.text


async def test_wrong_token_is_401_and_complete_twice_is_409(stack):
    ip = stack.bmc_ips[1]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        job = (await c.post("/controlnode/provision", json=body(ip, vendor="generic"), headers=ADMIN)).json()[
            "job_id"
        ]
        await wait_job(c, job, {"booting"})
        token, _ = medium_token(stack.cfg.media_dir / f"{job}.iso")
        r = await c.post(
            f"/controlnode/job/{job}/step",
            json={"step": "a", "state": "active"},
            headers={"X-Karios-Job-Token": "wrong"},
        )
        assert r.status_code == 401
        r = await c.post(f"/controlnode/job/{job}/step", json={"step": "a", "state": "active"})
        assert r.status_code == 401
        r = await c.post(f"/controlnode/job/{job}/step?token={token}", json={"step": "a", "state": "bogus"})
        assert r.status_code == 422 and r.json()["field"] == "state"
        r = await c.post(
            f"/controlnode/job/{job}/complete",
            json={"os_ip": "10.1.0.9"},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code == 200
        r = await c.post(
            "/controlnode/firstboot",
            json={"bmc_ip": ip, "os_ip": "10.1.0.9"},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code == 200
        r = await c.post(
            f"/controlnode/job/{job}/complete",
            json={"os_ip": "10.1.0.9"},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code == 409
        r = await c.post(
            f"/controlnode/job/{job}/step",
            json={"step": "late", "state": "active"},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code == 409


async def test_redelivered_command_mounts_once(stack):
    ip = stack.bmc_ips[2]
    svc = stack.app.state.jobs
    rt = stack.app.state.runtime
    cmd = StartProvision(
        job_id="redelivered-job-1", spec=ProvisionSpec(bmc_ip=ip, vendor="dell", hostname="n3")
    )
    before = svc.mounts
    # Two deliveries of the same command (distinct message ids, so JetStream dedup does not hide it).
    await rt.bus.send_command(cmd, rt.bus.subjects.cmd("provision", "start"), entity=cmd.job_id)
    await rt.bus.send_command(cmd, rt.bus.subjects.cmd("provision", "start"), entity=cmd.job_id)
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        await wait_job(c, cmd.job_id, {"booting"})
    # Both deliveries were handled (the second found the row and stopped), and the job's
    # worker is done: only then is the count final.
    await wait_until(lambda: cmd.job_id not in svc.tasks, timeout=30, what="the job's worker to finish")
    assert svc.mounts - before == 1


async def test_unreachable_and_failing_bmc_fail_clearly(stack):
    stack.cfg.bmc_endpoints["10.99.1.1"] = {"url": "http://127.0.0.1:9", "username": "a", "password": "b"}
    stack.cfg.bmc_endpoints["10.99.1.2"] = {"url": stack.emu.url, "username": "a", "password": "wrong"}
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        t0 = time.monotonic()
        j1 = (await c.post("/controlnode/provision/dell", json=body("10.99.1.1"), headers=ADMIN)).json()[
            "job_id"
        ]
        j2 = (await c.post("/controlnode/provision/hp", json=body("10.99.1.2"), headers=ADMIN)).json()[
            "job_id"
        ]
        f1 = await wait_job(c, j1, {"failed"}, timeout=20)
        took = time.monotonic() - t0
        f2 = await wait_job(c, j2, {"failed"}, timeout=20)
        stages = [
            p["stage"]
            for p in (
                await c.post(
                    "/controlnode/provision/progress/all", json={"bmc_ip": "10.99.1.1"}, headers=ADMIN
                )
            ).json()
        ]
    assert "failed after 2 tries" in f1["message"] and "10.99.1.1" in f1["message"]
    assert "refused the credentials" in f2["message"]
    # Checked before building: no medium was ever written, and the job never built one.
    assert not any((stack.cfg.media_dir / f"{j}.slot").exists() for j in (j1, j2))
    assert stages == ["Queued", "Failed"], stages
    print(f"\nunreachable BMC: POST → failed in {took:.2f}s")
    assert took < 15  # seconds, not a build plus the BMC's full retry budget


async def test_bmc_answering_500_fails_clearly_after_retries(stack, serve):
    """A BMC whose Redfish service answers 500 to everything: retried, then a clear failure."""
    hits: list[str] = []
    bmc = FastAPI()

    @bmc.api_route("/{path:path}", methods=["GET", "POST", "PATCH", "DELETE"])
    async def broken(path: str, request: Request) -> JSONResponse:
        hits.append(f"{request.method} /{path}")
        err = {
            "MessageId": "Base.1.8.InternalError",
            "Message": "The request failed due to an internal error.",
        }
        return JSONResponse(
            {"error": {"code": "Base.1.8.InternalError", "@Message.ExtendedInfo": [err]}}, 500
        )

    url = (await serve(bmc)).url
    stack.cfg.bmc_endpoints["10.99.1.3"] = {"url": url, "username": "a", "password": "b"}
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        job = (await c.post("/controlnode/provision/dell", json=body("10.99.1.3"), headers=ADMIN)).json()[
            "job_id"
        ]
        failed = await wait_job(c, job, {"failed"})
    assert "10.99.1.3" in failed["message"] and "failed after 2 tries" in failed["message"]
    assert "HTTP 500" in failed["message"] and "InternalError" in failed["message"]
    assert hits.count("GET /redfish/v1") == 2  # bmc_retries=1: two tries, then give up


async def test_a_slow_bmc_is_waited_for_not_failed(stack, serve):
    """A BMC that accepts the connection but answers its service root after the probe's timeout
    is alive (a loaded iDRAC, a busy emulator): the job goes on under the full limits. A CI run of
    the cluster test failed a job on "timeout after 5.0s" (2 tries) of its busy emulator."""
    seen: list[float] = []
    bmc = FastAPI()

    @bmc.api_route("/{path:path}", methods=["GET", "POST", "PATCH", "DELETE"])
    async def slow(path: str, request: Request) -> Response:
        if request.method == "GET" and path.rstrip("/") == "redfish/v1":
            t0 = time.monotonic()
            await asyncio.sleep(2.0)  # the probe waits 1 s for a connection; the answer takes 2 s
            seen.append(time.monotonic() - t0)
        keep = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("authorization", "x-auth-token", "content-type")
        }
        async with httpx.AsyncClient(base_url=stack.emu.url, timeout=30) as emu:
            r = await emu.request(request.method, f"/{path}", content=await request.body(), headers=keep)
        out = {
            k: v for k, v in r.headers.items() if k.lower() in ("x-auth-token", "location", "content-type")
        }
        return Response(r.content, r.status_code, headers=out)

    ip, probe_timeout = "10.99.1.3", stack.cfg.bmc_probe_timeout
    url = (await serve(bmc)).url
    stack.cfg.bmc_endpoints[ip] = {
        "url": url,
        "system_id": stack.emu.system_ids[4],
        "username": stack.emu.username,
        "password": stack.emu.password,
    }
    stack.cfg.bmc_probe_timeout = 1.0
    try:
        async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
            r = await c.post("/controlnode/provision/dell", json=body(ip), headers=ADMIN)
            assert r.status_code == 202, r.text
            job = r.json()["job_id"]
            got = await wait_job(c, job, {"booting", "failed"}, timeout=60)
            assert got["job_status"] == "booting", got["message"]
            await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)
            await wait_job(c, job, {"cancelled"})
    finally:
        stack.cfg.bmc_probe_timeout = probe_timeout
    assert seen and min(seen) >= 2.0, seen  # the slow answers were waited for


async def test_bad_requests_are_422_naming_the_field(stack):
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        cases = [
            ({"vendor": "dell"}, "bmc_IP"),
            ({"bmc_IP": "10.0.0.999", "vendor": "dell"}, "bmc_IP"),
            (body("10.0.0.1", pool_type="raidz2", selected_disks=["sda", "sdb", "sdc"]), "selected_disks"),
            (body("10.0.0.1", pool_type="raid7"), "pool_type"),
            (body("10.0.0.1", debian_version="9"), "debian_version"),
        ]
        for b, field in cases:
            r = await c.post("/controlnode/provision/dell", json=b, headers=ADMIN)
            assert r.status_code == 422, (b, r.text)
            assert r.json()["field"] == field, r.json()
        r = await c.post("/controlnode/provision/dell", json=body("10.0.0.1"))
        assert r.status_code == 401
        r = await c.get("/controlnode/job/nope", headers=ADMIN)
        assert r.status_code == 404


async def test_every_invalid_request_is_422_naming_the_field_before_any_job(stack):
    """Checked once, at the gateway, before the 202: no job is created for any of these."""
    ip = stack.bmc_ips[0]
    cases = [
        (body(ip, vendor="foo"), "/controlnode/provision", "vendor"),
        (body(ip, hostname="Srv_X"), "/controlnode/provision/dell", "hostname"),
        (body(ip, os_username="Bad User"), "/controlnode/provision/dell", "os_username"),
        (body(ip, selected_nic="eth0;reboot"), "/controlnode/provision/dell", "selected_nic"),
        (body(ip, selected_disks=["../etc/passwd"]), "/controlnode/provision/dell", "selected_disks"),
        (
            body(ip, selected_disks=["sda", "/dev/sda"], pool_type="mirror"),
            "/controlnode/provision",
            "selected_disks",
        ),
        (body(ip, install_method="pxe"), "/controlnode/provision/dell", "install_method"),
        (body(ip, mirror="bad host/debian"), "/controlnode/provision/dell", "mirror"),
        (body(ip, http_proxy="ftp://proxy:21"), "/controlnode/provision/dell", "http_proxy"),
        (body(ip, gpu_passthrough=["zz"]), "/controlnode/provision/dell", "gpu_passthrough"),
        (body(ip, arch="arm64"), "/controlnode/provision/dell", "arch"),
    ]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        for b, route, field in cases:
            r = await c.post(route, json=b, headers=ADMIN)
            assert r.status_code == 422, (b, r.text)
            assert r.json()["field"] == field, (b, r.json())
        r = await c.post("/controlnode/unprovision", json={"bmc_ip": ip, "vendor": "foo"}, headers=ADMIN)
        assert r.status_code == 422 and r.json()["field"] == "vendor", r.text
        queue = (await c.get("/controlnode/provision/queue", headers=ADMIN)).json()
    assert not [e for e in queue["entries"] if e["bmc_ip"] == ip]
    # A valid request with the normalised fields is accepted.
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        r = await c.post(
            "/controlnode/provision/dell",
            json=body(ip, selected_disks=["sda", "sdb"], pool_type="Mirror", install_method="preseed"),
            headers=ADMIN,
        )
        assert r.status_code == 202, r.text
        await wait_job(c, r.json()["job_id"], {"booting"})
        cancel = await c.post(f"/controlnode/job/{r.json()['job_id']}/cancel", headers=ADMIN)
        assert cancel.status_code == 200


async def test_unknown_bmc_is_404_naming_the_field(stack):
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        r = await c.post("/controlnode/provision/dell", json=body(UNKNOWN_BMC), headers=ADMIN)
        assert r.status_code == 404 and r.json()["field"] == "bmc_IP", r.text
        assert UNKNOWN_BMC in r.json()["message"]
        r = await c.post("/controlnode/unprovision", json={"bmc_ip": UNKNOWN_BMC}, headers=ADMIN)
        assert r.status_code == 404 and r.json()["field"] == "bmc_ip", r.text
        queue = (await c.get("/controlnode/provision/queue", headers=ADMIN)).json()
    assert not [e for e in queue["entries"] if e["bmc_ip"] == UNKNOWN_BMC]


async def test_cancel_while_mounting_leaves_the_bmc_clean_and_never_resets(stack):
    """Cancelled with the medium inserted and the boot override set, before the reset."""
    emu, sid, ip = stack.emu, stack.emu.system_ids[3], stack.bmc_ips[3]
    svc = stack.app.state.jobs
    since = len(emu.log())
    reached, go = asyncio.Event(), asyncio.Event()

    def factory(cls, ep):  # type: ignore[no-untyped-def]
        class Held(cls):  # type: ignore[valid-type, misc]
            async def set_boot_cd_once(self):  # type: ignore[no-untyped-def]
                got = await super().set_boot_cd_once()
                reached.set()
                await go.wait()
                return got

        return Held(ep)

    svc.driver_factory = factory
    try:
        async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
            job = (await c.post("/controlnode/provision/dell", json=body(ip), headers=ADMIN)).json()["job_id"]
            await asyncio.wait_for(reached.wait(), 30)
            assert bmc_state(emu, sid)["inserted"] and bmc_state(emu, sid)["target"] == "Cd"
            r = await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)
            assert r.status_code == 200 and r.json()["state"] == "cancelled"
            go.set()
            await wait_bmc_clean(emu, sid)
            await wait_until(lambda: job not in svc.tasks, timeout=10, what="the worker to stop")
    finally:
        svc.driver_factory = None
    assert not (stack.cfg.media_dir / f"{job}.slot").exists()
    assert resets_seen(emu, sid, since) == 0


async def test_two_jobs_for_one_bmc_at_once_one_runs_the_other_fails(stack):
    """Commands that bypass the gateway's 409 (or race it): the provisioner admits one job per BMC."""
    ip = stack.bmc_ips[4]
    rt = stack.app.state.runtime
    cmds = [
        StartProvision(
            job_id=f"race-{n}-{ip.replace('.', '-')}",
            spec=ProvisionSpec(bmc_ip=ip, vendor="dell", hostname=f"r{n}"),
        )
        for n in (1, 2)
    ]
    await asyncio.gather(
        *[rt.bus.send_command(c, rt.bus.subjects.cmd("provision", "start"), entity=c.job_id) for c in cmds]
    )
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        ends = [await wait_job(c, cmd.job_id, {"booting", "failed"}) for cmd in cmds]
        running = [e for e in ends if e["job_status"] == "booting"]
        failed = [e for e in ends if e["job_status"] == "failed"]
        assert len(running) == 1 and len(failed) == 1, [
            (e["id"], e["job_status"], e["message"]) for e in ends
        ]
        assert f"already has running job {running[0]['id']}" in failed[0]["message"]
        await c.post(f"/controlnode/job/{running[0]['id']}/cancel", headers=ADMIN)
