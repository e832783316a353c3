"""Boot media: the hybrid BIOS+UEFI ISO of any install method's :class:`Medium`, at constant cost.

The boot loaders (isolinux, the standalone GRUB EFI image in a FAT image) are prepared once into
``cache_dir``; the kernel and base initrd come from the install method (prepared and cached by
it). One base ISO per boot configuration (kernel, initrd, kernel line, label, serial console) is
written once by ``xorriso`` with the cached files grafted in place and a fixed-size slot file
(:mod:`karios.provisioner.media.slot`) that both boot loaders load as a second initrd. A host's
medium is only its slot payload (a gzip'd cpio of its overlay, a few KB), patched into the base
while it is served (:mod:`karios.provisioner.media.serve`). Both boot menus use the serial console.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import re
import shutil
import threading
from pathlib import Path

from karios.common.contracts.provision import check_debian_version, debian_suites
from karios.common.errors import PermanentFailure
from karios.provisioner.install import Medium
from karios.provisioner.media.base import BootArtifacts, build_base, make_efiboot
from karios.provisioner.media.serve import ServedMedium
from karios.provisioner.media.slot import (
    SLOT_SIZE,
    BaseLayout,
    base_key,
    decode_record,
    encode_record,
    render_slot,
)
from karios.provisioner.templating import package_templates

NETBOOT_ROOT = Path("/usr/lib/debian-installer/images")
ISOLINUX_BIN = Path("/usr/lib/ISOLINUX/isolinux.bin")
ISOHDPFX = Path("/usr/lib/ISOLINUX/isohdpfx.bin")
LDLINUX = Path("/usr/lib/syslinux/modules/bios/ldlinux.c32")
BASE_FORMAT = 1  # bump when the base ISO's layout changes


def _suite_version() -> dict[str, str]:
    return {suite: major for major, suite in debian_suites().items() if major.isdigit()}


def debian_release(version: str) -> tuple[str, str]:
    """``debian_version`` ("12", "13", "bookworm", "12.5") → (major, suite), from the shared OS
    catalog (``karios.common.oscatalog``); 422 if the catalog has no such release."""
    suite = check_debian_version(version)
    return _suite_version()[suite], suite


def netboot_dir(major: str, arch: str = "amd64", root: Path = NETBOOT_ROOT) -> Path:
    return root / major / arch / "text" / "debian-installer" / arch


_BOOT = package_templates("karios.provisioner.media")


def serial_port(console: str) -> tuple[int, int] | None:
    """``ttyS1,115200n8`` → (1, 115200); None when there is no serial console."""
    m = re.match(r"^ttyS(\d+)(?:,(\d+))?", console or "")
    return (int(m.group(1)), int(m.group(2) or 115200)) if m else None


def boot_menus(medium: Medium, serial_console: str) -> dict[str, str]:
    """isolinux (BIOS) and GRUB (UEFI) menus booting ``medium``, on the serial console too.

    ``console=tty0 console=<serial>`` goes before a ``---`` (the Debian installer copies what
    follows it to the installed system), else at the end of the kernel line.
    """
    args = list(medium.kernel_args)
    console = ["console=tty0", f"console={serial_console}"] if serial_port(serial_console) else []
    at = args.index("---") if "---" in args else len(args)
    line = " ".join(args[:at] + console + args[at:])
    data = {"label": medium.label, "args": line, "serial": serial_port(serial_console)}
    return {
        "isolinux/isolinux.cfg": _BOOT.get_template("isolinux.cfg.j2").render(**data),
        "boot/grub/grub.cfg": _BOOT.get_template("grub.cfg.j2").render(**data),
    }


class MediaBuilder:
    """Per-host media at constant disk cost: one base ISO per boot configuration, one slot per job.

    ``build(name, medium)`` makes sure the base ISO of the medium's kernel, initrd, kernel line,
    label and serial console exists (built once, ``<cache_dir>/media-base/<key>.iso``), renders
    the host's overlay into its slot payload and writes ``<media_dir>/<name>.slot`` (a few KB).
    ``open(name)`` gives what ``GET /media/<name>.iso`` streams: the base with the slot patched in.
    """

    def __init__(self, cache_dir: Path, media_dir: Path) -> None:
        self.cache_dir = Path(cache_dir)
        self.media_dir = Path(media_dir)
        self._boot: BootArtifacts | None = None
        self._lock = asyncio.Lock()
        self._layouts: dict[str, BaseLayout] = {}
        self._base_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        # A medium removed while it was being built (job cancelled or failed meanwhile; a cancelled
        # task does not stop the build's thread) is discarded when that build finishes.
        self._ticks = itertools.count()
        self._building: dict[str, int] = {}  # name → tick its build started
        self._removed: dict[str, int] = {}  # name → tick it was removed during that build

    @property
    def base_dir(self) -> Path:
        return self.cache_dir / "media-base"

    def tools_missing(self) -> list[str]:
        missing = [
            t for t in ("xorriso", "grub-mkstandalone", "mkfs.vfat", "mcopy", "mmd") if not shutil.which(t)
        ]
        missing += [str(p) for p in (ISOLINUX_BIN, ISOHDPFX, LDLINUX) if not p.exists()]
        return missing

    def base(self) -> BootArtifacts:
        """Prepare (once) and return the boot loaders every ISO carries."""
        if self._boot is not None:
            return self._boot
        missing = self.tools_missing()
        if missing:
            raise PermanentFailure(f"boot media tools missing: {', '.join(missing)}")
        efiboot = self.cache_dir / "boot" / "efiboot.img"
        if not efiboot.exists():
            efiboot.parent.mkdir(parents=True, exist_ok=True)
            # One builder across the replicas sharing the cache: each replica's own build
            # replaced the file under the others, whose base-ISO keys (size and mtime of the
            # file) then differed: three replicas built three identical base ISOs.
            with open(efiboot.parent / ".efiboot.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not efiboot.exists():
                    make_efiboot(self.cache_dir, efiboot)
        self._boot = BootArtifacts(ISOLINUX_BIN, LDLINUX, ISOHDPFX, efiboot)
        return self._boot

    def base_for(self, medium: Medium, serial_console: str) -> tuple[Path, BaseLayout]:
        """The base ISO booting ``medium`` (built on first use; blocking) and its slot layout."""
        boot = self.base()
        menus = boot_menus(medium, serial_console)
        key = base_key(
            {
                "v": BASE_FORMAT,
                "menus": menus,
                "slot": SLOT_SIZE,
                "files": {
                    str(p): _stamp(p)
                    for p in (medium.kernel, medium.initrd, boot.efiboot, boot.isolinux_bin, boot.ldlinux)
                },
            }
        )
        with self._guard:
            lock = self._base_locks.setdefault(key, threading.Lock())
        with lock:
            layout = self._layouts.get(key) or load_layout(self.base_dir, key)
            if layout is None:
                layout = build_base(self.base_dir, key, boot, medium, menus)
            self._layouts[key] = layout
        return self.base_dir / f"{key}.iso", layout

    def build(self, name: str, medium: Medium, serial_console: str = "ttyS0,115200n8") -> Path:
        """Write the job's slot record ``<media_dir>/<name>.slot`` (blocking; run in a thread)."""
        started = self._building[name] = next(self._ticks)
        try:
            iso, layout = self.base_for(medium, serial_console)
            record = encode_record(layout.key, render_slot(medium.overlay, layout.size), str(iso))
            self.media_dir.mkdir(parents=True, exist_ok=True)
            final = self.path_of(name)
            if self._removed.get(name, -1) > started:
                return final  # removed meanwhile: the job ended; nothing to publish
            tmp = final.with_name(f".{name}.{os.getpid()}.{started}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the job token
            with os.fdopen(fd, "wb") as f:
                f.write(record)
            os.replace(tmp, final)
            if self._removed.get(name, -1) > started:  # removed between the check and the rename
                final.unlink(missing_ok=True)
            return final
        finally:
            self._building.pop(name, None)
            self._removed.pop(name, None)

    async def build_async(self, name: str, medium: Medium, serial_console: str = "ttyS0,115200n8") -> Path:
        async with self._lock:  # the first build prepares the boot loaders once
            await asyncio.to_thread(self.base)
        return await asyncio.to_thread(self.build, name, medium, serial_console)

    def path_of(self, name: str) -> Path:
        """The job's slot record (the only per-job file)."""
        return self.media_dir / f"{name}.slot"

    def open(self, name: str) -> ServedMedium | None:
        """What ``GET /media/<name>.iso`` serves, or None (no such medium, or its base is gone)."""
        path = self.path_of(name)
        try:
            key, _, payload = decode_record(path.read_bytes())
            record_mtime = path.stat().st_mtime
        except (FileNotFoundError, ValueError):
            return None
        layout = self._layouts.get(key) or load_layout(self.base_dir, key)
        base = self.base_dir / f"{key}.iso"
        if layout is None or not base.is_file():
            return None
        self._layouts[key] = layout
        return ServedMedium(base, layout, payload, max(record_mtime, base.stat().st_mtime))

    def legacy_iso(self, name: str) -> Path | None:
        """A whole per-job ISO written before slots existed (served until its job ends)."""
        path = self.media_dir / f"{name}.iso"
        return path if path.is_file() else None

    def remove(self, name: str) -> None:
        if name in self._building:
            self._removed[name] = next(self._ticks)
        for path in (self.path_of(name), self.media_dir / f"{name}.iso"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _stamp(p: Path) -> list[int]:
    st = p.stat()
    return [st.st_size, st.st_mtime_ns]


def load_layout(base_dir: Path, key: str) -> BaseLayout | None:
    """The recorded slot layout of base ``key`` (None when missing or not matching its ISO)."""
    iso, meta = base_dir / f"{key}.iso", base_dir / f"{key}.json"
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        layout = BaseLayout.from_json(meta.read_text())
        if iso.stat().st_size == layout.iso_size:
            return layout
    return None


def open_record(record: Path) -> ServedMedium | None:
    """A job's served medium from its record alone (tools and tests: the base where it was built)."""
    try:
        _, base, _ = decode_record(record.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    builder = MediaBuilder(Path(base).parent.parent, record.parent) if base else None
    return builder.open(record.stem) if builder else None
