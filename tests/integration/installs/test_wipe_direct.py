"""The wipe medium, booted for real in qemu (TCG) without the job service: only the disk named
on a static address is wiped; a disk whose discard does not zero keeps no filesystem copy; one
result per disk arrives through the callback; the VM powers itself off. (Every disk of a
virtio, an AHCI and an NVMe disk marked at both ends, the default policy, is booted once, end to
end through the gateway: ``test_wipe_gateway.py``.) With the ``secure`` policy, qemu's NVMe
disk is erased by Format NVM (what its controller supports: no sanitize, no crypto erase) and a
virtio disk falls back to the verified overwrite of both ends."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.provisioner.install import HostContext
from karios.provisioner.install.live import LiveImages
from karios.provisioner.install.wipe import WipeMethod
from tests.fixtures.installs import PART_OFFSET, InstallerEndpoint, initrd_with_overlay, marked_disks, probe
from tests.lab.vm import MIB, VM, Disk, make_disk, read_marker, write_marker

pytestmark = [pytest.mark.timeout(600), pytest.mark.vm]
GW = "10.0.2.100"
VERIFIED = "read back as zeros, blkid finds nothing"  # how every per-disk result ends


def _wipe_vm(
    tmp_path: Path,
    ep: InstallerEndpoint,
    live_images: LiveImages,
    drives: list[Disk],
    *,
    name: str,
    bmc_ip: str = "10.0.0.9",
    policy: str = "fast",
    **host: object,
) -> VM:
    """The wipe medium of one host (job ``job-<name>``, token ``tok-<name>``) booted with
    ``-kernel``/``-initrd`` against the recording endpoint, ``drives`` attached; ``host`` goes to
    the HostContext (``disks`` named, ``static`` address), ``policy`` is the deployment's
    ``wipe_policy``."""
    ctx = HostContext(
        job_id=f"job-{name}",
        token=f"tok-{name}",
        callback_base=f"http://{GW}:{ep.port}/controlnode",
        hostname="",
        bmc_ip=bmc_ip,
        os_username="karios",
        password_hash="",
        job_type="unprovision",
        **host,  # type: ignore[arg-type]
    )
    cfg = SimpleNamespace(
        cache_dir=tmp_path,
        images_dir=live_images.images_dir,
        mirror_host="",
        mirror_dir="",
        wipe_policy=policy,
    )
    medium = WipeMethod(cfg).medium(ctx)
    return VM(
        tmp_path,
        name=name,
        kernel=medium.kernel,
        initrd=initrd_with_overlay(medium, tmp_path / f"{name}.initrd.img"),
        append=" ".join(["console=ttyS0,115200n8", *medium.kernel_args]),
        disks=drives,
        guestfwd={f"{GW}:{ep.port}": ep.port},
        no_reboot=True,
    )


async def _until_power_off(vm: VM, timeout: float = 400) -> float:
    """Boot, wait for the VM to power itself off (exit 0); seconds from qemu start."""
    t0 = time.monotonic()
    vm.start()
    try:
        rc = await vm.wait_exit(timeout=timeout)
    finally:
        vm.stop()
    assert rc == 0, vm.tail()
    return time.monotonic() - t0


def test_marked_disks_carry_signatures(tmp_path: Path) -> None:
    disks = marked_disks(tmp_path)
    assert 'PTTYPE="dos"' in probe(disks[0].path)
    assert 'TYPE="ext4"' in probe(disks[0].path, PART_OFFSET)
    assert read_marker(disks[2].path, "last").startswith(b"KARIOS-LAST-nvme")


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
    static = {"address": "10.0.2.30", "netmask": "255.255.255.0", "gateway": "10.0.2.2"}
    vm = _wipe_vm(
        tmp_path,
        ep,
        live_images,
        [keep, wipe],
        name="static",
        bmc_ip="10.0.0.10",
        disks=["vdb"],
        static=static,
    )
    await _until_power_off(vm)
    steps = {s.body["step"]: s.body.get("message", "") for s in ep.steps()}
    assert steps["network"] == "10.0.2.30 on eth0", steps
    assert list(steps) == ["network", "wipe:/dev/vdb", "wiped"], steps
    assert "udhcpc" not in vm.serial()
    complete = [c for c in ep.calls if c.path.endswith("/complete")]
    assert complete and complete[0].body["os_ip"] == "10.0.2.30"
    assert read_marker(keep.path).startswith(b"KARIOS-FIRST")  # not named: untouched
    assert read_marker(keep.path, "last").startswith(b"KARIOS-LAST")
    assert read_marker(wipe.path) == bytes(MIB) and read_marker(wipe.path, "last") == bytes(MIB)


BTRFS_MAGIC = b"_BHRfS_M"  # at byte 64 of each superblock copy (64 KiB, 64 MiB, 256 GiB in)


def _btrfs_copies(image: Path, offset: int) -> list[int]:
    """Which btrfs superblock copies (0, 1) a filesystem starting at ``offset`` still has."""
    with open(image, "rb") as f:
        found = []
        for n, at in enumerate((64 << 10, 64 * MIB)):
            f.seek(offset + at + 64)
            if f.read(8) == BTRFS_MAGIC:
                found.append(n)
    return found


async def test_wipe_where_discard_does_not_zero_leaves_no_btrfs_copy(
    tmp_path: Path, live_images, installer_endpoint: InstallerEndpoint
) -> None:
    """A disk whose discard is accepted and changes nothing (qemu ``discard=ignore``) with an MBR
    and a btrfs partition: afterwards neither btrfs superblock copy (64 KiB, 64 MiB into the
    partition) is readable, and the step says discard did not zero and how it was verified."""
    import shutil
    import subprocess

    from tests.fixtures.apps import REQUIRE
    from tests.fixtures.installs import write_mbr

    if shutil.which("mkfs.btrfs") is None:
        reason = "mkfs.btrfs missing (apt-get install btrfs-progs; tests/lab/setup.sh installs it)"
        pytest.fail(reason) if REQUIRE else pytest.skip(reason)
    ep = installer_endpoint
    disk = Disk(tmp_path / "ssd.img", 256 * MIB, "virtio", discard="ignore")
    make_disk(disk.path, disk.size)
    fs = tmp_path / "btrfs.img"
    make_disk(fs, 200 * MIB)
    subprocess.run(["mkfs.btrfs", "-q", "-f", str(fs)], check=True, capture_output=True)
    with open(fs, "rb") as src, open(disk.path, "r+b") as dst:
        dst.seek(PART_OFFSET)
        shutil.copyfileobj(src, dst, 1 << 20)
    write_mbr(disk.path, PART_OFFSET // 512, 200 * 2048)
    assert _btrfs_copies(disk.path, PART_OFFSET) == [0, 1]
    await _until_power_off(_wipe_vm(tmp_path, ep, live_images, [disk], name="ssd", bmc_ip="10.0.0.11"))
    steps = {s.body["step"]: s.body.get("message", "") for s in ep.steps()}
    msg = steps.get("wipe:/dev/vda", "")
    assert "discard did NOT zero (" in msg and "discard zeroed" not in msg, steps
    assert msg.startswith("wiped 256 MiB: ") and msg.endswith(VERIFIED), steps
    assert _btrfs_copies(disk.path, PART_OFFSET) == []
    assert probe(disk.path) == "" and probe(disk.path, PART_OFFSET) == ""
    print("wipe, discard=ignore:", msg)


def _mark_everywhere(disk: Disk) -> int:
    """``KARIOS-DATA-…`` every 8 MiB of the image and in its last 4 KiB; how many markers."""
    offsets = [*range(0, disk.size, 8 * MIB), disk.size - 4096]
    with open(disk.path, "r+b") as f:
        for at in offsets:
            f.seek(at)
            f.write(f"KARIOS-DATA-{disk.bus}-{at}".encode())
    return len(offsets)


def _markers_at(image: Path) -> list[int]:
    """Where anything Karios wrote before the wipe (or the ladder's own markers) is still found."""
    data, found = image.read_bytes(), []
    at = data.find(b"KARIOS-")
    while at != -1:
        found.append(at)
        at = data.find(b"KARIOS-", at + 1)
    return found


async def test_secure_wipe_formats_nvme_and_overwrites_virtio(
    tmp_path: Path, live_images, installer_endpoint: InstallerEndpoint
) -> None:
    """Policy ``secure`` on what qemu's devices support. The NVMe controller (its Identify data
    read by nvme-cli in the live environment) has Format NVM but no sanitize and no crypto erase:
    the step names nvme-format-user, verified by the pre-erase markers being gone. The virtio disk
    has no device erase (hdparm and sg_opcodes say why): the overwrite of both ends (the whole
    64 MiB) read back whole. Then the fast steps; no marker written before is left anywhere."""
    ep = installer_endpoint
    disks = [Disk(tmp_path / "nvme.img", 64 * MIB, "nvme"), Disk(tmp_path / "virtio.img", 64 * MIB)]
    for d in disks:
        make_disk(d.path, d.size)
        assert _mark_everywhere(d) == 9 and len(_markers_at(d.path)) == 9  # 0, 8 … 56 MiB, the last 4 KiB
    vm = _wipe_vm(tmp_path, ep, live_images, disks, name="secure", bmc_ip="10.0.0.12", policy="secure")
    elapsed = await _until_power_off(vm)
    done = {s.body["step"]: s.body.get("message", "") for s in ep.steps() if s.body["state"] == "done"}
    active = [s.body.get("message", "") for s in ep.steps() if s.body["state"] == "active"]
    nvme, virtio = done["wipe:/dev/nvme0n1"], done["wipe:/dev/vda"]
    assert nvme.startswith(
        "wiped 64 MiB: method: nvme-format-user (format, secure erase SES=1 user data erase (OACS 0x"
    ), nvme
    assert (
        "verified: the pre-erase marker is gone at all 9 sampled offsets (9 read back as zeros) (not used: "
        "nvme-sanitize-crypto: not supported (SANICAP 0x0) / nvme-sanitize-block: not supported (SANICAP "
        "0x0) / nvme-format-crypto: not supported (FNA 0x0)); "
    ) in nvme, nvme
    assert virtio.startswith(
        "wiped 64 MiB: method: overwrite-ends (zeros over the first and last GiB), verified: all 64 MiB "
        "read back as zeros (not used: ata-security-erase: no ATA security feature set (hdparm -I"
    ), virtio
    assert " / scsi-sanitize: " in virtio, virtio
    assert nvme.endswith(VERIFIED) and virtio.endswith(VERIFIED)
    assert any(m.startswith("erasing /dev/nvme0n1: nvme-format-user ") for m in active), active
    for d in disks:
        assert _markers_at(d.path) == [], d.bus
        assert d.path.read_bytes().count(0) == d.size, f"{d.bus}: not all zeros"
    at = {s.body["step"]: s.at for s in ep.steps() if s.body["state"] == "done"}
    took = {n: round(at[n] - at[p], 1) for p, n in zip(list(at), list(at)[1:], strict=False)}
    print(f"secure wipe: qemu start to power-off {elapsed:.1f} s; seconds per step {took};", done)
