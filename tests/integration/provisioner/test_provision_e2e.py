"""End to end through the gateway against the sushy-tools Redfish emulator (5 hosts at once)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import httpx
import pytest

from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import medium_token, wait_bmc_clean, wait_job
from tests.fixtures.sse import open_sse

pytestmark = [pytest.mark.integration, pytest.mark.lab]
STAGES = [
    "job_queued",
    "job_building_media",
    "job_mounting",
    "job_booting",
    "job_step",
    "job_first_boot",
    "job_completed",
]


def body(ip: str, n: int, **extra) -> dict:
    return {
        "bmc_IP": ip,
        "vendor": "dell",
        "hostname": f"node{n}",
        "os_password": "os-s3cret-pw",
        "selected_disks": ["sda", "sdb"],
        "pool_type": "mirror",
        "zone": "z1",
        **extra,
    }


async def test_five_hosts_provision_end_to_end(stack):
    emu = stack.emu
    routes = [
        "/controlnode/provision/dell",
        "/controlnode/provision",
        "/controlnode/provision/hp",
        "/controlnode/provision/supermicro",
        "/controlnode/provision/cisco",
    ]
    async with (
        httpx.AsyncClient(base_url=stack.gw, timeout=30) as c,
        open_sse(c, "/controlnode/events?channel=provision", timeout=120) as sse,
    ):
        t0 = time.perf_counter()
        posts = await asyncio.gather(
            *[
                c.post(
                    route,
                    json=body(ip, n, vendor="generic" if route.endswith("provision") else "dell"),
                    headers=ADMIN,
                )
                for n, (ip, route) in enumerate(zip(stack.bmc_ips, routes, strict=True), 1)
            ]
        )
        accepted = time.perf_counter() - t0
        assert [p.status_code for p in posts] == [202] * 5, [p.text for p in posts]
        assert accepted < 5
        jobs = [p.json()["job_id"] for p in posts]

        # A second provision for a BMC with a running job is refused.
        dup = await c.post("/controlnode/provision/dell", json=body(stack.bmc_ips[0], 1), headers=ADMIN)
        assert dup.status_code == 409, dup.text

        booted = await asyncio.gather(*[wait_job(c, j, {"booting"}) for j in jobs])
        to_booting = time.perf_counter() - t0
        print(f"\nPOST → booting for 5 hosts: {to_booting:.2f}s")
        assert all(b["status"] == "running" for b in booted)

        queue = (await c.get("/controlnode/provision/queue", headers=ADMIN)).json()
        assert {e["job_id"] for e in queue["entries"]} >= set(jobs)

        for job_id, sid in zip(jobs, emu.system_ids, strict=True):
            # The emulator downloaded the medium (InsertMedia fails otherwise), boots from CD, is powered on.
            _, vm = emu.request("GET", f"/redfish/v1/Systems/{sid}/VirtualMedia/Cd")
            assert vm["Image"].split("?")[0].endswith(f"/media/{job_id}.iso") and vm["Inserted"] is True
            assert "expires=" in vm["Image"] and "signature=" in vm["Image"]  # the signed URL (S2)
            _, system = emu.request("GET", f"/redfish/v1/Systems/{sid}")
            assert system["Boot"]["BootSourceOverrideTarget"] == "Cd"
            assert system["PowerState"] == "On"

        # Play the installer: the token comes from the medium itself.
        for n, (job_id, ip) in enumerate(zip(jobs, stack.bmc_ips, strict=True), 1):
            token, files = medium_token(stack.cfg.media_dir / f"{job_id}.iso")
            assert b"os-s3cret-pw" not in files["preseed.cfg"]
            h = {"X-Karios-Job-Token": token}
            r = await c.post(
                f"/controlnode/job/{job_id}/step",
                json={"step": "partitioning", "state": "active", "percent": 60},
                headers=h,
            )
            assert r.status_code == 200, r.text
            if n == 1:
                print(
                    f"POST → 'Installing OS' (first host, installer step sent by the test): "
                    f"{time.perf_counter() - t0:.2f}s"
                )
            r = await c.post(
                f"/controlnode/job/{job_id}/complete",
                json={"os_ip": f"10.1.0.{n}", "os_password": "os-s3cret-pw"},
                headers=h,
            )
            assert r.status_code == 200, r.text
            r = await c.post("/controlnode/firstboot", json={"bmc_ip": ip, "os_ip": f"10.1.0.{n}"}, headers=h)
            assert r.status_code == 200 and r.json()["state"] == "completed", r.text

        done = await asyncio.gather(*[wait_job(c, j, {"completed"}) for j in jobs])
        assert [d["node_ip"] for d in done] == [f"10.1.0.{n}" for n in range(1, 6)]
        events = [
            (e.event, e.json())
            for e in await sse.collect(
                until=lambda evs: sum(1 for e in evs if e.event == "job_completed") >= 5, timeout=120
            )
        ]
        for job_id in jobs:
            names = [n for n, d in events if d["data"].get("job_id") == job_id]
            assert names == STAGES, names
            assert all("s3cret" not in str(d) for _, d in events)
        # Completed: every BMC is left clean (medium ejected, boot override cleared), media removed.
        for job_id, sid in zip(jobs, emu.system_ids, strict=True):
            await wait_bmc_clean(emu, sid)
            assert not (stack.cfg.media_dir / f"{job_id}.slot").exists()

        prog = (
            await c.post(
                "/controlnode/provision/progress/all", json={"bmc_ip": stack.bmc_ips[0]}, headers=ADMIN
            )
        ).json()
        # this job's records only: earlier tests may have left jobs of the same BMC address
        prog = [p for p in prog if p["job_id"] == jobs[0]]
        t_first = datetime.fromisoformat(prog[0]["created_at"])
        print(
            "stage offsets (host 1):",
            [
                (p["stage"], round((datetime.fromisoformat(p["created_at"]) - t_first).total_seconds(), 2))
                for p in prog
            ],
        )
        assert [p["stage"] for p in prog][:4] == ["Queued", "Building ISO", "Mounting ISO", "Booting"]
        assert "Installing OS" in [p["stage"] for p in prog]
        latest = (
            await c.post("/controlnode/provision/progress", json={"bmc_ip": stack.bmc_ips[0]}, headers=ADMIN)
        ).json()
        assert latest["status"] == "completed" and latest["percent_complete"] == 100
        # A callback after completion changes nothing.
        token, _ = (
            medium_token(stack.cfg.media_dir / f"{jobs[0]}.iso")
            if (stack.cfg.media_dir / f"{jobs[0]}.slot").exists()
            else ("x", {})
        )
        r = await c.post(
            f"/controlnode/job/{jobs[0]}/step",
            json={"step": "late", "state": "active"},
            headers={"X-Karios-Job-Token": token},
        )
        assert r.status_code in (401, 409)
