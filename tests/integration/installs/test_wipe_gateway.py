"""Unprovision END TO END through the gateway: the wipe medium Karios built, booted in qemu
(TCG) with a virtio, an AHCI and an NVMe disk each marked at its first and last MiB (one with a
partition table and an ext4 filesystem) → every marker gone, one result per disk on the job
(SSE steps and the job's last message), job ``completed``, the VM powered itself off.

The one boot of the wipe medium on every bus with the default policy: the other wipe boots
(``test_wipe_direct.py``: a named disk, discard that does not zero, the secure policy) run the
medium without the job service."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.apps import ADMIN
from tests.fixtures.installs import PART_OFFSET, InstallStack, marked_disks, probe
from tests.fixtures.provision import fetch_medium, wait_bmc_clean, wait_job
from tests.fixtures.sse import open_sse
from tests.lab.vm import MIB, VM, read_marker

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.timeout(900), pytest.mark.vm]
DISKS = ["/dev/vda", "/dev/sda", "/dev/nvme0n1"]


async def test_unprovision_wipes_every_disk_through_the_gateway(install_stack: InstallStack, tmp_path: Path):
    st = install_stack
    disks = marked_disks(tmp_path)
    async with (
        httpx.AsyncClient(base_url=st.gw, timeout=60) as c,
        open_sse(c, "/controlnode/events?channel=provision", timeout=900) as sse,
    ):
        r = await c.post(
            "/controlnode/unprovision", json={"bmc_ip": st.bmc_ip, "vendor": "generic"}, headers=ADMIN
        )
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        await wait_job(c, job, {"booting"}, timeout=300)
        iso = await fetch_medium(st.emu, job, tmp_path / "wipe.iso")  # by the signed URL the BMC was given
        vm = VM(tmp_path, iso=iso, disks=disks, guestfwd=st.guestfwd(), no_reboot=True)
        t0 = time.monotonic()
        vm.start()
        try:
            done = await wait_job(c, job, {"completed", "failed"}, timeout=600)
            rc = await vm.wait_exit(timeout=120)  # the wipe powers the server off
        finally:
            vm.stop()
        elapsed = time.monotonic() - t0
        assert done["job_status"] == "completed", (done, vm.tail())
        assert rc == 0
        for disk in DISKS:  # the job's last word lists every disk's result
            assert f"{disk}: wiped 256 MiB" in done["message"], done["message"]
        events = await sse.collect(
            until=lambda evs: any(
                e.event == "job_completed" and e.json()["data"].get("job_id") == job for e in evs
            ),
            timeout=60,
        )
        steps = [
            e.json()["data"].get("message", "")
            for e in events
            if e.event == "job_step" and e.json()["data"].get("job_id") == job
        ]
        per_disk = [m for m in steps if "wiped 256 MiB" in m]
        assert len(per_disk) == 3 and all(
            m.endswith("read back as zeros, blkid finds nothing") for m in per_disk
        ), steps
        # the virtio disk held an MBR and an ext4 (two signatures); discard=unmap reads back as zeros
        vda = [m for m in per_disk if "wiped 256 MiB: 2 signature(s) cleared" in m]
        assert len(vda) == 1 and "discard zeroed the " in vda[0], per_disk
        await wait_bmc_clean(st.emu, st.system_id)
    for d in disks:
        assert read_marker(d.path, "first") == bytes(MIB), f"{d.bus}: first MiB not wiped"
        assert read_marker(d.path, "last") == bytes(MIB), f"{d.bus}: last MiB not wiped"
    assert probe(disks[0].path) == "" and "ext4" not in probe(disks[0].path, PART_OFFSET)
    print(f"wipe through the gateway: qemu start to power-off {elapsed:.1f} s; {done['message']}")
