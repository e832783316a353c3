"""Image-based install END TO END through the gateway, booted for real in qemu (TCG).

Provision **Debian 13** (``debian_version: "13"``: Karios's own trixie image and live environment;
the other VM tests install Debian 12) on the Redfish emulator through the gateway, boot the ISO
Karios built (downloaded from the provisioner's ``/media/{job}.iso``) in qemu with two virtio disks
and ``pool_type: mirror`` as md RAID1 (``pool_backend: md``; ZFS, the default, is
``test_zfs_install.py``), follow SSE: every install stage arrives in order with its percent, the VM
reboots from its disks into Debian 13 (BIOS), the first-boot callback completes the job with the
node's IP and registers the node, and the installed system has the md RAID1 root, the hostname, the
serial console and the SSH key asked for (checked over SSH with that key). Then the same disks boot
by UEFI (OVMF, the removable-path loader on the ESP) into the same system, up to its init running
from the md root (the serial console shows the EFI boot, the installed GRUB's kernel line, the
mirror assembled and the root mounted): one install, booted by both firmwares — an install costs
minutes under TCG, a boot one.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import asyncssh
import httpx
import pytest

from karios.provisioner.install import INSTALL_STAGES
from tests.fixtures.apps import ADMIN
from tests.fixtures.installs import InstallStack
from tests.fixtures.provision import fetch_medium, wait_bmc_clean, wait_job
from tests.fixtures.sse import open_sse
from tests.lab.vm import GUEST_IP, VM, Disk, as_root, free_port

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.timeout(2400), pytest.mark.vm]


async def test_image_install_to_first_boot_through_the_gateway(install_stack: InstallStack, tmp_path: Path):
    st = install_stack
    password = "img-s3cret-pw"
    key = asyncssh.generate_private_key("ssh-ed25519", comment="ops@karios-test")
    public = key.export_public_key().decode().strip()
    async with (
        httpx.AsyncClient(base_url=st.gw, timeout=60) as c,
        open_sse(c, "/controlnode/events?channel=provision", timeout=2000) as sse,
    ):
        t0 = time.monotonic()
        r = await c.post(
            "/controlnode/provision",
            json={
                "bmc_IP": st.bmc_ip,
                "vendor": "generic",
                "hostname": "karios-img-1",
                "debian_version": "13",
                "os_username": "operator",
                "os_password": password,
                "selected_disks": ["vda", "vdb"],
                "pool_type": "mirror",
                "pool_backend": "md",  # ZFS is the default: test_zfs_install.py
                "install_method": "image",
                "ssh_authorized_keys": [public],
            },
            headers=ADMIN,
        )
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        await wait_job(c, job, {"booting"}, timeout=300)
        t_booting = time.monotonic()
        iso = await fetch_medium(st.emu, job, tmp_path / "medium.iso")  # by the signed URL the BMC was given

        ssh_port = free_port()
        # 2 GiB each: the root needs ~0.9 GiB, and the mirror's resync (the whole md partition, in the
        # live environment and on first boot) costs ~40 CPU s of TCG for 4 GiB disks, ~20 for 2.
        disks = [Disk(tmp_path / "vda.img", 2 << 30), Disk(tmp_path / "vdb.img", 2 << 30)]
        vm = VM(
            tmp_path,
            iso=iso,  # -boot once=d: the install's reboot comes up from the disks
            disks=disks,
            guestfwd=st.guestfwd(),
            hostfwd={ssh_port: 22},
        )
        vm.start()
        try:
            done = await wait_job(c, job, {"completed", "failed"}, timeout=1800)
            t_done = time.monotonic()
            assert done["job_status"] == "completed", (done, vm.tail())
            assert done["node_ip"] == GUEST_IP
            await vm.wait_serial(r"karios-img-1 login:", timeout=300)
            async with asyncssh.connect(  # the key asked for in the request, not the password
                "127.0.0.1", ssh_port, username="operator", client_keys=[key], password=None, known_hosts=None
            ) as conn:
                authorized = (await conn.run("cat ~/.ssh/authorized_keys", check=True)).stdout
                hostname = (await conn.run("hostname", check=True)).stdout.strip()
                # systemd's tools answer the operator (the image carries D-Bus)
                hostnamectl = (await conn.run("hostnamectl hostname", check=False)).stdout.strip()
                release = (
                    await conn.run(". /etc/os-release; echo $VERSION_ID $VERSION_CODENAME", check=True)
                ).stdout
                mdstat = (await conn.run("cat /proc/mdstat", check=True)).stdout
                root = (await conn.run("findmnt -no SOURCE /", check=True)).stdout.strip()
                # The ESP is mounted `nofail` (a mirror boots without its first disk), so systemd does
                # not order it before the login prompt: on a loaded host sshd answers first. Wait for
                # the boot's start-up jobs to finish ("running" or "degraded"), then look; the mount
                # waits for its device up to the fstab's x-systemd.device-timeout (5 min: the
                # default 90 s was outrun by udev's coldplug under a loaded CI when udev-settle,
                # which the image's zfs-load-module requires, was turned off in a rehearsal).
                sudo = as_root(password)
                waited = await conn.run(sudo + "timeout 400 systemctl is-system-running --wait", check=False)
                state = f"{waited.stdout}{waited.stderr}".strip()
                assert state in ("running", "degraded"), state
                efi = (await conn.run("findmnt -no FSTYPE /boot/efi", check=False)).stdout.strip()
                cmdline = (await conn.run("cat /proc/cmdline", check=True)).stdout
            block = vm.monitor("info block")  # the harness's monitor socket answers
        finally:
            vm.stop()
        assert hostname == "karios-img-1"
        assert hostnamectl == "karios-img-1", hostnamectl
        assert release.split() == ["13", "trixie"], release
        assert public in authorized
        assert "raid1" in mdstat and "vda3" in mdstat and "vdb3" in mdstat, mdstat
        assert root.startswith("/dev/md"), root
        assert efi == "vfat", state  # the first disk's EFI system partition
        assert "console=ttyS0,115200n8" in cmdline and "root=UUID=" in cmdline, cmdline
        assert "vda.img" in block and "vdb.img" in block, block

        # The first boot registered the node at the address the installer reported.
        r = await c.get(f"/controlnode/nodes/{GUEST_IP}", headers=ADMIN)
        assert r.status_code == 200, r.text
        node = r.json()
        assert (node["source"], node["bmc_ip"], node["hostname"]) == ("firstboot", st.bmc_ip, "karios-img-1")
        assert password not in r.text

        # The same disks by UEFI: the ESP's removable-path loader boots the same md root — up to
        # the installed system's init running from it (the rest is the boot inspected above).
        again = VM(tmp_path, name="uefi", disks=disks, uefi=True)
        again.start()
        try:
            uefi = await again.wait_init_from_disk("karios-img-1", timeout=600)
        finally:
            again.stop()
        root_uuid = re.search(r"root=UUID=([0-9a-f-]+)", cmdline)
        assert root_uuid, cmdline
        assert re.search(r"efi: EFI v\d", uefi), uefi[-3000:]  # the kernel started by the firmware's EFI
        assert f"root=UUID={root_uuid.group(1)}" in uefi, uefi[-3000:]  # the installed GRUB's entry
        md = re.search(r"md/raid1:(md\d+): active with 2 out of 2 mirrors", uefi)
        assert md, uefi[-3000:]  # the initramfs assembled the mirror and mounted the root on it
        # (Linux ≥ 6.3 names the filesystem's UUID in this line: Debian 13's kernel, not 12's)
        assert f"EXT4-fs ({md.group(1)}): mounted filesystem {root_uuid.group(1)}" in uefi, uefi[-3000:]

        events = await sse.collect(
            until=lambda evs: any(
                e.event == "job_completed" and e.json()["data"].get("job_id") == job for e in evs
            ),
            timeout=60,
        )
        mine = [(e.event, e.json()["data"]) for e in events if e.json()["data"].get("job_id") == job]
        step_messages = [d.get("message", "") for n, d in mine if n == "job_step"]
        labels = [s.label for s in INSTALL_STAGES]
        seen = [next((lbl for lbl in labels if m.startswith(lbl)), m) for m in step_messages]
        assert seen == labels, step_messages
        percents = [d.get("percent") for n, d in mine if n == "job_step"]
        assert percents == [s.percent for s in INSTALL_STAGES], percents
        names = [n for n, _ in mine]
        assert names.index("job_booting") < names.index("job_step") < names.index("job_first_boot")
        assert names[-1] == "job_completed"
        assert all(password not in json.dumps(d) for _, d in mine)
        await wait_bmc_clean(st.emu, st.system_id)
    timeline = {
        "post_to_booting": round(t_booting - t0, 1),
        "post_to_completed": round(t_done - t0, 1),
        "steps": step_messages,
    }
    for img in (tmp_path / "vda.img", tmp_path / "vdb.img", iso):  # a failing run keeps them
        img.unlink()
    Path("/tmp/karios-image-gateway-timeline.json").write_text(json.dumps(timeline, indent=1))
    print("image install through the gateway:", timeline)
