"""Constant-size media through the real stack: the Redfish emulator downloads each job's medium from
the provisioner (sushy-tools fetches the image on InsertMedia), and what it got is the shared base
ISO with that job's slot patched in — read back with xorriso, compared across two jobs, byte for byte
with the HTTP route (HEAD, ranges); an ended job's medium is gone (404). Then the measurement:
50 media requested, disk use of the media directory and time to first byte per medium.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from karios.provisioner.install import HostContext
from karios.provisioner.install.preseed import PreseedMethod
from karios.provisioner.install.preseed.render import hash_password
from karios.provisioner.media.slot import SLOT_PATH, SLOT_SIZE
from karios.provisioner.statemachine import State
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import (
    bmc_medium_url,
    has_medium,
    insert_media_job,
    medium_token,
    unsigned,
    wait_bmc_clean,
    wait_job,
)

pytestmark = [pytest.mark.integration, pytest.mark.lab]


def downloaded(emu, job: str) -> Path:  # type: ignore[no-untyped-def]
    """The file the emulator downloaded for the job's InsertMedia (under its TMPDIR)."""
    found = list(Path(emu.workdir, "tmp").rglob(f"{job}.iso"))
    assert len(found) == 1, found
    return found[0]


def du_bytes(path: Path) -> int:
    return int(
        subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    )


async def test_the_emulator_boots_each_jobs_patched_medium(stack, tmp_path):
    emu = stack.emu
    ips = stack.bmc_ips[:2]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=30) as c:
        posts = [
            await c.post(
                "/controlnode/provision/dell",
                json={
                    "bmc_IP": ip,
                    "vendor": "dell",
                    "hostname": f"slot{n}",
                    "os_password": "os-s3cret-pw",
                    "selected_disks": ["sda"],
                },
                headers=ADMIN,
            )
            for n, ip in enumerate(ips)
        ]
        assert [p.status_code for p in posts] == [202, 202], [p.text for p in posts]
        jobs = [p.json()["job_id"] for p in posts]
        await asyncio.gather(*[wait_job(c, j, {"booting"}) for j in jobs])

        # Only slot records in the media directory: a few KB per job, no ISO.
        files = sorted(p.name for p in stack.cfg.media_dir.iterdir())
        assert files == sorted(f"{j}.slot" for j in jobs), files
        assert du_bytes(stack.cfg.media_dir) < 64 * 1024

        got = [downloaded(emu, j) for j in jobs]
        a, b = (g.read_bytes() for g in got)
        urls = [bmc_medium_url(emu, j) for j in jobs]  # signed: what InsertMedia was given
        assert [unsigned(u) for u in urls] == [f"{stack.prov}/media/{j}.iso" for j in jobs]
        async with httpx.AsyncClient(timeout=120) as p:
            served = (await p.get(urls[0])).content
            head = await p.head(urls[0])
            mid = len(a) // 2
            part = await p.get(urls[0], headers={"Range": f"bytes={mid}-{mid + 99999}"})
            assert (await p.get(unsigned(urls[0]))).status_code == 403  # the URL without its signature
        assert served == a  # the emulator got exactly what the route serves
        assert int(head.headers["content-length"]) == len(a) == len(b)
        assert part.status_code == 206 and part.content == a[mid : mid + 100000]
        diff = [i for i in range(0, len(a), 4096) if a[i : i + 4096] != b[i : i + 4096]]
        assert diff and diff[-1] - diff[0] < SLOT_SIZE, "two jobs' media differ outside one slot"

        # Each medium carries its own job's token, read the way the installer does (second initrd).
        tokens = []
        for job, iso in zip(jobs, got, strict=True):
            token, inside = medium_token(iso)
            assert b"os-s3cret-pw" not in inside["preseed.cfg"]
            tokens.append(token)
            step = await c.post(
                f"/controlnode/job/{job}/step",
                json={"step": "partitioning", "state": "active", "percent": 60},
                headers={"X-Karios-Job-Token": token},
            )
            assert step.status_code == 200, step.text
        assert tokens[0] != tokens[1]
        assert (await asyncio.to_thread(medium_token, urls[1]))[0] == tokens[1]
        report = subprocess.run(
            ["xorriso", "-indev", str(got[0]), "-find", SLOT_PATH, "-exec", "report_lba", "--"],
            capture_output=True,
            text=True,
        ).stdout
        assert f"{SLOT_SIZE} , '{SLOT_PATH}'" in report

        for job in jobs:
            assert (await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)).status_code == 200
        await asyncio.gather(*[wait_job(c, j, {"cancelled"}) for j in jobs])
    svc = stack.app.state.jobs
    async with httpx.AsyncClient(base_url=stack.prov, timeout=30) as p:
        ended = await p.get(urls[0])  # signed and unexpired, but the job has ended
        assert ended.status_code == 403 and ended.json()["code"] == "MEDIA_JOB_ENDED", ended.text
        assert (await p.head(urls[1])).status_code == 403
        assert (await p.get("/media/..%2Fetc.iso")).status_code == 404
        legacy = stack.cfg.media_dir / "legacy-job.iso"  # written per job before slots existed
        legacy.write_bytes(b"whole old medium")
        await insert_media_job(svc, "legacy-job", "10.250.2.1")
        old = await p.get(svc.media_url("legacy-job"), headers={"Range": "bytes=6-8"})
        assert old.status_code == 206 and old.content == b"old"
        await svc.repo.move(
            "legacy-job", State.cancelled, "test done", percent=None, owned=False, values={}
        )  # no BMC behind it to clean
        legacy.unlink()
    assert not any(has_medium(stack.cfg.media_dir, j) for j in jobs)
    for sid in emu.system_ids[:2]:
        await wait_bmc_clean(emu, sid)


def host(n: int) -> HostContext:
    return HostContext(
        job_id=f"bench-{n:03d}",
        token=f"tok-{n:03d}-" + "x" * 24,
        callback_base="http://10.0.0.1:8080/controlnode",
        hostname=f"host{n}",
        bmc_ip=f"10.0.{n // 250}.{n % 250 + 1}",
        os_username="debian",
        password_hash=hash_password("adminadmin", salt="karios12"),
        disks=["/dev/sda"],
    )


async def test_fifty_media_cost_kilobytes_and_answer_at_once(stack):
    """N=50 hosts' media built and requested: disk use of the media directory, build time per host,
    time to first byte per medium (all 50 streamed at once), full downloads of a few."""
    media = stack.app.state.jobs.media
    method = PreseedMethod()
    svc = stack.app.state.jobs
    await asyncio.to_thread(media.build, "bench-warm", method.medium(host(999)))  # the base, once
    before = du_bytes(stack.cfg.media_dir)
    builds = []
    for n in range(50):
        t = time.perf_counter()
        await media.build_async(f"bench-{n:03d}", method.medium(host(n)))
        builds.append(time.perf_counter() - t)
        await insert_media_job(svc, f"bench-{n:03d}", host(n).bmc_ip)  # served by its signed URL
    urls = [svc.media_url(f"bench-{n:03d}") for n in range(50)]
    grown = du_bytes(stack.cfg.media_dir) - before

    async def first_byte(p: httpx.AsyncClient, n: int, full: bool) -> tuple[float, int]:
        t = time.perf_counter()
        async with p.stream("GET", urls[n]) as r:
            assert r.status_code == 200
            size, ttfb = 0, None
            async for chunk in r.aiter_raw():
                ttfb = ttfb if ttfb is not None else time.perf_counter() - t
                size += len(chunk)
                if not full:
                    break
        assert ttfb is not None
        return ttfb, size

    async with httpx.AsyncClient(base_url=stack.prov, timeout=300) as p:
        t0 = time.perf_counter()
        res = await asyncio.gather(*[first_byte(p, n, full=n < 3) for n in range(50)])
        wall = time.perf_counter() - t0
        expect = int((await p.head(urls[0])).headers["content-length"])
        one_by_one = sorted([(await first_byte(p, n, full=False))[0] for n in range(50)])
    ttfbs = sorted(r[0] for r in res)
    assert all(r[1] == expect for r in res[:3])  # full downloads: the whole medium
    for n in range(50):
        await svc.repo.move(
            f"bench-{n:03d}", State.cancelled, "measured", percent=None, owned=False, values={}
        )  # no BMC behind it to clean
        media.remove(f"bench-{n:03d}")
    media.remove("bench-warm")
    print(
        f"\n50 media: media dir grew {grown / 1024:.0f} KiB ({grown / 50 / 1024:.1f} KiB/host); "
        f"build p50 {statistics.median(builds) * 1000:.1f} ms max {max(builds) * 1000:.1f} ms; "
        f"TTFB (50 at once) p50 {statistics.median(ttfbs) * 1000:.0f} ms max {ttfbs[-1] * 1000:.0f} ms; "
        f"3 full + 47 first bytes in {wall:.1f} s; TTFB one at a time p50 "
        f"{statistics.median(one_by_one) * 1000:.1f} ms max {one_by_one[-1] * 1000:.1f} ms; "
        f"medium {expect / 1e6:.1f} MB"
    )
    assert grown < 50 * 32 * 1024  # KB per host, never an ISO per host
    assert statistics.median(builds) < 2.0
