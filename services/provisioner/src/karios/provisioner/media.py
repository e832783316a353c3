"""Boot media: per-host hybrid BIOS+UEFI ISO with the Debian installer and a preseeded initrd.

Base artifacts (kernel, initrd, isolinux, the standalone GRUB EFI image in a FAT image) are
prepared once per Debian version into ``cache_dir``; a host's ISO then costs one initrd copy
plus an appended gzip'd cpio and one ``xorriso`` run that grafts cached files in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import stamina

from karios.common.contracts.provision import check_debian_version, debian_suites
from karios.common.errors import PermanentFailure
from karios.provisioner.cpio import gzip_overlay

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
class BaseArtifacts:
    kernel: Path
    initrd: Path
    isolinux_bin: Path
    ldlinux: Path
    isohdpfx: Path
    efiboot: Path


class MediaBuilder:
    def __init__(self, cache_dir: Path, media_dir: Path, netboot_root: Path = NETBOOT_ROOT) -> None:
        self.cache_dir = Path(cache_dir)
        self.media_dir = Path(media_dir)
        self.netboot_root = Path(netboot_root)
        self._bases: dict[str, BaseArtifacts] = {}
        self._lock = asyncio.Lock()

    def tools_missing(self) -> list[str]:
        missing = [
            t for t in ("xorriso", "grub-mkstandalone", "mkfs.vfat", "mcopy", "mmd") if not shutil.which(t)
        ]
        missing += [str(p) for p in (ISOLINUX_BIN, ISOHDPFX, LDLINUX) if not p.exists()]
        return missing

    def base(self, major: str, arch: str = "amd64") -> BaseArtifacts:
        """Prepare (once) and return the cached base artifacts of one Debian release."""
        key = f"{major}-{arch}"
        if key in self._bases:
            return self._bases[key]
        src = netboot_dir(major, arch, self.netboot_root)
        if not (src / "linux").exists():
            raise PermanentFailure(
                f"debian_version: installer for Debian {major} not found at {src} "
                f"(apt-get install debian-installer-{major}-netboot-{arch})"
            )
        missing = self.tools_missing()
        if missing:
            raise PermanentFailure(f"boot media tools missing: {', '.join(missing)}")
        out = self.cache_dir / key
        efiboot = out / "efiboot.img"
        if not efiboot.exists():
            out.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=self.cache_dir) as tmp:
                stub = Path(tmp) / "stub.cfg"
                stub.write_text(GRUB_STUB)
                efi = Path(tmp) / "bootx64.efi"
                _run(
                    [
                        "grub-mkstandalone",
                        "-O",
                        "x86_64-efi",
                        "-o",
                        str(efi),
                        "--modules=part_gpt part_msdos iso9660 search search_fs_file configfile linux normal",
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
                os.replace(img, efiboot)  # atomic: concurrent preparers end with one complete file
        base = BaseArtifacts(
            kernel=src / "linux",
            initrd=src / "initrd.gz",
            isolinux_bin=ISOLINUX_BIN,
            ldlinux=LDLINUX,
            isohdpfx=ISOHDPFX,
            efiboot=efiboot,
        )
        self._bases[key] = base
        return base

    def build(self, name: str, major: str, overlay: dict[str, str], boot_configs: dict[str, str]) -> Path:
        """Write ``<media_dir>/<name>.iso`` (blocking; run in a thread). Returns its path."""
        base = self.base(major)
        self.media_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.media_dir))
        try:
            initrd = work / "initrd.gz"
            with open(initrd, "wb") as out, open(base.initrd, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.write(gzip_overlay(overlay))
            iso_bin = work / "isolinux.bin"  # xorriso patches the boot info table into its copy
            shutil.copyfile(base.isolinux_bin, iso_bin)
            grafts = {
                "/install.amd/vmlinuz": base.kernel,
                "/install.amd/initrd.gz": initrd,
                "/isolinux/isolinux.bin": iso_bin,
                "/isolinux/ldlinux.c32": base.ldlinux,
                "/boot/efiboot.img": base.efiboot,
            }
            for rel, text in {**boot_configs, MARKER: name + "\n"}.items():
                p = work / rel.replace("/", "_")
                p.write_text(text)
                grafts["/" + rel] = p
            tmp_iso = work / "out.iso"
            _run(
                [
                    "xorriso",
                    "-as",
                    "mkisofs",
                    "-quiet",
                    "-o",
                    str(tmp_iso),
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
            )
            final = self.media_dir / f"{name}.iso"
            os.replace(tmp_iso, final)
            return final
        finally:
            shutil.rmtree(work, ignore_errors=True)

    async def build_async(self, name: str, major: str, overlay: dict[str, str], boot: dict[str, str]) -> Path:
        async with self._lock:  # first build of a release prepares the base once
            await asyncio.to_thread(self.base, major)
        return await asyncio.to_thread(self.build, name, major, overlay, boot)

    def path_of(self, name: str) -> Path:
        return self.media_dir / f"{name}.iso"

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path_of(name).unlink()


def timed_build(
    builder: MediaBuilder, name: str, major: str, overlay: dict[str, str], boot: dict[str, str]
) -> float:
    t = time.perf_counter()
    builder.build(name, major, overlay, boot)
    return time.perf_counter() - t
