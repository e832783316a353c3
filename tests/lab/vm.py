"""A qemu VM for tests that boot real media (TCG: this machine has no usable KVM).

The guest reaches only what the test offers: user networking with ``restrict=on`` plus
``guestfwd`` mappings (guest ``10.0.2.100:PORT`` → host ``127.0.0.1:PORT``; qemu refuses 10.0.2.2
as a guestfwd address). qemu's DHCP then hands out no name server and no default route.

    vm = VM(tmp_path, iso=iso, disks=[Disk(tmp_path / "a.img", 3 << 30), Disk(..., bus="nvme")],
            guestfwd={"10.0.2.100:8080": 8080}, hostfwd={2222: 22})
    vm.start()
    await vm.wait_serial(r"login:", timeout=300)
    rc = await vm.wait_exit(timeout=120)
    vm.stop()                       # always (a fixture's finalizer): kills qemu if still running

Boot: ``iso`` as CD-ROM with ``-boot once=d`` (so a guest reboot comes up from its disk), or
``kernel``/``initrd``/``append`` directly. ``uefi=True`` boots OVMF (a private copy of the vars).
Disk helpers: :func:`make_disk`, :func:`write_marker`, :func:`read_marker` (first/last MiB of a raw
image).
"""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.fixtures.apps import free_port  # noqa: F401  (re-exported: the VM tests' port helper)
from tests.fixtures.wait import wait_until

MIB = 1 << 20
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
GUEST_IP = "10.0.2.15"  # what qemu's DHCP gives the guest


def qemu_missing() -> list[str]:
    return [t for t in ("qemu-system-x86_64", "socat", "qemu-img") if not shutil.which(t)]


@dataclass
class Disk:
    path: Path
    size: int = 2 << 30  # bytes; the image is created (sparse) if missing
    bus: str = "virtio"  # virtio | ahci | nvme
    serial: str = ""
    # qemu's drive discard: "unmap" (a discard punches holes: reads back zeros) or "ignore" (a
    # discard is accepted and changes nothing, as on many real SSDs and RAID controllers)
    discard: str = "unmap"


@dataclass
class VM:
    workdir: Path
    iso: Path | None = None
    kernel: Path | None = None
    initrd: Path | None = None
    append: str = ""
    disks: list[Disk] = field(default_factory=list)
    memory: int = 1024
    guestfwd: dict[str, int] = field(default_factory=dict)  # "10.0.2.100:8080" → host port
    hostfwd: dict[int, int] = field(default_factory=dict)  # host port (127.0.0.1) → guest port
    uefi: bool = False
    no_reboot: bool = False  # a guest reboot ends qemu instead
    mac: str = "52:54:00:12:34:56"
    name: str = "vm"

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.serial_log = self.workdir / f"{self.name}.serial.log"
        self.monitor_path = self.workdir / f"{self.name}.monitor"
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        """The qemu command line (pure)."""
        a = ["qemu-system-x86_64", "-accel", "tcg", "-m", str(self.memory), "-smp", "1", "-display", "none"]
        a += ["-serial", f"file:{self.serial_log}", "-monitor", f"unix:{self.monitor_path},server,nowait"]
        if self.no_reboot:
            a.append("-no-reboot")
        if self.uefi:
            vars_copy = self.workdir / f"{self.name}.vars.fd"
            if not vars_copy.exists():
                shutil.copyfile(OVMF_VARS, vars_copy)
            a += ["-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}"]
            a += ["-drive", f"if=pflash,format=raw,file={vars_copy}"]
        net = "user,id=n0,restrict=on"
        for guest, port in self.guestfwd.items():
            net += f",guestfwd=tcp:{guest}-cmd:socat - TCP:127.0.0.1:{port}"
        for host, guest_port in self.hostfwd.items():
            net += f",hostfwd=tcp:127.0.0.1:{host}-:{guest_port}"
        a += ["-netdev", net, "-device", f"virtio-net-pci,netdev=n0,mac={self.mac}"]
        if any(d.bus == "ahci" for d in self.disks):
            a += ["-device", "ahci,id=ahci"]
        for i, d in enumerate(self.disks):
            a += ["-drive", f"file={d.path},format=raw,if=none,id=d{i},discard={d.discard},cache=unsafe"]
            if d.bus == "virtio":
                a += ["-device", f"virtio-blk-pci,drive=d{i}"]
            elif d.bus == "ahci":
                a += ["-device", f"ide-hd,drive=d{i},bus=ahci.{i % 6}"]
            elif d.bus == "nvme":
                a += ["-device", f"nvme,serial={d.serial or f'karios{i}'},drive=d{i}"]
            else:
                raise ValueError(f"disk bus {d.bus!r}: use virtio, ahci or nvme")
        if self.iso:
            a += ["-drive", f"file={self.iso},media=cdrom,readonly=on", "-boot", "once=d"]
        if self.kernel:
            a += ["-kernel", str(self.kernel), "-initrd", str(self.initrd), "-append", self.append]
        return a

    def start(self) -> None:
        for d in self.disks:
            if not d.path.exists():
                make_disk(d.path, d.size)
        self.serial_log.write_bytes(b"")
        with open(self.workdir / f"{self.name}.qemu.err", "wb") as err:
            self.proc = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL, stderr=err)

    def serial(self) -> str:
        return self.serial_log.read_text(errors="replace") if self.serial_log.exists() else ""

    async def wait_serial(self, pattern: str, *, timeout: float, after: int = 0) -> re.Match[str]:
        """The first match of ``pattern`` in the serial log (from offset ``after``); fails early
        if qemu exits first."""
        rx = re.compile(pattern)

        def seen() -> re.Match[str] | None:
            m = rx.search(self.serial(), after)
            if not m and self.proc and self.proc.poll() is not None:
                raise AssertionError(
                    f"qemu exited ({self.proc.returncode}) before {pattern!r}:\n{self.tail()}"
                )
            return m

        return await wait_until(seen, timeout=timeout, interval=0.5, what=f"serial {pattern!r}")

    async def wait_init_from_disk(self, hostname: str, *, timeout: float) -> str:
        """The serial log up to the installed system's init naming ``hostname``: the boot loader on
        the disks loaded the installed kernel and initramfs, which mounted the installed root —
        systemd runs from it and read the hostname there. A second boot of the same disks by
        another firmware stops here: from this line on the boot is the one already inspected over
        SSH, and under TCG the rest (udev's coldplug, the services up to the login prompt) is
        most of the boot's CPU (~40 of ~60 CPU s)."""
        m = await self.wait_serial(rf"systemd\[1\]: Hostname set to <{re.escape(hostname)}>", timeout=timeout)
        return self.serial()[: m.end()]

    async def wait_exit(self, *, timeout: float) -> int:
        assert self.proc is not None, "start() first"
        await wait_until(
            lambda: self.proc.poll() is not None, timeout=timeout, interval=0.5, what="qemu exit"
        )
        return self.proc.returncode

    def monitor(self, command: str) -> str:
        """One human-monitor command (e.g. ``system_powerdown``, ``info block``)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.monitor_path))
            s.sendall(command.encode() + b"\n")
            out = b""
            try:
                while chunk := s.recv(65536):
                    out += chunk
                    if out.rstrip().endswith(b"(qemu)") and out.count(b"(qemu)") >= 2:
                        break
            except TimeoutError:
                pass
        return out.decode(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.serial().splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def make_disk(path: Path, size: int) -> Path:
    """A sparse raw image of ``size`` bytes."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def as_root(password: str) -> str:
    """A prefix running a command over SSH as root on an installed system (sudo reads the
    operator's password from stdin): a pool's status, a wait on systemd that must not hang on the
    operator's D-Bus (an image without it: the user's ``systemctl`` returned at once, silent)."""
    return f"printf '%s\\n' {shlex.quote(password)} | sudo -S -p '' "


def write_marker(path: Path, text: str, where: str = "first") -> None:
    """Write ``text`` at the start of the first (``where="first"``) or last MiB of a raw image."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(0 if where == "first" else size - MIB)
        f.write(text.encode())


def read_marker(path: Path, where: str = "first") -> bytes:
    """The first or last MiB of a raw image (all zeros after a wipe)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(0 if where == "first" else size - MIB)
        return f.read(MIB)
