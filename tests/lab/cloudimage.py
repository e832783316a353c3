"""A Debian cloud image built here from Debian packages, as a distribution ships one: a qcow2 disk
(GPT: BIOS boot, EFI system partition, ext4 root last) with cloud-init (NoCloud), systemd-networkd,
OpenSSH and GRUB for BIOS and UEFI — the image an operator registers in Karios's catalog. It knows
nothing of Karios: everything host-specific comes from the cloud-init seed the install writes.

Built once per machine with mmdebstrap (through the lab's apt proxy) and cached under
``<lab cache>/cloud/<key>/`` (the key: a hash of this file), one builder at a time; minutes cold,
then instant. Needs root (loop devices), mmdebstrap, sgdisk, mkfs.ext4/vfat, mtools, grub-mkimage
(grub-pc-bin, grub-efi-amd64-bin) and qemu-img.

    python -m tests.lab.cloudimage      # build what is missing; prints the qcow2's path
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SUITE = "bookworm"
DISK_BYTES = 1280 << 20  # the image's disk: the root has ~700 MiB free
PACKAGES = (
    "linux-image-cloud-amd64,initramfs-tools,systemd-sysv,udev,cloud-init,openssh-server,sudo,"
    "iproute2,e2fsprogs,ca-certificates,netbase,locales"
)
BOOT_IMG = "/usr/lib/grub/i386-pc/boot.img"  # grub-pc-bin
TOOLS = (
    "mmdebstrap",
    "sgdisk",
    "mkfs.ext4",
    "mkfs.vfat",
    "mcopy",
    "grub-mkimage",
    BOOT_IMG,
    "qemu-img",
)
# GRUB: one early config for both firmwares, embedded in the core image: find the root by label.
EARLY_CFG = """\
search --no-floppy --label root --set=root
set prefix=($root)/boot/grub
configfile /boot/grub/grub.cfg
"""
GRUB_CFG = """\
serial --unit=0 --speed=115200
terminal_input console serial
terminal_output console serial
set timeout=1
menuentry "Debian (cloud image)" {
  linux /vmlinuz root=LABEL=root ro console=tty0 console=ttyS0,115200n8
  initrd /initrd.img
}
"""
GRUB_MODULES = (
    "part_gpt part_msdos ext2 search search_label normal linux configfile echo test serial terminal"
)


def tools_missing() -> list[str]:
    return [t for t in TOOLS if not (shutil.which(t) or Path(t).exists())]


def bios_setup(disk: str, core_img: Path) -> None:
    """What ``grub-bios-setup`` does for a GPT disk whose partition 1 is the BIOS boot partition
    (it cannot guess a root device on a loop device's partition): core.img into that partition,
    its first sector's block list pointing at the rest, and boot.img into the MBR pointing at it,
    keeping the protective MBR's partition table."""
    out = subprocess.run(
        ["partx", "-g", "-o", "NR,START,SECTORS", disk], capture_output=True, text=True, check=True
    ).stdout
    start, sectors = next((int(f[1]), int(f[2])) for f in map(str.split, out.splitlines()) if f[0] == "1")
    core = bytearray(core_img.read_bytes())
    core += bytes(-len(core) % 512)
    n = len(core) // 512
    if n > sectors:
        raise RuntimeError(f"core.img is {n} sectors, the BIOS boot partition {sectors}")
    struct.pack_into("<QHH", core, 512 - 12, start + 1, n - 1, 0x820)  # load the rest at 0x8200
    with open(disk, "r+b") as f:
        mbr = f.read(512)
        boot = bytearray(Path(BOOT_IMG).read_bytes())
        boot[0x3:0x5A] = mbr[0x3:0x5A]  # BPB
        boot[0x1B8:0x1FE] = mbr[0x1B8:0x1FE]  # disk signature, partition table
        struct.pack_into("<Q", boot, 0x5C, start)  # where core.img starts
        boot[0x64] = 0xFF  # the boot drive the BIOS says
        boot[0x66:0x68] = b"\x90\x90"  # a hard disk: no floppy check
        f.seek(start * 512)
        f.write(core)
        f.seek(0)
        f.write(boot)


def _key() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _run(*argv: str, **kw: object) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({res.returncode}): {res.stderr.strip()[-1500:]}")


@contextlib.contextmanager
def loop_device(img: Path) -> Iterator[str]:
    """``img`` attached as a loop device with its partitions scanned (root); detached after."""
    dev = subprocess.run(
        ["losetup", "-f", "--show", "-P", str(img)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)


def build(out: Path, proxy: str = "") -> Path:
    """Build the qcow2 at ``out`` (blocking: minutes)."""
    with tempfile.TemporaryDirectory(prefix=".cloud-", dir=out.parent) as tmp:
        t = Path(tmp)
        tree = t / "tree"
        argv = ["mmdebstrap", "--variant=minbase", f"--include={PACKAGES}"]
        if proxy:
            argv.append(f'--aptopt=Acquire::http::Proxy "{proxy}"')
        _run(*argv, SUITE, str(tree), timeout=1800)
        # cloud-init renders network-config v2 for systemd-networkd: the image enables it; its
        # locale module sets en_US.UTF-8, which a distribution image has generated.
        _run("chroot", str(tree), "systemctl", "enable", "systemd-networkd.service")
        (tree / "etc/locale.gen").write_text("en_US.UTF-8 UTF-8\n")
        _run("chroot", str(tree), "locale-gen")
        (tree / "etc/fstab").write_text("LABEL=root / ext4 errors=remount-ro 0 1\n")
        (tree / "boot/grub").mkdir(parents=True, exist_ok=True)
        (tree / "boot/grub/grub.cfg").write_text(GRUB_CFG)
        for key in (tree / "etc/ssh").glob("ssh_host_*"):  # each install gets its own (cloud-init)
            key.unlink()
        (tree / "etc/hostname").unlink(missing_ok=True)
        (tree / "etc/machine-id").write_text("")
        shutil.rmtree(tree / "var/lib/apt/lists", ignore_errors=True)
        if not (tree / "vmlinuz").exists() or not (tree / "initrd.img").exists():
            raise RuntimeError("the cloud image has no /vmlinuz or /initrd.img")
        raw = t / "disk.raw"
        with open(raw, "wb") as f:
            f.truncate(DISK_BYTES)
        with loop_device(raw) as dev:
            _run("sgdisk", "-n1:0:+1M", "-t1:ef02", "-n2:0:+64M", "-t2:ef00", "-n3:0:0", "-t3:8300", dev)
            subprocess.run(["partx", "-u", dev], capture_output=True)
            for _ in range(50):  # devtmpfs makes the partitions' nodes a moment later
                if Path(f"{dev}p3").exists():
                    break
                time.sleep(0.1)
            _run("mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(tree), f"{dev}p3", timeout=600)
            _run("mkfs.vfat", "-F", "32", "-n", "ESP", f"{dev}p2")
            early = t / "early.cfg"
            early.write_text(EARLY_CFG)
            core = t / "core.img"
            _run(
                "grub-mkimage", "-O", "i386-pc", "-o", str(core), "-c", str(early), "-p", "/boot/grub",
                "biosdisk", *GRUB_MODULES.split(),
            )  # fmt: skip
            bios_setup(dev, core)
            efi = t / "BOOTX64.EFI"
            _run(
                "grub-mkimage", "-O", "x86_64-efi", "-o", str(efi), "-c", str(early), "-p", "/boot/grub",
                "efi_gop", "all_video", *GRUB_MODULES.split(),
            )  # fmt: skip
            env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
            _run("mmd", "-i", f"{dev}p2", "::/EFI", "::/EFI/BOOT", env=env)
            _run("mcopy", "-i", f"{dev}p2", str(efi), "::/EFI/BOOT/BOOTX64.EFI", env=env)
        _run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(t / "out.qcow2"), timeout=600)
        os.replace(t / "out.qcow2", out)
    return out


def cached_cloud_image(cache: Path, proxy: str = "") -> Path:
    """The qcow2 under ``cache/cloud/<key>/``, built when missing (other keys removed after)."""
    top = cache / "cloud"
    out = top / _key() / f"debian-{SUITE}-cloud.qcow2"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(top / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            build(out, proxy)
            for old in top.iterdir():
                if old.is_dir() and old.name != out.parent.name:
                    shutil.rmtree(old, ignore_errors=True)
    return out


if __name__ == "__main__":
    from tests.fixtures.installs import apt_proxy, lab_cache

    print(cached_cloud_image(lab_cache(), apt_proxy()))
