"""Root on ZFS, END TO END through the gateway, booted for real in qemu (TCG) — issue 25 item 3.

Provision Debian 12 with ``pool_type: raidz1`` on three virtio disks and no ``pool_backend`` (the
seed's ZFS vocabulary now means ZFS: the default for a pool of several disks on Karios's own
image). The live environment loads the OpenZFS modules the image build made once (zfs-dkms from
the archive's contrib component, packaged as zfs-modules), creates the raidz1 pool of every
disk's 4th partition, streams the root onto the ``rpool/ROOT/debian`` dataset and /boot onto an
md RAID1 of the 3rd partitions, installs GRUB for BIOS and UEFI and exports the pool. The VM
boots from its disks (BIOS) through the image's initramfs (zfs-initramfs imports the pool), the
first boot completes the job, and over SSH: ``zpool status`` shows the raidz1 of vda4, vdb4 and
vdc4 ONLINE, / is the ZFS dataset, /boot the md RAID1. Then the same disks boot by UEFI (OVMF) up
to the installed system's init running from the pool (the serial console shows the EFI boot, the
installed GRUB's ``root=ZFS=`` kernel line and the OpenZFS module the initramfs loaded).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import asyncssh
import httpx
import pytest

from tests.fixtures.apps import ADMIN
from tests.fixtures.installs import INSTALL_BMC, start_install_stack
from tests.fixtures.provision import fetch_medium, wait_job, write_inventory
from tests.lab.vm import GUEST_IP, VM, Disk, as_root, free_port

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.timeout(2400), pytest.mark.vm]

DISKS = ("vda", "vdb", "vdc")


async def _facts(port: int, key: asyncssh.SSHKey, password: str) -> dict[str, str]:
    async with asyncssh.connect(
        "127.0.0.1", port, username="operator", client_keys=[key], password=None, known_hosts=None
    ) as conn:

        async def run(cmd: str) -> str:
            return (await conn.run(cmd, check=True)).stdout.strip()

        sudo = as_root(password)
        return {
            "zpool": await run(sudo + "zpool status -P rpool"),
            "health": await run(sudo + "zpool list -H -o health rpool"),
            "root": await run("findmnt -no SOURCE,FSTYPE /"),
            "boot": await run("findmnt -no SOURCE,FSTYPE /boot"),
            "mdstat": await run("cat /proc/mdstat"),
            "cmdline": await run("cat /proc/cmdline"),
            "firmware": await run("test -d /sys/firmware/efi && echo uefi || echo bios"),
            # a ZFS root needs the image's ZFS units
            "zfs_units": await run(
                sudo + "systemctl is-enabled zfs-load-module.service zfs-import-cache.service zfs.target"
            ),
        }


async def test_raidz1_root_on_zfs_boots_bios_and_uefi(
    settings, serve, live_images, tmp_path_factory, tmp_path
):
    inventory = write_inventory(
        tmp_path_factory.mktemp("inventory") / "inventory.yaml", [INSTALL_BMC], disks=DISKS
    )
    password = "zfs-s3cret-pw"
    key = asyncssh.generate_private_key("ssh-ed25519")
    async with (
        start_install_stack(settings, serve, live_images, tmp_path_factory, inventory) as st,
        httpx.AsyncClient(base_url=st.gw, timeout=60) as c,
    ):
        t0 = time.monotonic()
        body = {
            "bmc_IP": st.bmc_ip,
            "vendor": "generic",
            "hostname": "karios-zfs-1",
            "os_username": "operator",
            "os_password": password,
            "selected_disks": list(DISKS),
            "pool_type": "raidz1",
            "install_method": "image",
            "ssh_authorized_keys": [key.export_public_key().decode().strip()],
        }
        # zfs cannot be built by the Debian installer: 422 naming the field, nothing started.
        r = await c.post(
            "/controlnode/provision",
            json={**body, "install_method": "preseed", "pool_backend": "zfs"},
            headers=ADMIN,
        )
        assert r.status_code == 422 and r.json()["field"] == "pool_backend", r.text
        r = await c.post("/controlnode/provision", json=body, headers=ADMIN)
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        await wait_job(c, job, {"booting"}, timeout=300)
        iso = await fetch_medium(st.emu, job, tmp_path / "medium.iso")
        disks = [Disk(tmp_path / f"{d}.img", 4 << 30) for d in DISKS]
        ssh_port = free_port()
        vm = VM(tmp_path, iso=iso, disks=disks, guestfwd=st.guestfwd(), hostfwd={ssh_port: 22})
        vm.start()
        try:
            done = await wait_job(c, job, {"completed", "failed"}, timeout=1800)
            t_done = time.monotonic()
            assert done["job_status"] == "completed", (done, vm.tail())
            assert done["node_ip"] == GUEST_IP
            await vm.wait_serial(r"karios-zfs-1 login:", timeout=300)
            bios = await _facts(ssh_port, key, password)
        finally:
            vm.stop()
        # The same disks by UEFI, up to the installed system's init running from the pool (the
        # rest of the boot is the one inspected over SSH above).
        again = VM(tmp_path, name="uefi", disks=disks, uefi=True)
        again.start()
        try:
            uefi = await again.wait_init_from_disk("karios-zfs-1", timeout=600)
        finally:
            again.stop()
    assert re.search(r"efi: EFI v\d", uefi), uefi[-3000:]  # the kernel started by the firmware's EFI
    # the installed GRUB's entry; the initramfs imported the pool and mounted the dataset systemd runs from
    assert re.search(r"Command line: .*root=ZFS=rpool/ROOT/debian ", uefi), uefi[-3000:]
    assert re.search(r"ZFS: Loaded module v\d", uefi), uefi[-3000:]
    assert bios["firmware"] == "bios"
    assert bios["zfs_units"].split() == ["enabled"] * 3, bios["zfs_units"]
    assert bios["health"] == "ONLINE", bios["zpool"]
    zpool = bios["zpool"]
    assert "raidz1-0" in zpool and all(f"/dev/{d}4" in zpool for d in DISKS), zpool
    assert "errors: No known data errors" in zpool, zpool
    assert bios["root"].split() == ["rpool/ROOT/debian", "zfs"], bios["root"]
    assert bios["boot"].split()[1] == "ext4" and bios["boot"].startswith("/dev/md"), bios["boot"]
    assert "raid1" in bios["mdstat"] and all(f"{d}3" in bios["mdstat"] for d in DISKS), bios["mdstat"]
    assert "root=ZFS=rpool/ROOT/debian" in bios["cmdline"], bios["cmdline"]
    for img in [*(tmp_path / f"{d}.img" for d in DISKS), iso]:  # a failing run keeps them
        img.unlink()
    timeline = {"post_to_completed": round(t_done - t0, 1), "zpool": bios["zpool"]}
    Path("/tmp/karios-zfs-timeline.json").write_text(json.dumps(timeline, indent=1))
    print("root on ZFS raidz1:", timeline)
