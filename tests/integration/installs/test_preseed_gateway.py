"""The preseed path END TO END through the gateway, booted for real in qemu (TCG).

Provision with ``install_method: "preseed"`` and the lab's apt proxy as the request's
``http_proxy`` on the Redfish emulator; boot the ISO the provisioner built (downloaded from its
``/media/{job}.iso``): the installer's ``network`` and ``mirror`` steps reach the job in order, then
the missing installer components fail it — the job is ``failed`` at once with the installer's
message and carries its log tail (REST and SSE), and the BMC is left clean.

This is the one boot of the installer that reaches its mirror: what the installer's reporter
sends on that path (steps, percentages, the log tail's form) is checked here, as the job shows it.
The reporter's timing (failure reported within a minute of the installer's) is checked on the
other path, in ``test_preseed_vm.py`` (no mirror), where the installer's syslog is captured.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.apps import ADMIN
from tests.fixtures.installs import InstallStack, apt_proxy
from tests.fixtures.preseed_vm import PROXY_IP, PROXY_PORT, netboot_missing
from tests.fixtures.provision import fetch_medium, wait_bmc_clean, wait_job
from tests.fixtures.sse import open_sse
from tests.lab.vm import VM, Disk

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.timeout(1800),
    pytest.mark.vm(chain="debian-installer"),
]


async def test_preseed_job_fails_with_the_installers_message_and_log_tail(
    install_stack: InstallStack, tmp_path: Path
):
    if netboot_missing():
        pytest.skip(f"the preseed method needs {netboot_missing()[0]} (tests/lab/setup.sh installs it)")
    if not apt_proxy():
        pytest.skip("the lab's apt proxy (tests/lab/aptproxy.sh) did not come up")
    st = install_stack
    async with (
        httpx.AsyncClient(base_url=st.gw, timeout=60) as c,
        open_sse(c, "/controlnode/events?channel=provision", timeout=1500) as sse,
    ):
        t0 = time.monotonic()
        r = await c.post(
            "/controlnode/provision",
            json={
                "bmc_IP": st.bmc_ip,
                "vendor": "generic",
                "hostname": "karios-preseed-1",
                "os_password": "preseed-s3cret-pw",
                "selected_disks": ["vda"],
                "pool_type": "single",
                "install_method": "preseed",
                "http_proxy": f"http://{PROXY_IP}:{PROXY_PORT}",
            },
            headers=ADMIN,
        )
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        await wait_job(c, job, {"booting"}, timeout=300)
        t_booting = time.monotonic()
        iso = await fetch_medium(st.emu, job, tmp_path / "medium.iso")  # by the signed URL the BMC was given

        fwd = {**st.guestfwd(), f"{PROXY_IP}:{PROXY_PORT}": PROXY_PORT}
        vm = VM(tmp_path, iso=iso, disks=[Disk(tmp_path / "vda.img", 4 << 30)], guestfwd=fwd, no_reboot=True)
        vm.start()
        t_vm = time.monotonic()
        try:
            done = await wait_job(c, job, {"failed", "completed", "stuck"}, timeout=1200)
        finally:
            vm.stop()
        t_failed = time.monotonic()
        assert done["job_status"] == "failed", done
        msg = done["message"]
        assert "failed to download" in msg.lower() or "downloading a file failed" in msg.lower(), msg
        assert "apt-mirror-setup" in msg and "404" in msg, msg
        tail = done["log_tail"]
        assert 5 <= len(tail) <= 30, tail
        assert any("404" in line for line in tail), tail
        assert all(isinstance(x, str) and len(x) <= 300 for x in tail), tail
        assert not any(" debconf: " in x for x in tail), "the log tail is the installer's, not debconf's"

        events = await sse.collect(
            until=lambda evs: any(
                e.event == "job_failed" and e.json()["data"].get("job_id") == job for e in evs
            ),
            timeout=60,
        )
        mine = [(e.event, e.json()["data"]) for e in events if e.json()["data"].get("job_id") == job]
        steps = [d.get("message", "") for n, d in mine if n == "job_step"]
        assert len(steps) == 2, steps
        assert steps[0].startswith("Network configured") and steps[1].startswith("Install source reached")
        percents = [d.get("percent") for n, d in mine if n == "job_step"]
        assert percents == [52, 56], percents
        failed = next(d for n, d in mine if n == "job_failed")
        assert "apt-mirror-setup" in json.dumps(failed)
        assert all("preseed-s3cret-pw" not in json.dumps(d) and "$6$" not in json.dumps(d) for _, d in mine)
        await wait_bmc_clean(st.emu, st.system_id)
    timeline = {
        "post_to_booting_s": round(t_booting - t0, 1),
        "vm_start_to_failed_s": round(t_failed - t_vm, 1),
        "steps": steps,
        "message": msg[:200],
    }
    print("\npreseed through the gateway:", timeline)
