"""The image method's medium, booted for real in qemu (TCG) without the job service.

The medium from :meth:`ImageMethod.medium` (live kernel + initrd + per-host overlay) installs
Debian on two virtio disks as md RAID1, reports every stage to a recording endpoint, and the
installed system boots from its disks (UEFI), calls back on first boot and answers SSH with
the key asked for. A second case: an install that cannot reach its image fails in seconds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import asyncssh
import pytest

from karios.provisioner.install import INSTALL_STAGES, HostContext
from karios.provisioner.install.image import ImageMethod
from karios.provisioner.install.preseed.render import hash_password
from tests.fixtures.installs import SUITE, InstallerEndpoint, initrd_with_overlay
from tests.fixtures.wait import wait_until
from tests.lab.vm import VM, Disk, free_port

pytestmark = [pytest.mark.timeout(1500), pytest.mark.vm]
GW = "10.0.2.100"


async def test_image_install_to_first_boot_raid1(
    tmp_path: Path, live_images, installer_endpoint: InstallerEndpoint
):
    ep = installer_endpoint
    key = asyncssh.generate_private_key("ssh-ed25519")
    pubkey = key.export_public_key().decode().strip()
    ctx = HostContext(
        job_id="job-direct",
        token="tok-direct",
        callback_base=f"http://{GW}:{ep.port}/controlnode",
        hostname="karios-node-7",
        bmc_ip="10.0.0.7",
        os_username="karios",
        password_hash=hash_password("not-a-secret"),
        ssh_authorized_keys=[pubkey],
        disks=["/dev/vda", "/dev/vdb"],
        md_level=1,
        image_url=f"http://{GW}:{ep.port}/images/{SUITE}/root.tar.zst",
    )
    cfg = SimpleNamespace(
        cache_dir=tmp_path, images_dir=live_images.images_dir, mirror_host="", mirror_dir=""
    )
    medium = ImageMethod(cfg).medium(ctx)
    disks = [Disk(tmp_path / "vda.img", 4 << 30), Disk(tmp_path / "vdb.img", 4 << 30)]
    fwd = {f"{GW}:{ep.port}": ep.port}
    t0 = time.monotonic()
    install = VM(
        tmp_path,
        name="install",
        kernel=medium.kernel,
        initrd=initrd_with_overlay(medium, tmp_path / "initrd.img"),
        append=" ".join(["console=ttyS0,115200n8", *medium.kernel_args]),
        disks=disks,
        guestfwd=fwd,
        no_reboot=True,  # the install's reboot ends this qemu; the disks then boot on their own
    )
    install.start()
    try:
        await install.wait_exit(timeout=900)
    finally:
        install.stop()
    t_installed = time.monotonic()
    steps = ep.steps()
    assert [s.body["step"] for s in steps] == [s.key for s in INSTALL_STAGES], install.tail()
    assert all(s.token == "tok-direct" and s.path == "/controlnode/job/job-direct/step" for s in steps)
    assert [s.body["percent"] for s in steps] == [s.percent for s in INSTALL_STAGES]
    assert not [s for s in steps if s.body["state"] == "failed"], steps
    complete = [c for c in ep.calls if c.path.endswith("/complete")]
    assert complete and complete[0].body["os_ip"] == "10.0.2.15"

    ssh_port = free_port()
    # The installed disks boot by UEFI here (OVMF, the removable-path loader on the ESP); the
    # gateway test boots them by BIOS.
    booted = VM(tmp_path, name="firstboot", disks=disks, guestfwd=fwd, hostfwd={ssh_port: 22}, uefi=True)
    booted.start()
    try:
        first = await wait_until(
            lambda: [c for c in ep.calls if c.path == "/controlnode/firstboot"],
            timeout=600,
            interval=1,
            what="first-boot callback",
        )
        t_firstboot = time.monotonic()
        assert first[0].token == "tok-direct"
        assert first[0].body == {"bmc_ip": "10.0.0.7", "os_ip": "10.0.2.15"}
        async with asyncssh.connect(
            "127.0.0.1", ssh_port, username="karios", client_keys=[key], known_hosts=None
        ) as conn:
            hostname = (await conn.run("hostname", check=True)).stdout.strip()
            mdstat = (await conn.run("cat /proc/mdstat", check=True)).stdout
            root = (await conn.run("findmnt -no SOURCE /", check=True)).stdout.strip()
            cmdline = (await conn.run("cat /proc/cmdline", check=True)).stdout
            efi = (await conn.run("test -d /sys/firmware/efi && echo uefi", check=False)).stdout.strip()
            keys = (await conn.run("cat ~/.ssh/authorized_keys", check=True)).stdout
        assert hostname == "karios-node-7"
        assert "raid1" in mdstat and "vda3" in mdstat and "vdb3" in mdstat, mdstat
        assert root.startswith("/dev/md"), root
        assert "console=ttyS0,115200n8" in cmdline and "root=UUID=" in cmdline
        assert efi == "uefi"
        assert pubkey in keys
    finally:
        booted.stop()
    timeline = {s.body["step"]: round(s.at - t0, 1) for s in steps}
    timeline |= {"complete": round(complete[0].at - t0, 1), "installed": round(t_installed - t0, 1)}
    timeline["firstboot"] = round(t_firstboot - t0, 1)
    for d in disks:  # GBs of installed system; a failing run keeps them for a look
        d.path.unlink()
    (Path("/tmp") / "karios-image-install-timeline.json").write_text(json.dumps(timeline, indent=1))
    print("image install timeline (s from qemu start):", timeline)


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
