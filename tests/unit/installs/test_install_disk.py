"""The whole-disk image install's functions (``install_disk.sh.j2``, between ``# -- disk image
functions`` and its end) run inside the built live environment — its sh, mawk, curl, zstd, tee,
sha256sum, dd, partx, sfdisk, sgdisk, e2fsck/resize2fs and mkfs.vfat, not the host's — on loop
devices (root):

- a raw.zst disk image served over HTTP is written to the disk while its SHA-256 is computed;
  the last partition grows to the disk's end less the seed partition, its ext4 grows with it, the
  CIDATA vfat partition carries user-data, meta-data and network-config; a file of the image's
  filesystem is still there;
- a checksum other than the catalog's fails and clears the disk (no partition table, no
  filesystem signature left); a transfer cut short fails with curl's words and clears it too;
- a disk smaller than the image (with its seed) fails before a byte is written.

The rendered script's main part is never run here (it powers off); ``fail`` prints instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from karios.provisioner.install import HostContext
from karios.provisioner.install.image import ImageMethod
from karios.provisioner.install.image.cloudinit import LIVE_NIC_MAC, SEED_MIB, phone_home_url, seed_files
from tests.fixtures.apps import REQUIRE
from tests.fixtures.installs import LIVE_PATH, in_live
from tests.lab.cloudimage import loop_device
from tests.unit.installs.test_install_live import CuttingServer

MIB = 1 << 20
FAIL = 'fail() { echo "FAILED: $1"; exit 1; }\n'


def ctx(**kw: object) -> HostContext:
    base: dict = dict(
        job_id="job-d",
        token="tok-d",
        callback_base="http://127.0.0.1:9/controlnode",
        hostname="disk-1",
        bmc_ip="10.0.0.9",
        os_username="ops",
        password_hash="$6$salt$hash",
        image_url="http://127.0.0.1:9/images/catalog/cloud.raw.zst",
        image_name="cloud",
        image_path="catalog/cloud.raw.zst",
        image_format="raw.zst",
        image_sha256="0" * 64,
        image_disk_bytes=64 * MIB,
    )
    base.update(kw)
    return HostContext(**base)


def disk_functions(c: HostContext) -> str:
    cfg = SimpleNamespace(cache_dir=Path("/nonexistent"), images_dir=Path("/nonexistent"), mirror_host="")
    script = ImageMethod(cfg).render_disk_script(c)
    settings = script[script.index("IMAGE_URL=") : script.index("# -- disk image functions")]
    body = script[
        script.index("# -- disk image functions") : script.index("# -- end of disk image functions")
    ]
    return settings + body


# -- the seed, pure ------------------------------------------------------------------------------


def test_the_seed_is_yaml_with_every_value_as_given() -> None:
    tricky = 'ops key "quoted" \\ back: {x}\n# not a comment'
    c = ctx(
        ssh_authorized_keys=[f"ssh-ed25519 AAAAC3Nza {tricky}"],
        root_password_hash="$6$r$root",
        nic_mac="52:54:00:AA:BB:CC",
        static={"address": "10.0.2.15", "netmask": "255.255.255.0", "gateway": "10.0.2.2"},
        nameservers=["10.0.2.3", "192.0.2.53"],
        ca_bundle="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    files = seed_files(c)
    user = yaml.safe_load(files["user-data"])
    assert files["user-data"].startswith("#cloud-config\n")
    (u,) = user["users"]
    assert (u["name"], u["hashed_passwd"], u["lock_passwd"]) == ("ops", "$6$salt$hash", False)
    assert (u["primary_group"], u["groups"]) == ("ops", ["ops"])  # an existing group of that name too
    assert u["ssh_authorized_keys"] == [f"ssh-ed25519 AAAAC3Nza {tricky}"]
    assert user["hostname"] == "disk-1" and user["ssh_pwauth"] is True
    assert user["chpasswd"]["users"] == [{"name": "root", "password": "$6$r$root", "type": "HASH"}]
    assert user["ca_certs"]["trusted"] == [c.ca_bundle]
    assert user["phone_home"]["url"] == "http://127.0.0.1:9/controlnode/job/job-d/phone-home?token=tok-d"
    assert user["phone_home"]["url"] == phone_home_url(c)
    assert yaml.safe_load(files["meta-data"]) == {"instance-id": "karios-job-d", "local-hostname": "disk-1"}
    net = yaml.safe_load(files["network-config"])
    assert net == {
        "version": 2,
        "ethernets": {
            "karios0": {
                "match": {"macaddress": "52:54:00:aa:bb:cc"},
                "dhcp4": False,
                "addresses": ["10.0.2.15/24"],
                "routes": [{"to": "0.0.0.0/0", "via": "10.0.2.2"}],
                "nameservers": {"addresses": ["10.0.2.3", "192.0.2.53"]},
            }
        },
    }


def test_the_seed_without_static_address_is_dhcp_on_any_nic() -> None:
    files = seed_files(ctx())
    net = yaml.safe_load(files["network-config"])["ethernets"]["karios0"]
    assert net == {"match": {"macaddress": LIVE_NIC_MAC}, "dhcp4": True}  # the live NIC's, filled in there
    user = yaml.safe_load(files["user-data"])
    assert "chpasswd" not in user and "ca_certs" not in user
    assert user["users"][0]["ssh_authorized_keys"] == []


def test_the_medium_of_a_whole_disk_image_carries_the_seed(tmp_path: Path) -> None:
    for d in ("vmlinuz", "live.img", "root.tar.zst"):
        (tmp_path / "bookworm").mkdir(exist_ok=True)
        (tmp_path / "bookworm" / d).write_bytes(b"x")
    cfg = SimpleNamespace(
        cache_dir=tmp_path, images_dir=tmp_path, mirror_host="", image_url="http://10.9.9.9:8081"
    )
    medium = ImageMethod(cfg).medium(ctx(static={"address": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1"}))
    assert set(medium.overlay) >= {
        "karios/run.sh",
        "karios/net.env",
        *(f"karios/cidata/{n}" for n in seed_files(ctx())),
    }
    assert "karios/firstboot.sh" not in medium.overlay  # cloud-init's phone_home reports the first boot
    run = medium.overlay["karios/run.sh"]
    assert "IMAGE_URL=http://10.9.9.9:8081/images/catalog/cloud.raw.zst" in run  # the image URL setting
    assert f"SEED_MIB={SEED_MIB}" in run and "IMAGE_SHA256=" + "0" * 64 in run
    assert "NET_MODE=static" in medium.overlay["karios/net.env"]


def test_a_whole_disk_image_needs_its_checksum_and_size() -> None:
    from karios.common.errors import PermanentFailure

    cfg = SimpleNamespace(cache_dir=Path("/x"), images_dir=Path("/x"), mirror_host="")
    with pytest.raises(PermanentFailure, match="SHA-256 and disk size"):
        ImageMethod(cfg).render_disk_script(ctx(image_sha256=""))


# -- in the live environment, on loop devices -------------------------------------------------


def _run_live(root: Path, script: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    # dev, proc and sys as /init mounts them; `fail` never powers off here (replaced above).
    return subprocess.run(
        in_live(root, "set -eu\n" + script, mounts=("dev", "proc", "sys")),
        env={"PATH": LIVE_PATH},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _need_root_tools() -> None:
    missing = [
        t for t in ("losetup", "sgdisk", "mkfs.ext4", "debugfs", "zstd", "mcopy") if not shutil.which(t)
    ]
    if os.geteuid() != 0 or missing:
        why = f"loop devices need root and {', '.join(missing) or 'losetup'}"
        if REQUIRE:
            pytest.fail(why)
        pytest.skip(why)


@contextlib.contextmanager
def loop(img: Path, size: int) -> Iterator[str]:
    """A sparse file of ``size`` bytes as a loop device."""
    with open(img, "wb") as f:
        f.truncate(size)
    with loop_device(img) as dev:
        yield dev


def _sh(*argv: str, stderr: int = subprocess.PIPE) -> str:
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, check=True).stdout


def partitions(dev: str) -> dict[int, dict]:
    """``sfdisk --json`` of ``dev``: partition number → its fields."""
    table = json.loads(_sh("sfdisk", "--json", dev))["partitiontable"]["partitions"]
    return {int(p["node"].rsplit("p", 1)[1]): p for p in table}


def disk_image(tmp_path: Path) -> tuple[bytes, bytes]:
    """A 64 MiB GPT disk as a cloud image lays it out (BIOS boot, ESP, ext4 root last) with a
    marker file in the root; returns (raw.zst, marker)."""
    _need_root_tools()
    marker = os.urandom(16).hex().encode()
    img = tmp_path / "image.raw"
    with loop(img, 64 * MIB) as dev:
        _sh("sgdisk", "-n1:0:+1M", "-t1:ef02", "-n2:0:+8M", "-t2:ef00", "-n3:0:0", "-t3:8300", dev)
        subprocess.run(["partx", "-u", dev], capture_output=True)
        (tmp_path / "marker").write_bytes(marker)
        _sh("mkfs.ext4", "-q", "-F", "-L", "root", f"{dev}p3")
        _sh("debugfs", "-w", "-R", f"write {tmp_path / 'marker'} marker", f"{dev}p3")
    packed = subprocess.run(["zstd", "-q", "-c", str(img)], capture_output=True, check=True).stdout
    return packed, marker


def test_a_disk_image_is_written_verified_grown_and_seeded(live_root: Path, tmp_path: Path) -> None:
    packed, marker = disk_image(tmp_path)
    srv = CuttingServer(packed, len(packed))
    seed = seed_files(ctx())
    seed_dir = live_root / "karios" / "cidata"
    seed_dir.mkdir(parents=True, exist_ok=True)
    for name, text in seed.items():
        (seed_dir / name).write_text(text)
    c = ctx(image_url=srv.url, image_sha256=hashlib.sha256(packed).hexdigest())
    try:
        with loop(tmp_path / "target.img", 160 * MIB) as dev:
            res = _run_live(
                live_root,
                disk_functions(c)
                + FAIL
                + f"mkdir -p /run; check_disk {dev}; clear_disk {dev}; write_disk {srv.url} {dev}; "
                + f'P=$(grow_disk {dev}); echo "grown $P"; grow_fs "$P"; '
                + f"NIC=lo write_seed {dev}; echo seeded",
            )
            assert res.returncode == 0 and res.stdout.strip().endswith("seeded"), res.stdout + res.stderr
            assert f"image cloud written to {dev}: SHA-256 {c.image_sha256} verified" in res.stdout
            assert f"grown {dev}p3" in res.stdout and "ext4 grown to its partition" in res.stdout
            parts = partitions(dev)
            sectors = int(_sh("blockdev", "--getsz", dev))
            seed_start = (sectors - 34 - SEED_MIB * 2048) // 2048 * 2048
            start3 = parts[3]["start"]
            assert parts[3]["size"] == seed_start - start3, parts
            assert (parts[4]["start"], parts[4]["size"]) == (seed_start, SEED_MIB * 2048), parts
            assert parts[3]["type"] == "0FC63DAF-8483-4772-8E79-3D69D8477DE4"  # kept: Linux filesystem
            head = _sh("dumpe2fs", "-h", f"{dev}p3", stderr=subprocess.DEVNULL)
            blocks = int(next(ln for ln in head.splitlines() if ln.startswith("Block count:")).split()[-1])
            bsize = int(next(ln for ln in head.splitlines() if ln.startswith("Block size:")).split()[-1])
            assert blocks * bsize == (seed_start - start3) * 512, head
            assert (
                _sh("debugfs", "-R", "cat marker", f"{dev}p3", stderr=subprocess.DEVNULL).encode() == marker
            )
            assert _sh("blkid", "-o", "value", "-s", "LABEL", f"{dev}p4").strip() == "CIDATA"
            # the stand-in MAC became the one of the NIC the install came through (here: lo's)
            seed["network-config"] = seed["network-config"].replace(LIVE_NIC_MAC, "00:00:00:00:00:00")
            assert "network-config: the NIC with MAC 00:00:00:00:00:00" in res.stdout
            for name, text in seed.items():
                assert _sh("mcopy", "-n", "-i", f"{dev}p4", f"::{name}", "-") == text
    finally:
        srv.close()


@pytest.mark.parametrize("case", ["checksum", "cut"])
def test_a_bad_image_fails_and_clears_the_disk(live_root: Path, tmp_path: Path, case: str) -> None:
    packed, _ = disk_image(tmp_path)
    good = hashlib.sha256(packed).hexdigest()
    srv = CuttingServer(packed, len(packed) if case == "checksum" else len(packed) // 2)
    c = ctx(image_url=srv.url, image_sha256="f" * 64 if case == "checksum" else good)
    try:
        with loop(tmp_path / "target.img", 160 * MIB) as dev:
            res = _run_live(
                live_root,
                disk_functions(c) + FAIL + f"mkdir -p /run; write_disk {srv.url} {dev}; echo written",
            )
            assert res.returncode == 1, res.stdout + res.stderr
            (failed,) = [ln for ln in res.stdout.splitlines() if ln.startswith("FAILED: ")]
            if case == "checksum":
                assert failed == (
                    f"FAILED: image cloud from {srv.url}: SHA-256 {good} is not the catalog's {'f' * 64}; "
                    f"{dev} was cleared"
                ), failed
            else:
                assert failed.startswith(
                    f"FAILED: writing image cloud from {srv.url} to {dev}: curl: (18) "
                ), failed
            # Nothing left to boot or mount: no partition table, no signature anywhere known.
            assert subprocess.run(["blkid", "-p", dev], capture_output=True).returncode != 0
            assert "p3" not in _sh("lsblk", "-rno", "NAME", dev)
    finally:
        srv.close()


def test_a_disk_smaller_than_the_image_fails_before_writing(live_root: Path, tmp_path: Path) -> None:
    _need_root_tools()
    c = ctx(image_disk_bytes=100 * MIB)
    with loop(tmp_path / "small.img", 100 * MIB) as dev:  # the image fits, its seed does not
        res = _run_live(live_root, disk_functions(c) + FAIL + f"check_disk {dev}; echo fits")
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        f"FAILED: disk {dev} is 0.1 GiB; image cloud is a 0.1 GiB disk "
        f"(and {SEED_MIB} MiB for its cloud-init seed)" in res.stdout
    )
    with loop(tmp_path / "big.img", 120 * MIB) as dev:
        res = _run_live(live_root, disk_functions(c) + FAIL + f"check_disk {dev}; echo fits")
    assert res.returncode == 0 and res.stdout.strip().endswith("fits"), res.stdout + res.stderr


def test_a_catalog_root_archive_goes_through_the_root_install(tmp_path: Path) -> None:
    """A catalog ``tar.zst`` keeps the pools and Karios's first-boot unit: install.sh with the
    catalog's URL (no disk-size check: its installed size is unknown), no cloud-init seed."""
    for d in ("vmlinuz", "live.img", "root.tar.zst"):
        (tmp_path / "bookworm").mkdir(exist_ok=True)
        (tmp_path / "bookworm" / d).write_bytes(b"x")
    cfg = SimpleNamespace(
        cache_dir=tmp_path, images_dir=tmp_path, mirror_host="", image_url="http://10.9.9.9:8081"
    )
    c = ctx(
        image_name="golden",
        image_path="catalog/golden.tar.zst",
        image_format="tar.zst",
        image_disk_bytes=0,
        md_level=1,
        disks=["sda", "sdb"],
    )
    medium = ImageMethod(cfg).medium(c)
    run = medium.overlay["karios/run.sh"]
    assert "IMAGE_URL=http://10.9.9.9:8081/images/catalog/golden.tar.zst" in run
    assert "stream_root" in run and "ROOT_NEEDS=''" in run and "MD_LEVEL=1" in run
    assert {"karios/firstboot.sh", "karios/firstboot.service"} <= set(medium.overlay)
    assert not any(k.startswith("karios/cidata/") for k in medium.overlay)
