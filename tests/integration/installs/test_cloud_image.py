"""A distribution-style cloud image from the catalog, installed END TO END through the gateway and
booted for real in qemu (TCG) up to cloud-init's first boot.

The image: a Debian qcow2 with cloud-init built here from Debian packages (``tests/lab/cloudimage.py``),
knowing nothing of Karios. It is registered in the catalog (``POST /controlnode/images``: served
as raw.zst), then, before any VM:

- a provision naming an unknown image, a whole-disk image on a mirror, a Debian-installer method
  or a disk the inventory says is smaller than the image is a 422 naming the field;

then one install on a 2 GiB virtio disk with a static address from the inventory's pool, its name
servers, a password and an SSH key: every install stage arrives, the live environment writes
the image verifying its SHA-256, grows the root partition and adds the CIDATA seed; the installed
system's first boot is cloud-init's ``phone_home`` (the job completes with the address the
installer reported, the node is registered), and over SSH with the key asked for: the hostname, the
user, the static address (no DHCP lease), the default route and the name servers of the inventory,
the grown root filesystem, the seed partition and ``cloud-init status: done``. No password in the
events.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import asyncssh
import httpx
import pytest
import yaml

from tests.fixtures.apps import ADMIN, REQUIRE
from tests.fixtures.installs import INSTALL_BMC, apt_proxy, lab_cache, register_qcow2, start_install_stack
from tests.fixtures.provision import fetch_medium, wait_bmc_clean, wait_job
from tests.fixtures.sse import open_sse
from tests.lab import cloudimage
from tests.lab.vm import GUEST_IP, VM, Disk, free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.lab,
    pytest.mark.timeout(2400),
    # beside the Debian installer's chain: the image chain is the longer one
    pytest.mark.vm(chain="debian-installer"),
]
HOSTNAME = "karios-cloud-1"
NAMESERVER = "10.0.2.3"


@pytest.fixture
async def cloud_stack(settings, serve, live_images, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The install stack on an inventory whose device is named as the host, with a static pool in
    qemu's user network and name servers of its own; its second disk is 1 GB (too small)."""
    missing = cloudimage.tools_missing()
    if missing:
        if REQUIRE:
            pytest.fail(f"the cloud image build needs {', '.join(missing)} (tests/lab/setup.sh)")
        pytest.skip(f"the cloud image build needs {', '.join(missing)}")
    inventory = tmp_path_factory.mktemp("inventory") / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "static_pool": {"cidr": "10.0.2.0/24", "start": GUEST_IP, "gateway": "10.0.2.2"},
                "devices": [
                    {
                        "id": 1,
                        "name": HOSTNAME,
                        "oob_ip": INSTALL_BMC,
                        "nameservers": [NAMESERVER],
                        "disks": [{"name": "vda", "size_gb": 2.1}, {"name": "vdb", "size_gb": 1}],
                    }
                ],
            },
            sort_keys=False,
        )
    )
    async with start_install_stack(settings, serve, live_images, tmp_path_factory, inventory) as st:
        yield st


async def register(c: httpx.AsyncClient, name: str, qcow2: Path) -> dict:
    view = await register_qcow2(c, ADMIN, name, qcow2)
    assert view["state"] == "ready", view
    assert view["whole_disk"] and view["served_format"] == "raw.zst"
    assert view["disk_bytes"] == cloudimage.DISK_BYTES
    return view


async def test_a_cloud_image_installs_to_cloud_init_first_boot(cloud_stack, tmp_path: Path) -> None:
    st = cloud_stack
    qcow2 = cloudimage.cached_cloud_image(lab_cache(), apt_proxy())
    password = "cloud-s3cret-pw"
    key = asyncssh.generate_private_key("ssh-ed25519", comment="ops@karios-cloud")
    public = key.export_public_key().decode().strip()
    name = f"vm-cloud-{uuid.uuid4().hex[:8]}"  # the catalog's database is shared: ours alone
    request = {
        "bmc_IP": st.bmc_ip,
        "vendor": "generic",
        "hostname": HOSTNAME,
        "os_username": "operator",
        "os_password": password,
        "selected_disks": ["vda"],
        "image": name,
        "prefix_id": 1,
        "ssh_authorized_keys": [public],
    }
    async with (
        httpx.AsyncClient(base_url=st.gw, timeout=60) as c,
        open_sse(c, "/controlnode/events?channel=provision", timeout=2000) as sse,
    ):
        t0 = time.monotonic()
        await register(c, name, qcow2)
        t_registered = time.monotonic()
        try:
            # What cannot work is refused before a job exists, naming the field.
            for change, field, words in (
                ({"image": "no-such-image"}, "image", "no image named 'no-such-image' in the catalog"),
                ({"pool_type": "mirror", "selected_disks": ["vda", "vdb"]}, "pool_type", "whole-disk image"),
                ({"install_method": "preseed"}, "install_method", "image method"),
                (
                    {"selected_disks": ["vdb"]},
                    "selected_disks",
                    f"disk vdb is 0.9 GiB; image {name} is a 1.2 GiB",
                ),
            ):
                r = await c.post("/controlnode/provision", json={**request, **change}, headers=ADMIN)
                assert r.status_code == 422, (change, r.text)
                assert r.json()["field"] == field and words in r.json()["message"], (change, r.text)

            t_post = time.monotonic()
            r = await c.post("/controlnode/provision", json=request, headers=ADMIN)
            assert r.status_code == 202, r.text
            job = r.json()["job_id"]
            await wait_job(c, job, {"booting"}, timeout=300)
            iso = await fetch_medium(st.emu, job, tmp_path / "medium.iso")

            ssh_port = free_port()
            disk = Disk(tmp_path / "vda.img", 2 << 30)
            vm = VM(tmp_path, iso=iso, disks=[disk], guestfwd=st.guestfwd(), hostfwd={ssh_port: 22})
            vm.start()
            t_vm = time.monotonic()
            try:
                installed = await wait_job(c, job, {"first_boot", "completed", "failed"}, timeout=1500)
                t_installed = time.monotonic()
                done = await wait_job(c, job, {"completed", "failed"}, timeout=1500)
                t_done = time.monotonic()
                assert installed["job_status"] != "failed", (installed, vm.tail())
                assert done["job_status"] == "completed", (done, vm.tail())
                assert done["node_ip"] == GUEST_IP
                await vm.wait_serial(rf"{HOSTNAME} login:", timeout=300)
                async with asyncssh.connect(
                    "127.0.0.1",
                    ssh_port,
                    username="operator",
                    client_keys=[key],
                    password=None,
                    known_hosts=None,
                ) as conn:

                    async def run(cmd: str) -> str:
                        return (await conn.run(cmd, check=True)).stdout.strip()

                    hostname = await run("hostname")
                    whoami = await run("id -un")
                    addrs = await run("ip -4 -o addr show scope global")
                    route = await run("ip -4 route show default")
                    dns = await run("cat /etc/systemd/network/*.network")
                    status = await run("cloud-init status --wait --long || true")
                    root = await run("findmnt -bno SOURCE,SIZE /")
                    seed = await run("lsblk -rno NAME,LABEL /dev/vda")
            finally:
                vm.stop()
        finally:
            await c.delete(f"/controlnode/images/{name}", headers=ADMIN)
        assert hostname == HOSTNAME and whoami == "operator"
        assert f"inet {GUEST_IP}/24" in addrs and "dynamic" not in addrs, addrs  # static, no lease
        assert route.startswith("default via 10.0.2.2"), route
        assert f"DNS={NAMESERVER}" in dns, dns  # the inventory's name server, not the gateway
        assert "status: done" in status, status
        source, size = root.split()
        assert source == "/dev/vda3" and int(size) > (2 << 30) - (200 << 20), root  # grown to the disk
        assert "vda4 CIDATA" in seed, seed

        r = await c.get(f"/controlnode/nodes/{GUEST_IP}", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert (r.json()["source"], r.json()["bmc_ip"]) == ("firstboot", st.bmc_ip)
        events = await sse.collect(
            until=lambda evs: any(
                e.event == "job_completed" and e.json()["data"].get("job_id") == job for e in evs
            ),
            timeout=60,
        )
        mine = [(e.event, e.json()["data"]) for e in events if e.json()["data"].get("job_id") == job]
        steps = [d.get("message", "") for n, d in mine if n == "job_step"]
        assert any(f"image {name} to /dev/vda" in s for s in steps), steps
        assert any("ext4 grown to its partition" in s for s in steps), steps
        said = next(
            d.get("message", "") for n, d in mine if "written to /dev/vda in " in d.get("message", "")
        )
        write_s, install_s = (int(x) for x in re.findall(r"in (\d+) s, install (\d+) s", said)[0])
        first_boot = [d.get("message", "") for n, d in mine if n == "job_first_boot"]
        completed = [d.get("message", "") for n, d in mine if n == "job_completed"]
        assert any("cloud-init phone_home" in m for m in first_boot + completed), (first_boot, completed)
        assert all(password not in json.dumps(d) for _, d in mine)
        await wait_bmc_clean(st.emu, st.system_id)
    disk.path.unlink()
    iso.unlink()
    timeline = (
        f"cloud image ({qcow2.stat().st_size >> 20} MiB qcow2, {cloudimage.DISK_BYTES >> 20} MiB disk) "
        f"registered (download, qemu-img convert, zstd) in {t_registered - t0:.1f} s; "
        f"VM start to installed (live env boot, stream + verify + grow + seed) {t_installed - t_vm:.1f} s; "
        f"to cloud-init's phone_home {t_done - t_vm:.1f} s; POST to completed {t_done - t_post:.1f} s; "
        f"in the live environment: stream + verify + write {write_s} s, install {install_s} s = "
        f"{install_s / max(write_s, 1):.2f}x the bytes' time (limit 2x)"
    )
    print(timeline)
    if out := os.environ.get("KARIOS_MEASURE_DIR"):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "install-cloud-image.txt").write_text(timeline + "\n")
