"""The image method's medium, booted for real in qemu (TCG) without the job service.

An install that cannot reach its image fails in seconds: the medium from
:meth:`ImageMethod.medium` (live kernel + initrd + per-host overlay, as the boot loaders hand
them over) reports the failed stage with its message and log lines to a recording endpoint and
powers the server off. The successful install — stages, first boot, the installed system over
SSH, booted by BIOS and by UEFI — is one install through the gateway
(``test_image_gateway.py``): it covered everything a second, direct install showed, at the cost
of one more boot instead of one more install.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.provisioner.install import HostContext
from karios.provisioner.install.image import ImageMethod
from karios.provisioner.install.preseed.render import hash_password
from tests.fixtures.installs import SUITE, InstallerEndpoint, initrd_with_overlay
from tests.fixtures.wait import wait_until
from tests.lab.vm import VM, Disk

pytestmark = [pytest.mark.timeout(1500), pytest.mark.vm(chain="debian-installer")]
GW = "10.0.2.100"


async def test_unreachable_image_fails_in_seconds_with_the_log(
    tmp_path: Path, live_images, installer_endpoint: InstallerEndpoint
):
    """An install that cannot go on reports ``state: failed`` with its message and log lines
    (the job fails at once instead of going stuck) and powers the server off."""
    ep = installer_endpoint
    ctx = HostContext(
        job_id="job-fail",
        token="tok-fail",
        callback_base=f"http://{GW}:{ep.port}/controlnode",
        hostname="karios-node-8",
        bmc_ip="10.0.0.8",
        os_username="karios",
        password_hash=hash_password("not-a-secret"),
        disks=["/dev/vda"],
        image_url=f"http://{GW}:{ep.port}/images/{SUITE}/missing.tar.zst",
    )
    cfg = SimpleNamespace(
        cache_dir=tmp_path, images_dir=live_images.images_dir, mirror_host="", mirror_dir=""
    )
    medium = ImageMethod(cfg).medium(ctx)
    vm = VM(
        tmp_path,
        name="fail",
        kernel=medium.kernel,
        initrd=initrd_with_overlay(medium, tmp_path / "initrd.img"),
        append=" ".join(["console=ttyS0,115200n8", *medium.kernel_args]),
        disks=[Disk(tmp_path / "vda.img", 1 << 30)],
        guestfwd={f"{GW}:{ep.port}": ep.port},
        no_reboot=True,
    )
    vm.start()
    try:
        failed = await wait_until(
            lambda: [s for s in ep.steps() if s.body["state"] == "failed"],
            timeout=400,
            interval=1,
            what="failure",
        )
        t_network = next(s.at for s in ep.steps() if s.body["step"] == "network")
        await vm.wait_exit(timeout=120)  # powered off after reporting
    finally:
        vm.stop()
    report = failed[0]
    assert report.token == "tok-fail" and report.body["step"] == "mirror"
    assert "root filesystem archive not reachable" in report.body["message"]
    assert isinstance(report.body["log"], list) and any("404" in line for line in report.body["log"]), (
        report.body
    )
    assert [s.body["step"] for s in ep.steps()] == ["network", "mirror"]
    assert report.at - t_network < 60
    print(f"unreachable image: failure reported {report.at - t_network:.1f} s after the network came up")
