"""Boot media: the per-host hybrid BIOS+UEFI ISO of any install method's :class:`Medium`.

The boot loaders (isolinux, the standalone GRUB EFI image in a FAT image) are prepared once into
``cache_dir``; the kernel and base initrd come from the install method (prepared and cached by
it). A host's ISO costs one initrd copy plus an appended gzip'd cpio and one ``xorriso`` run
that grafts the cached files in place. Both boot menus use the serial console as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import stamina
from jinja2 import Environment, PackageLoader, StrictUndefined

from karios.common.contracts.provision import check_debian_version, debian_suites
from karios.common.errors import PermanentFailure
from karios.provisioner.cpio import gzip_overlay
from karios.provisioner.install import Medium

NETBOOT_ROOT = Path("/usr/lib/debian-installer/images")
ISOLINUX_BIN = Path("/usr/lib/ISOLINUX/isolinux.bin")
ISOHDPFX = Path("/usr/lib/ISOLINUX/isohdpfx.bin")
LDLINUX = Path("/usr/lib/syslinux/modules/bios/ldlinux.c32")
VOLUME_ID = "KARIOS"
MARKER = ".karios-media"


def _suite_version() -> dict[str, str]:
    return {suite: major for major, suite in debian_suites().items() if major.isdigit()}


GRUB_STUB = f"""search --no-floppy --set=root --file /{MARKER}
set prefix=($root)/boot/grub
configfile ($root)/boot/grub/grub.cfg
"""


def debian_release(version: str) -> tuple[str, str]:
    """``debian_version`` ("12", "13", "bookworm", "12.5") → (major, suite), from the shared OS
    catalog (``karios.common.oscatalog``); 422 if the catalog has no such release."""
    suite = check_debian_version(version)
    return _suite_version()[suite], suite


def netboot_dir(major: str, arch: str = "amd64", root: Path = NETBOOT_ROOT) -> Path:
    return root / major / arch / "text" / "debian-installer" / arch


class _ToolCrashed(Exception):
    """The tool died from a signal (seen: xorriso 1.5.4 SIGSEGV under load); worth another try."""


def _run(argv: list[str], **kw) -> None:  # type: ignore[no-untyped-def]
    """Run a build tool; a crash (signal) is retried, a real error is permanent at once."""
    try:
        for attempt in stamina.retry_context(
            on=_ToolCrashed, attempts=3, timeout=None, wait_initial=0.2, wait_jitter=0.1
        ):
            with attempt:
                res = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)
                if res.returncode < 0 or "UNIX-SIGNAL" in res.stderr:
                    raise _ToolCrashed(f"{argv[0]} crashed: {res.stderr.strip()[-300:]}")
    except _ToolCrashed as exc:
        raise PermanentFailure(f"{exc} (3 tries)") from None
    if res.returncode != 0:
        raise PermanentFailure(f"{argv[0]} failed: {res.stderr.strip()[-500:]}")


@dataclass
class BootArtifacts:
    """What every ISO boots with, whatever the method: BIOS (isolinux) and UEFI (GRUB in a FAT image)."""

    isolinux_bin: Path
    ldlinux: Path
    isohdpfx: Path
    efiboot: Path


_BOOT = Environment(
    loader=PackageLoader("karios.provisioner", "boot_templates"),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # noqa: S701 - bootloader configuration, never HTML
)


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
    """Writes per-host hybrid BIOS+UEFI ISOs from a :class:`Medium` (kernel, initrd + overlay, args)."""

    def __init__(self, cache_dir: Path, media_dir: Path) -> None:
        self.cache_dir = Path(cache_dir)
        self.media_dir = Path(media_dir)
        self._boot: BootArtifacts | None = None
        self._lock = asyncio.Lock()
        # A medium removed while it was being built (job cancelled or failed meanwhile; a cancelled
        # task does not stop the build's thread) is discarded when that build finishes.
        self._ticks = itertools.count()
        self._building: dict[str, int] = {}  # name → tick its build started
        self._removed: dict[str, int] = {}  # name → tick it was removed during that build

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
            _make_efiboot(self.cache_dir, efiboot)
        self._boot = BootArtifacts(ISOLINUX_BIN, LDLINUX, ISOHDPFX, efiboot)
        return self._boot

    def build(self, name: str, medium: Medium, serial_console: str = "ttyS0,115200n8") -> Path:
        """Write ``<media_dir>/<name>.iso`` (blocking; run in a thread). Returns its path."""
        base = self.base()
        started = self._building[name] = next(self._ticks)
        self.media_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.media_dir))
        try:
            initrd = work / "initrd.gz"
            with open(initrd, "wb") as out, open(medium.initrd, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.write(gzip_overlay(medium.overlay))
            iso_bin = work / "isolinux.bin"  # xorriso patches the boot info table into its copy
            shutil.copyfile(base.isolinux_bin, iso_bin)
            grafts = {
                "/install.amd/vmlinuz": medium.kernel,
                "/install.amd/initrd.gz": initrd,
                "/isolinux/isolinux.bin": iso_bin,
                "/isolinux/ldlinux.c32": base.ldlinux,
                "/boot/efiboot.img": base.efiboot,
            }
            for rel, text in {**boot_menus(medium, serial_console), MARKER: name + "\n"}.items():
                p = work / rel.replace("/", "_")
                p.write_text(text)
                grafts["/" + rel] = p
            tmp_iso = work / "out.iso"
            _run(_xorriso_argv(tmp_iso, base, grafts))
            final = self.media_dir / f"{name}.iso"
            if self._removed.get(name, -1) > started:
                return final  # removed meanwhile: the job ended; nothing to publish
            os.replace(tmp_iso, final)
            return final
        finally:
            shutil.rmtree(work, ignore_errors=True)
            self._building.pop(name, None)
            self._removed.pop(name, None)

    async def build_async(self, name: str, medium: Medium, serial_console: str = "ttyS0,115200n8") -> Path:
        async with self._lock:  # the first build prepares the boot loaders once
            await asyncio.to_thread(self.base)
        return await asyncio.to_thread(self.build, name, medium, serial_console)

    def path_of(self, name: str) -> Path:
        return self.media_dir / f"{name}.iso"

    def remove(self, name: str) -> None:
        if name in self._building:
            self._removed[name] = next(self._ticks)
        with contextlib.suppress(FileNotFoundError):
            self.path_of(name).unlink()


def _make_efiboot(cache_dir: Path, efiboot: Path) -> None:
    """The standalone GRUB EFI image in a FAT image (atomic: concurrent preparers end with one file)."""
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        stub = Path(tmp) / "stub.cfg"
        stub.write_text(GRUB_STUB)
        efi = Path(tmp) / "bootx64.efi"
        modules = "part_gpt part_msdos iso9660 search search_fs_file configfile linux normal serial terminal"
        _run(
            [
                "grub-mkstandalone",
                "-O",
                "x86_64-efi",
                "-o",
                str(efi),
                f"--modules={modules}",
                "--locales=",
                "--fonts=",
                f"boot/grub/grub.cfg={stub}",
            ]
        )
        img = Path(tmp) / "efiboot.img"
        size_kb = max(4096, (efi.stat().st_size // 1024) + 1024)
        _run(["mkfs.vfat", "-C", str(img), str(size_kb)])
        _run(["mmd", "-i", str(img), "::/EFI", "::/EFI/BOOT"])
        _run(["mcopy", "-i", str(img), str(efi), "::/EFI/BOOT/BOOTX64.EFI"])
        os.replace(img, efiboot)


def _xorriso_argv(out: Path, base: BootArtifacts, grafts: dict[str, Path]) -> list[str]:
    return [
        "xorriso",
        "-as",
        "mkisofs",
        "-quiet",
        "-o",
        str(out),
        "-V",
        VOLUME_ID,
        "-J",
        "-R",
        "-isohybrid-mbr",
        str(base.isohdpfx),
        "-c",
        "isolinux/boot.cat",
        "-b",
        "isolinux/isolinux.bin",
        "-no-emul-boot",
        "-boot-load-size",
        "4",
        "-boot-info-table",
        "-eltorito-alt-boot",
        "-e",
        "boot/efiboot.img",
        "-no-emul-boot",
        "-isohybrid-gpt-basdat",
        "-graft-points",
        *[f"{k}={v}" for k, v in grafts.items()],
    ]


def timed_build(builder: MediaBuilder, name: str, medium: Medium) -> float:
    t = time.perf_counter()
    builder.build(name, medium)
    return time.perf_counter() - t
