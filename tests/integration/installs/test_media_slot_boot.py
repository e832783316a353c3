"""The constant-size medium boots for real in qemu (TCG), BIOS (isolinux) and UEFI (OVMF + GRUB):
the shared base ISO with one job's slot patched in (the bytes ``GET /media/<job>.iso`` serves) is
booted with one marked disk; the live environment finds the job's files in the second initrd
(``/karios/host.img``), calls back with that job's token, wipes the disk and powers off.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.provisioner.install import HostContext
from karios.provisioner.install.wipe import WipeMethod
from karios.provisioner.media import MediaBuilder
from tests.fixtures.installs import InstallerEndpoint, tempfile_dir
from tests.lab.vm import MIB, OVMF_CODE, VM, Disk, make_disk, read_marker, write_marker

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.timeout(900),
    pytest.mark.vm(chain="debian-installer"),
]
GW = "10.0.2.100"


@pytest.mark.parametrize("firmware", ["bios", "uefi"])
async def test_patched_medium_boots_and_runs_the_jobs_files(
    firmware: str, tmp_path: Path, live_images, installer_endpoint: InstallerEndpoint
) -> None:
    if firmware == "uefi" and not OVMF_CODE.exists():
        pytest.skip("OVMF not installed")
    ep = installer_endpoint
    job = f"slot-{firmware}"
    ctx = HostContext(
        job_id=job,
        token=f"tok-{firmware}-slot",
        callback_base=f"http://{GW}:{ep.port}/controlnode",
        hostname="",
        bmc_ip="10.0.0.9",
        os_username="karios",
        password_hash="",
        job_type="unprovision",
        disks=["/dev/vda"],
    )
    cfg = SimpleNamespace(
        cache_dir=tmp_path, images_dir=live_images.images_dir, mirror_host="", mirror_dir=""
    )
    builder = MediaBuilder(Path(tempfile_dir()) / "karios-test-media-cache", tmp_path / "media")
    builder.build(job, WipeMethod(cfg).medium(ctx))
    served = builder.open(job)
    assert served is not None
    iso = served.write_to(tmp_path / f"{job}.iso")
    disk = Disk(tmp_path / "vda.img", 64 * MIB, "virtio")
    make_disk(disk.path, disk.size)
    write_marker(disk.path, "KARIOS-FIRST")
    vm = VM(tmp_path, iso=iso, disks=[disk], guestfwd={f"{GW}:{ep.port}": ep.port}, uefi=firmware == "uefi")
    vm.no_reboot = True
    t0 = time.monotonic()
    vm.start()
    try:
        rc = await vm.wait_exit(timeout=600)
    finally:
        vm.stop()
    elapsed = time.monotonic() - t0
    assert rc == 0, vm.tail()
    assert ep.steps() and all(s.token == ctx.token for s in ep.steps()), vm.tail()
    assert [c.path for c in ep.calls][-1] == f"/controlnode/job/{job}/complete", ep.paths()
    assert read_marker(disk.path, "first") == bytes(MIB)
    iso.unlink()
    builder.remove(job)
    print(f"{firmware}: patched medium, qemu start to power-off {elapsed:.1f} s")
