"""Job tokens bound to the job's life (issue 24 item 1, S1): real NATS + PostgreSQL, the Redfish
emulator, inventory, provisioner and gateway; the installer is played by the test.

A token is good for steps and one /complete while its job installs, then one /firstboot within
the window, then nothing: a completed job's token cannot re-register the node elsewhere, a
second /complete or a late step (even a "failed" one) changes nothing, and /firstboot cannot
move a node to another address. The token never crosses the bus in clear.
"""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import nats
import pytest

from karios.common.bus.subjects import Subjects
from tests.fixtures.apps import ADMIN
from tests.fixtures.fabric import sql
from tests.fixtures.provision import medium_token, wait_job
from tests.fixtures.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.lab]
OS_IP, OTHER_IP = "10.97.0.11", "10.97.0.66"


async def _booting(c: httpx.AsyncClient, stack, ip: str) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    body = {"bmc_IP": ip, "vendor": "dell", "hostname": "tok-node"}
    r = await c.post("/controlnode/provision/dell", json=body, headers=ADMIN)
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    await wait_job(c, job, {"booting"}, timeout=180)
    token, _ = medium_token(stack.cfg.media_dir / f"{job}.iso")
    return job, {"X-Karios-Job-Token": token}


def _refused(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 409 and r.json()["code"] == "CONFLICT", r.text
    assert all(w in r.json()["message"] for w in words), r.text


async def test_a_token_is_good_for_what_its_jobs_state_expects_and_never_after(stack, settings):
    a, b = stack.bmc_ips[2], stack.bmc_ips[3]
    seen: list[bytes] = []

    async def heard(msg) -> None:  # type: ignore[no-untyped-def]
        seen.append(msg.data)

    nc = await nats.connect(settings.nats_url)
    sub = await nc.subscribe(Subjects(settings.bus_prefix).request("provision", "*"), cb=heard)
    try:
        async with httpx.AsyncClient(base_url=stack.gw, timeout=60) as c:
            (job, h), (job_b, hb) = await asyncio.gather(_booting(c, stack, a), _booting(c, stack, b))
            token = h["X-Karios-Job-Token"]
            step = {"step": "partitioning", "state": "active"}

            # Installing: no /firstboot yet; steps and /complete are.
            fb = {"bmc_ip": a, "os_ip": OS_IP}
            _refused(
                await c.post("/controlnode/firstboot", json=fb, headers=h), "has not finished installing"
            )
            assert (await c.post(f"/controlnode/job/{job}/step", json=step, headers=h)).status_code == 200
            r = await c.post(f"/controlnode/job/{job}/complete", json={"os_ip": OS_IP}, headers=h)
            assert r.status_code == 200 and r.json()["state"] == "first_boot", r.text

            # /complete once; no step after it, not even one that would fail the job.
            r = await c.post(
                f"/controlnode/job/{job}/complete", json={"os_ip": OTHER_IP, "os_password": "x"}, headers=h
            )
            _refused(r, f"job {job} is first_boot", "already reported /complete", "/complete")
            _refused(
                await c.post(f"/controlnode/job/{job}/step", json=step, headers=h), "no longer accepts /step"
            )
            failed = {"step": "late", "state": "failed", "message": "boom"}
            _refused(await c.post(f"/controlnode/job/{job}/step", json=failed, headers=h), "/complete")

            async def shown() -> str:  # the gateway's read model follows the job's events
                return (await c.get(f"/controlnode/job/{job}", headers=ADMIN)).json()["job_status"]

            await wait_until(lambda: _is(shown, "first_boot"), timeout=15, what="the job shown as first_boot")

            # /firstboot cannot move the node off the address the installer reported.
            moved = {"bmc_ip": a, "os_ip": OTHER_IP}
            _refused(
                await c.post("/controlnode/firstboot", json=moved, headers=h), OS_IP, OTHER_IP, "operator"
            )
            # Within the window, once.
            r = await c.post("/controlnode/firstboot", json=fb, headers=h)
            assert r.status_code == 200 and r.json()["state"] == "completed", r.text

            # The completed job's token: refused for every callback, at any address.
            for body in (moved, fb):
                _refused(
                    await c.post("/controlnode/firstboot", json=body, headers=h),
                    f"job {job} is completed: its token no longer accepts /firstboot",
                )
            _refused(await c.post(f"/controlnode/job/{job}/step", json=step, headers=h), "is completed")
            _refused(
                await c.post(f"/controlnode/job/{job}/complete", json={"os_ip": OS_IP}, headers=h),
                "is completed",
            )
            r = await c.get(f"/controlnode/nodes/{OS_IP}", headers=ADMIN)
            assert r.status_code == 200 and r.json()["bmc_ip"] == a, r.text
            assert (await c.get(f"/controlnode/nodes/{OTHER_IP}", headers=ADMIN)).status_code == 404

            # Another job's first boot cannot take a registered node's address.
            r = await c.post(f"/controlnode/job/{job_b}/complete", json={"os_ip": OS_IP}, headers=hb)
            assert r.status_code == 200, r.text
            r = await c.post("/controlnode/firstboot", json={"bmc_ip": b, "os_ip": OS_IP}, headers=hb)
            _refused(r, f"os_ip {OS_IP} is the address of the compute node of BMC {a}", "operator")
            r = await c.get(f"/controlnode/nodes/{OS_IP}", headers=ADMIN)
            assert r.json()["bmc_ip"] == a, r.text
            assert (await c.get(f"/controlnode/job/{job_b}", headers=ADMIN)).json()[
                "job_status"
            ] == "first_boot"
            assert (await c.post(f"/controlnode/job/{job_b}/cancel", headers=ADMIN)).status_code == 200
            assert token not in r.text
    finally:
        await sub.unsubscribe()
        await nc.close()
        await sql(settings, "DELETE FROM inventory.compute_nodes WHERE node_ip = :ip", ip=OS_IP)

    # The token never went over the bus; its SHA-256 did.
    assert seen, "no callback request seen on the bus"
    assert not [m for m in seen if token.encode() in m]
    assert any(hashlib.sha256(token.encode()).hexdigest().encode() in m for m in seen)


async def test_firstboot_after_its_window_is_refused(stack):
    ip = stack.bmc_ips[4]
    window, stack.cfg.firstboot_window = stack.cfg.firstboot_window, 1.0
    try:
        async with httpx.AsyncClient(base_url=stack.gw, timeout=60) as c:
            job, h = await _booting(c, stack, ip)
            r = await c.post(f"/controlnode/job/{job}/complete", json={"os_ip": OTHER_IP}, headers=h)
            assert r.status_code == 200, r.text
            await asyncio.sleep(1.5)
            r = await c.post("/controlnode/firstboot", json={"bmc_ip": ip, "os_ip": OTHER_IP}, headers=h)
            _refused(r, "window closed", "an operator must register the node")
            assert (await c.get(f"/controlnode/nodes/{OTHER_IP}", headers=ADMIN)).status_code == 404
            assert (await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)).status_code == 200
    finally:
        stack.cfg.firstboot_window = window


async def _is(read, want: str) -> bool:
    return await read() == want
