"""OpenZFS's kernel modules for the images' kernel, built once per Debian release.

``zfs-dkms`` (the archive's ``contrib`` component) compiles them natively in a throwaway chroot
holding the kernel headers and a compiler; they are packaged as ``karios-zfs-modules-<kver>``
(``Provides: zfs-modules``, what ``zfs-initramfs`` depends on, else zfs-dkms and a compiler), which
the live environment and the installed system then install like any package.

A module of its own so that what shapes the compiled modules (this file and the two
``zfs-modules.*.j2`` templates) can key a cache of them apart from the images' package lists:
those change often, the modules' build (minutes of compiling per release) rarely. Modules built
for one kernel are worthless for another, so the image build checks the kernel its trees got
against :func:`deb_kernel` (``LiveImages.build``).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from karios.common.errors import PermanentFailure
from karios.provisioner.install.live._common import TEMPLATES, run

# The suite's kernel headers, DKMS and zfs-dkms (its postinst builds the modules for every
# installed kernel's headers).
ZFS_BUILD_PACKAGES = "linux-headers-amd64,dkms,zfs-dkms"
# Not compiled with -g0 (KCFLAGS), though DKMS strips the modules' DWARF anyway: trixie's headers
# carry vmlinux, so kbuild generates each module's BTF from its DWARF (pahole), and without it
# pahole fails — OpenZFS's configure then finds no module support (tried 2026-12-06).

# The name of the package's Debian package, before the kernel release it is built for.
PACKAGE_PREFIX = "karios-zfs-modules-"


def copy_out_hook(built: Path) -> str:
    """mmdebstrap ``--customize-hook``: copy what zfs-dkms built out of the chroot into
    ``built/<kver>/updates/dkms/`` and zfs-dkms's version into ``built.version``; fails when it
    built nothing (DKMS logs why in the chroot, which the build's error then shows)."""
    q = shlex.quote(str(built))
    return (
        f'cd "$1/usr/lib/modules" && ls */updates/dkms/zfs.ko* >/dev/null '
        f"&& cp -a --parents */updates/dkms {q}/ "
        f"&& chroot \"$1\" dpkg-query -W -f='${{Version}}' zfs-dkms > {q}.version"
    )


def zfs_modules_deb(built: Path, deb: Path, version: str) -> None:
    """Package ``built/<kver>/updates/dkms/*.ko`` (what zfs-dkms ``version`` built) as ``deb``."""
    kvers = sorted(p.name for p in built.iterdir())
    if len(kvers) != 1:
        raise PermanentFailure(f"zfs-dkms built modules for {kvers or 'no kernel'}, expected one kernel")
    kver = kvers[0]
    pkg = deb.parent / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    shutil.copytree(built / kver, pkg / "usr/lib/modules" / kver)
    control = TEMPLATES.get_template("zfs-modules.control.j2")
    (pkg / "DEBIAN/control").write_text(control.render(kver=kver, version=version, prefix=PACKAGE_PREFIX))
    post = pkg / "DEBIAN/postinst"
    post.write_text(TEMPLATES.get_template("zfs-modules.postinst.j2").render(kver=kver))
    post.chmod(0o755)
    run(["dpkg-deb", "--root-owner-group", "-Zzstd", "--build", str(pkg), str(deb)])


def deb_kernel(deb: Path) -> str:
    """The kernel release the modules package ``deb`` was built for (its package name)."""
    try:
        name = run(["dpkg-deb", "-f", str(deb), "Package"], timeout=60).strip()
    except PermanentFailure as exc:
        raise PermanentFailure(f"{deb} is not a ZFS modules package ({exc.message})") from None
    if not name.startswith(PACKAGE_PREFIX):
        raise PermanentFailure(f"{deb} is not a ZFS modules package (it is {name!r})")
    return name.removeprefix(PACKAGE_PREFIX)
