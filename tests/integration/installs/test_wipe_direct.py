"""The wipe medium, booted for real in qemu (TCG) without the job service: a virtio, an AHCI
and an NVMe disk, marked at both ends (one with a real GPT + ext4 + md signatures), are all
wiped; one result per disk arrives through the callback; the VM powers itself off."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.provisioner.install import HostContext
from karios.provisioner.install.wipe import WipeMethod
from tests.fixtures.installs import PART_OFFSET, InstallerEndpoint, initrd_with_overlay, marked_disks, probe
from tests.lab.vm import MIB, VM, Disk, make_disk, read_marker, write_marker

pytestmark = [pytest.mark.timeout(600), pytest.mark.vm]
GW = "10.0.2.100"


def test_marked_disks_carry_signatures(tmp_path: Path) -> None:
    disks = marked_disks(tmp_path)
    assert 'PTTYPE="dos"' in probe(disks[0].path)
    assert 'TYPE="ext4"' in probe(disks[0].path, PART_OFFSET)
    assert read_marker(disks[2].path, "last").startswith(b"KARIOS-LAST-nvme")


async def test_wipe_medium_wipes_every_disk(
    tmp_path: Path, live_images, installer_endpoint: InstallerEndpoint
) -> None:
    ep = installer_endpoint
    disks = marked_disks(tmp_path)
    ctx = HostContext(
        job_id="job-wipe",
        token="tok-wipe",
        callback_base=f"http://{GW}:{ep.port}/controlnode",
        hostname="",
        bmc_ip="10.0.0.9",
        os_username="karios",
        password_hash="",
        job_type="unprovision",
    )
    cfg = SimpleNamespace(
        cache_dir=tmp_path, images_dir=live_images.images_dir, mirror_host="", mirror_dir=""
    )
    medium = WipeMethod(cfg).medium(ctx)
    vm = VM(
        tmp_path,
        name="wipe",
        kernel=medium.kernel,
        initrd=initrd_with_overlay(medium, tmp_path / "initrd.img"),
        append=" ".join(["console=ttyS0,115200n8", *medium.kernel_args]),
        disks=disks,
        guestfwd={f"{GW}:{ep.port}": ep.port},
        no_reboot=True,
    )
    t0 = time.monotonic()
    vm.start()
    try:
        rc = await vm.wait_exit(timeout=400)
    finally:
        vm.stop()
    elapsed = time.monotonic() - t0
    assert rc == 0, vm.tail()
    steps = [(s.body["step"], s.body["state"], s.body.get("message", "")) for s in ep.steps()]
    assert all(s.token == "tok-wipe" for s in ep.steps())
    names = [s[0] for s in steps]
    assert names[0] == "network" and names[-1] == "wiped", steps
    per_disk = {n: m for n, st, m in steps if n.startswith("wipe:")}
    assert sorted(per_disk) == ["wipe:/dev/nvme0n1", "wipe:/dev/sda", "wipe:/dev/vda"], steps
    for disk, message in per_disk.items():
        assert message.startswith("wiped 256 MiB") and message.endswith("ends zeroed"), (disk, message)
    assert "discard ok" in per_disk["wipe:/dev/vda"]
    assert per_disk["wipe:/dev/vda"].startswith("wiped 256 MiB: 2 signature(s) cleared")  # MBR + ext4
    assert [c.path for c in ep.calls][-1] == "/controlnode/job/job-wipe/complete"
    for d in disks:
        assert read_marker(d.path, "first") == bytes(MIB), f"{d.bus}: first MiB not wiped"
        assert read_marker(d.path, "last") == bytes(MIB), f"{d.bus}: last MiB not wiped"
    assert probe(disks[0].path) == "" and "ext4" not in probe(disks[0].path, PART_OFFSET)
    print(f"wipe: qemu start to power-off {elapsed:.1f} s;", per_disk)


async def test_wipe_named_disk_only_on_a_static_address(
    tmp_path: Path, live_images, installer_endpoint: InstallerEndpoint
) -> None:
    """``ctx.disks`` limits the wipe to the disks named; the live environment takes the static
    address of the host context (no DHCP) and reports from it."""
    ep = installer_endpoint
    keep, wipe = (Disk(tmp_path / "keep.img", 64 * MIB), Disk(tmp_path / "wipe.img", 64 * MIB))
    for d in (keep, wipe):
        make_disk(d.path, d.size)
        write_marker(d.path, "KARIOS-FIRST")
        write_marker(d.path, "KARIOS-LAST", where="last")
    ctx = HostContext(
        job_id="job-static",
        token="tok-static",
        callback_base=f"http://{GW}:{ep.port}/controlnode",
        hostname="",
        bmc_ip="10.0.0.10",
        os_username="karios",
        password_hash="",
        disks=["vdb"],
        static={"address": "10.0.2.30", "netmask": "255.255.255.0", "gateway": "10.0.2.2"},
        job_type="unprovision",
    )
    cfg = SimpleNamespace(
        cache_dir=tmp_path, images_dir=live_images.images_dir, mirror_host="", mirror_dir=""
    )
    medium = WipeMethod(cfg).medium(ctx)
    vm = VM(
        tmp_path,
        name="static",
        kernel=medium.kernel,
        initrd=initrd_with_overlay(medium, tmp_path / "initrd.img"),
        append=" ".join(["console=ttyS0,115200n8", *medium.kernel_args]),
        disks=[keep, wipe],
        guestfwd={f"{GW}:{ep.port}": ep.port},
        no_reboot=True,
    )
    vm.start()
    try:
        assert await vm.wait_exit(timeout=400) == 0, vm.tail()
    finally:
        vm.stop()
    steps = {s.body["step"]: s.body.get("message", "") for s in ep.steps()}
    assert steps["network"] == "10.0.2.30 on eth0", steps
    assert list(steps) == ["network", "wipe:/dev/vdb", "wiped"], steps
    assert "udhcpc" not in vm.serial()
    complete = [c for c in ep.calls if c.path.endswith("/complete")]
    assert complete and complete[0].body["os_ip"] == "10.0.2.30"
    assert read_marker(keep.path).startswith(b"KARIOS-FIRST")  # not named: untouched
    assert read_marker(keep.path, "last").startswith(b"KARIOS-LAST")
    assert read_marker(wipe.path) == bytes(MIB) and read_marker(wipe.path, "last") == bytes(MIB)
