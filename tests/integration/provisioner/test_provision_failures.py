"""Cancel, BMC failures, token checks, idempotency and validation — through the gateway."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from karios.common.contracts.provision import ProvisionSpec, StartProvision
from tests.conftest import ADMIN
from tests.integration.provisioner.conftest import medium_token, wait_job

pytestmark = [pytest.mark.integration, pytest.mark.lab]


def body(ip: str, **extra) -> dict:
    return {"bmc_IP": ip, "vendor": "dell", "hostname": "n1", **extra}


async def test_cancel_midway_ejects_clears_boot_and_is_idempotent(stack):
    emu, sid, ip = stack.emu, stack.emu.system_ids[0], stack.bmc_ips[0]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        job = (await c.post("/controlnode/provision/dell", json=body(ip), headers=ADMIN)).json()["job_id"]
        await wait_job(c, job, {"booting"})
        token, _ = medium_token(stack.cfg.media_dir / f"{job}.iso")
        r1 = await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)
        r2 = await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)
        assert r1.status_code == 200 and r2.status_code == 200 and r2.json()["state"] == "cancelled"
        got = await wait_job(c, job, {"cancelled"})
        assert got["status"] == "cancelled"
        for _ in range(50):
            _, vm = emu.request("GET", f"/redfish/v1/Systems/{sid}/VirtualMedia/Cd")
            _, system = emu.request("GET", f"/redfish/v1/Systems/{sid}")
            if not vm.get("Image") and system["Boot"]["BootSourceOverrideTarget"] == "None":
                break
            await asyncio.sleep(0.2)
        assert not vm.get("Image")
        # sushy-tools always reads back Enabled=Continuous (LAB.md): the target is what changed.
        assert system["Boot"]["BootSourceOverrideTarget"] == "None"
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
        await asyncio.sleep(1.0)
    assert svc.mounts - before == 1


async def test_unreachable_and_failing_bmc_fail_clearly(stack):
    stack.cfg.bmc_endpoints["10.99.1.1"] = {"url": "http://127.0.0.1:9", "username": "a", "password": "b"}
    stack.cfg.bmc_endpoints["10.99.1.2"] = {"url": stack.emu.url, "username": "a", "password": "wrong"}
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        j1 = (await c.post("/controlnode/provision/dell", json=body("10.99.1.1"), headers=ADMIN)).json()[
            "job_id"
        ]
        j2 = (await c.post("/controlnode/provision/hp", json=body("10.99.1.2"), headers=ADMIN)).json()[
            "job_id"
        ]
        f1 = await wait_job(c, j1, {"failed"})
        f2 = await wait_job(c, j2, {"failed"})
    assert "failed after 2 tries" in f1["message"] and "10.99.1.1" in f1["message"]
    assert "refused the credentials" in f2["message"]


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
