"""Building a base ISO (blocking I/O): the boot loaders, ``xorriso``, and locating the slot.

Used by :class:`karios.provisioner.media.MediaBuilder`, once per boot configuration.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import stamina

from karios.common.errors import PermanentFailure
from karios.provisioner.install import Medium
from karios.provisioner.media.slot import SENTINEL, SLOT_PATH, SLOT_SIZE, BaseLayout

VOLUME_ID = "KARIOS"
MARKER = ".karios-media"
GRUB_STUB = f"""search --no-floppy --set=root --file /{MARKER}
set prefix=($root)/boot/grub
configfile ($root)/boot/grub/grub.cfg
"""


class _ToolCrashed(Exception):
    """The tool died from a signal (seen: xorriso 1.5.4 SIGSEGV under load); worth another try."""


def _run(argv: list[str], **kw) -> str:  # type: ignore[no-untyped-def]
    """Run a build tool (its stdout); a crash (signal) is retried, a real error is permanent at once."""
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
    return res.stdout


@dataclass
class BootArtifacts:
    """What every ISO boots with, whatever the method: BIOS (isolinux) and UEFI (GRUB in a FAT image)."""

    isolinux_bin: Path
    ldlinux: Path
    isohdpfx: Path
    efiboot: Path


_LBA = re.compile(r"File data lba:\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*'([^']*)'")


def slot_extent(iso: Path) -> tuple[int, int]:
    """(byte offset, size) of the slot file in ``iso``, from xorriso's own report."""
    out = _run(["xorriso", "-indev", str(iso), "-find", SLOT_PATH, "-exec", "report_lba", "--"])
    found = [m for m in _LBA.finditer(out) if m.group(5) == SLOT_PATH]
    if len(found) != 1:
        raise PermanentFailure(f"medium: {SLOT_PATH} not found in the base image {iso.name}")
    _xt, lba, _blocks, size, _ = found[0].groups()
    return int(lba) * 2048, int(size)


def build_base(
    base_dir: Path, key: str, boot: BootArtifacts, medium: Medium, menus: dict[str, str]
) -> BaseLayout:
    """Write ``<key>.iso`` with a sentinel-filled slot, check where the slot landed, zero it."""
    base_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=base_dir))
    try:
        iso_bin = work / "isolinux.bin"  # xorriso patches the boot info table into its copy
        shutil.copyfile(boot.isolinux_bin, iso_bin)
        slot = work / "host.img"
        slot.write_bytes(SENTINEL * (SLOT_SIZE // len(SENTINEL)))
        grafts = {
            "/install.amd/vmlinuz": medium.kernel,
            "/install.amd/initrd.gz": medium.initrd,  # grafted in place, never copied
            SLOT_PATH: slot,
            "/isolinux/isolinux.bin": iso_bin,
            "/isolinux/ldlinux.c32": boot.ldlinux,
            "/boot/efiboot.img": boot.efiboot,
        }
        for rel, text in {**menus, MARKER: "karios\n"}.items():
            p = work / rel.replace("/", "_")
            p.write_text(text)
            grafts["/" + rel] = p
        tmp_iso = work / "out.iso"
        _run(_xorriso_argv(tmp_iso, boot, grafts))
        offset, size = slot_extent(tmp_iso)
        with open(tmp_iso, "r+b") as f:
            f.seek(offset)
            if size != SLOT_SIZE or f.read(size) != slot.read_bytes():
                raise PermanentFailure("medium: the slot of the base image is not where xorriso reports it")
            f.seek(offset)
            f.write(bytes(size))
        final = base_dir / f"{key}.iso"
        with contextlib.suppress(FileExistsError):  # another process built it first: keep theirs
            os.link(tmp_iso, final)
        offset, size = slot_extent(final)
        layout = BaseLayout(key, final.stat().st_size, offset, size)
        meta = work / "layout.json"
        meta.write_text(layout.to_json())
        os.replace(meta, base_dir / f"{key}.json")
        return layout
    finally:
        shutil.rmtree(work, ignore_errors=True)


def make_efiboot(cache_dir: Path, efiboot: Path) -> None:
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
