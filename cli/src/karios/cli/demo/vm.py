"""``karios demo --vm``: the first demo server is a real qemu VM behind its emulated BMC.

The emulator's fake system drives qemu (:mod:`karios.cli.demo.vm_power`): InsertMedia downloads
the medium Karios built, the reset boots it as a CD, the image install writes the VM's sparse disk
and reboots it into the installed system, whose first boot completes the job. qemu runs under TCG
(no KVM needed) with user networking: the guest cannot reach the host's 127.0.0.1, so qemu
forwards two guest addresses to the services (``guestfwd``), and the provisioner advertises those
to the guest (callback URL, image URL). The serial console goes to ``<state>/vm/serial.log``.

The qemu command and the guest's URLs are pure (:func:`qemu_spec`, :func:`guest_routes`); the
checks of this machine and the image cache are the edge.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from karios.cli.demo.vm_power import qemu_command

GUEST_GATEWAY = "10.0.2.100"  # guestfwd → the gateway (installer and first-boot callbacks)
GUEST_PROVISIONER = "10.0.2.101"  # guestfwd → the provisioner (GET /images/…)
GUEST_IP = "10.0.2.15"  # what qemu's DHCP gives the guest
SUITE = "bookworm"  # `karios provision`'s default --os 12
DISK_NAME = "vda"  # the guest's virtio disk, as the demo inventory lists it
DISK_GB = 8  # sparse: the image install writes about 1 GiB of it
VM_TOOLS = ("qemu-system-x86_64", "socat")  # socat: qemu's guestfwd runs it per connection


@dataclass(frozen=True)
class DemoVm:
    """One VM-backed demo server: its emulated system, NIC and files under ``workdir``."""

    system_uuid: str
    mac: str
    workdir: Path
    memory_mib: int = 1024
    disk_gb: int = DISK_GB
    guestfwd: dict[str, str] = field(default_factory=dict)  # "10.0.2.100:8080" → "127.0.0.1:8080"

    @property
    def disk(self) -> Path:
        return self.workdir / f"{DISK_NAME}.img"

    @property
    def serial_log(self) -> Path:
        return self.workdir / "serial.log"

    @property
    def qemu_log(self) -> Path:
        return self.workdir / "qemu.log"


def qemu_spec(vm: DemoVm) -> dict[str, object]:
    """What the emulator's power patch needs to boot ``vm`` (JSON): the command without a CD (the
    serial console appended to the log, so ``tail -f`` follows every boot), the CD's arguments
    (``{iso}``: the medium InsertMedia downloaded) and those of a one-time boot from it (a guest
    reboot then comes up from the disk). BIOS boot: the medium is BIOS+UEFI, BIOS is faster in TCG."""
    net = "user,id=n0,restrict=on"  # the guest reaches the guestfwd addresses and nothing else
    for guest, host in vm.guestfwd.items():
        net += f",guestfwd=tcp:{guest}-cmd:socat - TCP:{host}"
    argv = [
        "qemu-system-x86_64", "-accel", "tcg", "-m", str(vm.memory_mib), "-smp", "1",
        "-display", "none", "-name", f"karios-demo-{vm.system_uuid[:8]}",
        "-chardev", f"file,id=serial0,path={vm.serial_log},append=on", "-serial", "chardev:serial0",
        "-netdev", net, "-device", f"virtio-net-pci,netdev=n0,mac={vm.mac}",
        "-drive", f"file={vm.disk},format=raw,if=none,id=d0,discard=unmap,cache=unsafe",
        "-device", "virtio-blk-pci,drive=d0",
    ]  # fmt: skip
    return {
        "argv": argv,
        "cd": ["-drive", "file={iso},media=cdrom,readonly=on"],
        "boot_cd": ["-boot", "once=d"],
        "log": str(vm.qemu_log),
    }


def qemu_argv(vm: DemoVm, iso: str | None = None, boot_cd: bool = True) -> list[str]:
    """The qemu command the emulator runs for ``vm`` at a power-on (pure)."""
    return qemu_command(qemu_spec(vm), iso, boot_cd)


@dataclass(frozen=True)
class GuestRoutes:
    """How the guest reaches the services: the provisioner's settings that advertise the guest
    addresses, and qemu's forwards behind them."""

    env: dict[str, str]
    guestfwd: dict[str, str]


def guest_routes(gateway_url: str, provisioner_url: str) -> GuestRoutes:
    """From the services' host URLs (``http://127.0.0.1:8080``): the callback and image URLs the
    provisioner puts on the medium (guest addresses) and the guestfwd to each service. BMCs keep
    fetching media from the host URL (the emulator runs on this host)."""
    env: dict[str, str] = {}
    fwd: dict[str, str] = {}
    for url, guest, var in (
        (gateway_url, GUEST_GATEWAY, "KARIOS_PROVISIONER_CALLBACK_URL"),
        (provisioner_url, GUEST_PROVISIONER, "KARIOS_PROVISIONER_IMAGE_URL"),
    ):
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or "127.0.0.1"
        if host in ("0.0.0.0", "::"):  # a wildcard listener: reach it on loopback
            host = "127.0.0.1"
        env[var] = f"{parts.scheme}://{guest}:{port}"
        fwd[f"{guest}:{port}"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return GuestRoutes(env=env, guestfwd=fwd)


def make_disk(path: Path, size_gb: int) -> None:
    """A new sparse raw disk (a demo starts with a blank server)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size_gb << 30)


# -- the edge: this machine, the image cache -------------------------------------------------


def vm_unavailable() -> str | None:
    """Why ``karios demo --vm`` cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (it builds the install image with mmdebstrap and chroot); run it with sudo"
    missing = [t for t in VM_TOOLS if not shutil.which(t)]
    if missing:
        return f"needs {', '.join(missing)}: apt-get install qemu-system-x86 socat"
    return None


def default_images_dir(cache: Path) -> Path:
    """Where the demo keeps the image install's artifacts: ``<cache>/images/<key>`` (built once)."""
    from karios.provisioner.install import live

    return cache / "images" / live.inputs_key(live.IMAGE_INPUTS, SUITE)  # the lab's key too


def ensure_images(images: Any, say: Callable[[str], None]) -> float | None:
    """The image install's artifacts of :data:`SUITE` (``images``: a ``LiveImages``), built when
    missing — one builder at a time (a lock beside them), with a line before and its time after.
    Returns the build's seconds, None when they were there."""
    from karios.common.errors import PermanentFailure

    images_dir = Path(images.images_dir)
    if images.ready(SUITE):
        return None
    images_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(images_dir.parent / ".karios-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another demo building the same images: wait for it
        if images.ready(SUITE):
            return None
        say(
            f"karios demo --vm: building the image install's Debian {SUITE} images into {images_dir} "
            "(once; a few minutes)…"
        )
        t0 = time.monotonic()
        try:
            images.build(SUITE)
        except PermanentFailure as exc:  # tools missing, a mirror unreachable: one message
            raise RuntimeError(f"building the install images failed: {exc.message}") from None
        took = time.monotonic() - t0
        say(f"karios demo --vm: images built in {took:.0f}s")
        return took
