"""The ZFS modules package and the image build's kernel check: modules compiled for one kernel
never land in an image that boots another (the archive's kernel moves on between a cached
modules build and a later image build)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from karios.common.errors import PermanentFailure
from karios.provisioner.install.live import LiveImages, boot_kernels, zfs

pytestmark = pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="needs dpkg-deb (Debian's dpkg)")


def _built(tmp: Path, kver: str) -> Path:
    built = tmp / f"built-{kver}"
    (built / kver / "updates/dkms").mkdir(parents=True)
    (built / kver / "updates/dkms/zfs.ko.xz").write_bytes(b"\x00module")
    return built


def test_the_package_names_the_kernel_it_was_built_for(tmp_path: Path) -> None:
    deb = tmp_path / "out" / "zfs-modules.deb"
    deb.parent.mkdir()
    zfs.zfs_modules_deb(_built(tmp_path, "6.1.0-28-amd64"), deb, "2.1.11-1+deb12u1")
    assert zfs.deb_kernel(deb) == "6.1.0-28-amd64"


def test_modules_for_two_kernels_are_refused(tmp_path: Path) -> None:
    built = _built(tmp_path, "6.1.0-28-amd64")
    (built / "6.1.0-29-amd64").mkdir()
    with pytest.raises(PermanentFailure, match="expected one kernel"):
        zfs.zfs_modules_deb(built, tmp_path / "zfs-modules.deb", "2.1.11")


def test_a_file_that_is_not_the_modules_package_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "zfs-modules.deb"
    junk.write_bytes(b"not a deb")
    with pytest.raises(PermanentFailure, match="not a ZFS modules package"):
        zfs.deb_kernel(junk)


def test_boot_kernels_reads_a_boot_listing() -> None:
    names = [
        "System.map-6.1.0-29-amd64",
        "vmlinuz-6.1.0-29-amd64",
        "config-6.1.0-29-amd64",
        "grub",
        "vmlinuz-6.1.0-3-rt",
    ]
    assert boot_kernels(names) == ["6.1.0-29-amd64", "6.1.0-3-rt"]
    assert boot_kernels(["initrd.img-6.1.0-29-amd64"]) == []


class _Archive(LiveImages):
    """The build's steps over an archive whose kernel is ``kernel`` (no mmdebstrap): the real
    build orchestration and the real kernel check, the trees as marker files."""

    def __init__(self, images_dir: Path, kernel: str) -> None:
        super().__init__(images_dir)
        self.kernel, self.compiled = kernel, 0

    def tools_missing(self) -> list[str]:
        return []

    def _build_zfs(self, suite: str, out: Path) -> None:
        self.compiled += 1
        tmp = Path(tempfile.mkdtemp(prefix=".zfs-", dir=out))
        zfs.zfs_modules_deb(_built(tmp, self.kernel), tmp / "zfs-modules.deb", "2.1.11")
        (tmp / "zfs-modules.deb").replace(out / "zfs-modules.deb")

    def _build_root(self, suite: str, out: Path) -> None:
        self._check_kernels(suite, out, [self.kernel])
        (out / "root.tar.zst").write_text(self.kernel)

    def _build_live(self, suite: str, out: Path) -> None:
        self._check_kernels(suite, out, [self.kernel])
        (out / "vmlinuz").write_text(self.kernel)
        (out / "live.img").write_text(self.kernel)


def test_cached_modules_for_the_archives_kernel_are_not_compiled_again(tmp_path: Path) -> None:
    images = _Archive(tmp_path, "6.1.0-28-amd64")
    assert set(images.build("bookworm")) == {"zfs", "root", "live"}
    for name in ("root.tar.zst", "vmlinuz", "live.img"):
        (tmp_path / "bookworm" / name).unlink()  # new trees (the package lists changed), same modules
    assert set(images.build("bookworm")) == {"root", "live"}
    assert images.compiled == 1


def test_modules_for_a_kernel_the_archive_moved_past_are_compiled_again(tmp_path: Path) -> None:
    _Archive(tmp_path, "6.1.0-28-amd64").build("bookworm")
    out = tmp_path / "bookworm"
    (out / "live.img").unlink()  # only the live environment to build, the root archive still there
    later = _Archive(tmp_path, "6.1.0-29-amd64")  # a point release later
    assert set(later.build("bookworm")) == {"zfs", "root", "live"}
    assert later.compiled == 1
    assert zfs.deb_kernel(out / "zfs-modules.deb") == "6.1.0-29-amd64"
    # every tree rebuilt around the new modules: none of the old kernel's left beside them
    assert {(out / n).read_text() for n in ("root.tar.zst", "vmlinuz", "live.img")} == {"6.1.0-29-amd64"}


def test_a_tree_with_two_kernels_is_refused(tmp_path: Path) -> None:
    images = _Archive(tmp_path, "6.1.0-28-amd64")
    images.build("bookworm")
    with pytest.raises(PermanentFailure, match=r"6\.1\.0-28-amd64"):
        images._check_kernels("bookworm", tmp_path / "bookworm", ["6.1.0-28-amd64", "6.1.0-29-amd64"])
