"""The live environment and the root filesystem archive, built once per Debian release.

Both come from regular Debian packages (``mmdebstrap``), so they need nothing from the
installer's udebs:

- ``root.tar.zst``: the installed system (kernel, GRUB for BIOS and UEFI, mdadm, OpenSSH …),
  streamed onto the target disks by the image method;
- ``vmlinuz`` + ``live.img``: a small initramfs (busybox, partitioning and RAID tools, the
  dependency closure of common disk/NIC drivers) whose ``/init`` brings the network up and
  runs the per-host script appended to it (``/karios/run.sh``);
- ``zfs-modules.deb``: OpenZFS's kernel modules built once for the suite's kernel (``zfs.py``);
  both images install it like any package, and a build whose trees got another kernel than the
  modules were built for builds the modules and the trees again.

Everything lands in ``<images_dir>/<suite>/`` atomically: each artifact is built in a temp dir
beside it and renamed into place, so a reader sees a complete file or none, and a crashed
build leaves only a temp dir behind.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment

from karios.common.errors import PermanentFailure
from karios.provisioner.install.live import zfs
from karios.provisioner.install.live._common import TEMPLATES
from karios.provisioner.install.live._common import run as _run
from karios.provisioner.templating import package_templates

# zfsutils-linux and zfs-initramfs (contrib): a root on ZFS is imported by the initramfs the
# image was built with (its zfs hook and the prebuilt modules). dbus: systemd's tools answer the
# operator as on a Debian the installer makes (a user's systemctl, hostnamectl, timedatectl and
# localectl go through D-Bus: without it the first prints nothing, the others fail even as root).
ROOT_PACKAGES = (
    "linux-image-amd64,systemd-sysv,udev,dbus,grub-pc-bin,grub-efi-amd64-bin,grub2-common,mdadm,"
    "openssh-server,ifupdown,isc-dhcp-client,e2fsprogs,dosfstools,iproute2,ca-certificates,curl,"
    "wget,kmod,zstd,sudo,locales,initramfs-tools,zfsutils-linux,zfs-initramfs"
)
# The archive components image builds use: OpenZFS is in contrib (its licence), the rest in main.
COMPONENTS = "main,contrib"
MMDEBSTRAP_HOOKS = "/usr/share/mmdebstrap/hooks"
# tiny-initramfs satisfies the kernel's initramfs-tool dependency without initramfs-tools
# building an initrd the live tree never uses (a minute of the build).
# nvme-cli, hdparm and sg3-utils: the wipe's secure-erase ladder (NVMe sanitize/format, ATA
# security erase, SCSI sanitize). mtools: a whole-disk image's cloud-init seed is written to its
# vfat partition without mounting it (no kernel filesystem needed). zfsutils-linux: a ZFS pool
# (pool_backend zfs) is created by the live environment (the modules: zfs-modules.tar).
LIVE_PACKAGES = (
    "linux-image-amd64,tiny-initramfs,busybox,fdisk,gdisk,e2fsprogs,dosfstools,mtools,mdadm,util-linux,zstd,"
    "curl,ca-certificates,kmod,iproute2,nvme-cli,hdparm,sg3-utils,zfsutils-linux"
)
# Disk, NIC and filesystem drivers of the live environment; their dependencies come along.
# Names missing from a kernel package (built in, or not built) are skipped. The device drivers
# are loaded only for the devices present (by their modalias, /init); the rest always.
_LIVE_DRIVER_NAMES = (
    "virtio_pci virtio_blk virtio_scsi virtio_net ahci ata_piix nvme "
    "mpt3sas megaraid_sas smartpqi aacraid hpsa "
    "e1000e e1000 igb ixgbe i40e ice bnxt_en tg3"
)
_LIVE_ALWAYS_NAMES = (
    "sd_mod sr_mod ext4 vfat nls_cp437 nls_ascii nls_iso8859_1 isofs "
    "md_mod linear raid0 raid1 raid10 raid456 crc32c_generic efivarfs"
)
LIVE_DRIVERS = _LIVE_DRIVER_NAMES.split()
LIVE_MODULES = LIVE_DRIVERS + _LIVE_ALWAYS_NAMES.split()
# Trimmed from the live tree: documentation and data nothing in it reads.
LIVE_PRUNE = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
    "var/cache/apt",
    "var/lib/apt/lists",
    "boot/initrd.img*",
    "usr/lib/python3*",  # zfsutils-linux's arc_summary/arcstat: nothing the install runs
    "usr/share/perl*",
)

#: What shapes the compiled ZFS modules, and the images around them (files of this package): a
#: cache keyed by :func:`inputs_key` of them builds anew when one changes. The per-host scripts
#: (callbacks.sh.j2, …) go into each job's overlay instead.
ZFS_INPUTS = ("zfs.py", "templates/zfs-modules.control.j2", "templates/zfs-modules.postinst.j2")
IMAGE_INPUTS = ("__init__.py", "templates/init.j2", *ZFS_INPUTS)


def inputs_key(names: tuple[str, ...], suite: str) -> str:
    """A cache key for what ``names`` (:data:`IMAGE_INPUTS`, :data:`ZFS_INPUTS`) build for ``suite``."""
    h = hashlib.sha256(suite.encode())
    for name in names:
        h.update(name.encode() + b"\0" + (Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:16]


def render_init(modules: list[str]) -> str:
    """The live environment's ``/init`` (pure): ``modules`` are the kept ones; the device
    drivers among them (:data:`LIVE_DRIVERS`) load for the devices present, the rest always."""
    always = [m for m in modules if m not in LIVE_DRIVERS]
    return TEMPLATES.get_template("init.j2").render(modules=always)


def _sh_quote(value: object) -> str:
    return shlex.quote("" if value is None else str(value))


def script_environment(package: str) -> Environment:
    """Jinja2 for a method's per-host scripts: its own templates plus the shared
    ``callbacks.sh.j2``; ``| sh`` quotes a value for the shell."""
    env = package_templates(package, TEMPLATES.loader)  # type: ignore[arg-type]
    env.filters["sh"] = _sh_quote
    return env


def as_list(value: Any) -> list[str]:
    """A list of strings from a list, a comma/space separated string or None."""
    if not value:
        return []
    if isinstance(value, str):
        return value.replace(",", " ").split()
    return [str(v) for v in value]


def dev_paths(disks: list[str]) -> list[str]:
    """``["vda", "/dev/vdb"]`` → ``["/dev/vda", "/dev/vdb"]``."""
    return [d if d.startswith("/dev/") else f"/dev/{d}" for d in disks]


def net_env(nic_mac: str, static: dict[str, Any] | None, nameservers: list[str]) -> str:
    """``/karios/net.env`` for ``/init``: DHCP, or the static address (netmask or prefix)."""
    lines = ["NET_MODE=dhcp"]
    if static and static.get("address"):
        mask = str(static.get("netmask") or static.get("prefix") or "24")
        iface = ipaddress.ip_interface(f"{static['address']}/{mask}")
        lines = [
            "NET_MODE=static",
            f"NET_ADDRESS={_sh_quote(iface.ip)}",
            f"NET_PREFIX={iface.network.prefixlen}",
            f"NET_GATEWAY={_sh_quote(static.get('gateway') or '')}",
        ]
        nameservers = nameservers or as_list(static.get("nameservers"))
    lines.append(f"NET_MAC={_sh_quote(nic_mac.lower())}")
    lines.append(f"NET_DNS={_sh_quote(' '.join(nameservers))}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ImageSettings:
    """The image settings of the provisioner config (``KARIOS_PROVISIONER_IMAGE_MIRROR/_PROXY/_URL``)."""

    mirror: str = ""  # Debian mirror URL image builds use ("" = mirror_host/dir)
    proxy: str = ""  # HTTP proxy for image builds ("" = mirror_proxy)
    url: str = ""  # base URL targets fetch /images/ from ("" = media_url)

    @classmethod
    def from_config(cls, cfg: Any) -> ImageSettings:
        return cls(
            mirror=getattr(cfg, "image_mirror", ""),
            proxy=getattr(cfg, "image_proxy", ""),
            url=getattr(cfg, "image_url", ""),
        )


@dataclass(frozen=True)
class AptSource:
    """Where mmdebstrap downloads packages: a mirror URL and/or an HTTP proxy."""

    mirror: str = ""  # e.g. http://127.0.0.1:3142/debian ("" = mmdebstrap's default)
    proxy: str = ""  # e.g. http://127.0.0.1:3142 ("" = none)

    @classmethod
    def for_config(
        cls, settings: ImageSettings, mirror_host: str = "", mirror_dir: str = "/debian", proxy: str = ""
    ) -> AptSource:
        """The image settings win; else the installers' mirror host/dir and proxy."""
        mirror = settings.mirror or (f"http://{mirror_host}{mirror_dir}" if mirror_host else "")
        return cls(mirror=mirror, proxy=settings.proxy or proxy)

    def args(self) -> list[str]:
        return [f'--aptopt=Acquire::http::Proxy "{self.proxy}"'] if self.proxy else []


@dataclass(frozen=True)
class LiveArtifacts:
    kernel: Path
    initrd: Path
    root_archive: Path
    zfs_modules: Path


class LiveImages:
    """Builds and caches the live environment and root archive under ``images_dir/<suite>/``."""

    def __init__(self, images_dir: Path, source: AptSource | None = None) -> None:
        self.images_dir = Path(images_dir)
        self.source = source or AptSource()

    def tools_missing(self) -> list[str]:
        return [t for t in ("mmdebstrap", "zstd", "cpio") if not shutil.which(t)]

    def artifacts(self, suite: str) -> LiveArtifacts:
        d = self.images_dir / suite
        return LiveArtifacts(d / "vmlinuz", d / "live.img", d / "root.tar.zst", d / "zfs-modules.deb")

    def ready(self, suite: str) -> bool:
        a = self.artifacts(suite)
        return all(p.exists() for p in (a.kernel, a.initrd, a.root_archive))

    def build(self, suite: str, *, with_root: bool = True) -> dict[str, float]:
        """Build what is missing (blocking, minutes when cold); returns seconds per artifact.
        ``with_root=False``: only the live environment (all a wipe needs)."""
        missing = self.tools_missing()
        if missing:
            raise PermanentFailure(f"image build tools missing: {', '.join(missing)}")
        out = self.images_dir / suite
        out.mkdir(parents=True, exist_ok=True)
        try:
            times = self._build_missing(suite, out, with_root)
        except StaleZfsModules:  # the archive's kernel moved on since the modules were built
            a = self.artifacts(suite)
            for p in (a.zfs_modules, a.root_archive, a.kernel, a.initrd):
                p.unlink(missing_ok=True)
            times = self._build_missing(suite, out, with_root)
        if times:  # the last build's seconds per artifact (kept for those not rebuilt)
            record = out / "build-times.json"
            known = json.loads(record.read_text()) if record.exists() else {}
            record.write_text(json.dumps({**known, **times}) + "\n")
        return times

    def _build_missing(self, suite: str, out: Path, with_root: bool) -> dict[str, float]:
        times: dict[str, float] = {}
        a = self.artifacts(suite)
        todo = (with_root and not a.root_archive.exists()) or not (a.kernel.exists() and a.initrd.exists())
        if todo and not a.zfs_modules.exists():  # both images take them in
            t = time.perf_counter()
            self._build_zfs(suite, out)
            times["zfs"] = round(time.perf_counter() - t, 1)
        if with_root and not a.root_archive.exists():
            t = time.perf_counter()
            self._build_root(suite, out)
            times["root"] = round(time.perf_counter() - t, 1)
        if not (a.kernel.exists() and a.initrd.exists()):
            t = time.perf_counter()
            self._build_live(suite, out)
            times["live"] = round(time.perf_counter() - t, 1)
        return times

    def _check_kernels(self, suite: str, out: Path, kernels: list[str]) -> None:
        """Raise :class:`StaleZfsModules` unless ``kernels`` (what a tree got) are exactly the one
        the suite's ZFS modules were built for."""
        built_for = zfs.deb_kernel(out / "zfs-modules.deb")
        if kernels != [built_for]:
            raise StaleZfsModules(f"{suite}: ZFS modules for Linux {built_for}, the image got {kernels}")

    def _mmdebstrap(self, suite: str, include: str, target: str, cwd: Path, *extra: str) -> None:
        argv = ["mmdebstrap", "--variant=minbase", f"--components={COMPONENTS}", f"--include={include}"]
        if ".deb" in include:  # a local package: its path must be visible inside the chroot
            argv.append(f"--hook-dir={MMDEBSTRAP_HOOKS}/file-mirror-automount")
        argv += [*self.source.args(), *extra]
        argv += [suite, target]
        if self.source.mirror:
            argv.append(self.source.mirror)
        _run(argv, cwd=cwd, timeout=1800)

    def _build_zfs(self, suite: str, out: Path) -> None:
        """``zfs-modules.deb``: the modules zfs-dkms built for the suite's kernel, packaged."""
        with tempfile.TemporaryDirectory(prefix=".zfs-", dir=out) as tmp:
            built = Path(tmp) / "built"
            built.mkdir()
            tree, hook = str(Path(tmp) / "tree"), f"--customize-hook={zfs.copy_out_hook(built)}"
            self._mmdebstrap(suite, zfs.ZFS_BUILD_PACKAGES, tree, Path(tmp), hook)
            deb = Path(tmp) / "zfs-modules.deb"
            zfs.zfs_modules_deb(built, deb, Path(f"{built}.version").read_text().strip())
            os.replace(deb, out / "zfs-modules.deb")

    def _zfs_include(self, out: Path) -> str:
        """The ZFS modules package for mmdebstrap's ``--include`` (a local .deb: mmdebstrap's
        file-mirror-automount hook makes its path visible to the chroot's dpkg)."""
        return str(out / "zfs-modules.deb")

    def _build_root(self, suite: str, out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix=".root-", dir=out) as tmp:
            tar, kernels = Path(tmp) / "root.tar", Path(tmp) / "kernels"
            include = f"{ROOT_PACKAGES},{self._zfs_include(out)}"
            hook = f'--customize-hook=ls "$1/boot" > {shlex.quote(str(kernels))}'
            self._mmdebstrap(suite, include, str(tar), Path(tmp), hook)
            self._check_kernels(suite, out, boot_kernels(kernels.read_text().split()))
            _run(["zstd", "-q", "-3", "-T0", "--rm", str(tar), "-o", str(tar) + ".zst"], timeout=600)
            os.replace(str(tar) + ".zst", out / "root.tar.zst")

    def _build_live(self, suite: str, out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix=".live-", dir=out) as tmp:
            tree = Path(tmp) / "tree"
            excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale", "info")]
            include = f"{LIVE_PACKAGES},{self._zfs_include(out)}"
            self._mmdebstrap(suite, include, str(tree), Path(tmp), *excludes)
            kernels = boot_kernels(p.name for p in (tree / "boot").iterdir())
            if not kernels:
                raise PermanentFailure(f"live environment for {suite}: no kernel in the package set")
            self._check_kernels(suite, out, kernels)
            kver = kernels[-1]
            shutil.copyfile(tree / "boot" / f"vmlinuz-{kver}", Path(tmp) / "vmlinuz")
            kept = keep_modules(tree / "usr/lib/modules" / kver, LIVE_MODULES)
            _run(["chroot", str(tree), "depmod", "-a", kver])  # the tree's own kmod
            for pattern in LIVE_PRUNE:
                for p in tree.glob(pattern):
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            (tree / "init").write_text(render_init(kept))
            (tree / "init").chmod(0o755)
            img = Path(tmp) / "live.img"
            _run(
                ["sh", "-c", f"find . -mindepth 1 | cpio -o -H newc --quiet | zstd -q -10 -T0 > {img}"],
                cwd=tree,
                timeout=600,
            )
            os.replace(Path(tmp) / "vmlinuz", out / "vmlinuz")
            os.replace(img, out / "live.img")


class StaleZfsModules(PermanentFailure):
    """An image tree got another kernel than the suite's ZFS modules were built for."""


def boot_kernels(names: Iterable[str]) -> list[str]:
    """The kernel releases of a tree's ``/boot`` listing (``vmlinuz-<release>``), sorted (pure)."""
    return sorted(n.removeprefix("vmlinuz-") for n in names if n.startswith("vmlinuz-"))


def keep_modules(moddir: Path, wanted: list[str]) -> list[str]:
    """Delete every module of ``moddir`` outside the dependency closure of ``wanted`` (by
    ``modules.dep``); returns the wanted names that exist as modules, in order."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[_mod_name(path)] = path
    present = [m for m in wanted if m in by_name]
    keep: set[str] = set()
    todo = [by_name[m] for m in present]
    while todo:
        p = todo.pop()
        if p not in keep:
            keep.add(p)
            todo.extend(deps.get(p, []))
    for ko in (moddir / "kernel").rglob("*.ko*"):
        if str(ko.relative_to(moddir)) not in keep:
            ko.unlink()
    return present


def _mod_name(path: str) -> str:
    name = path.rsplit("/", 1)[-1].split(".ko", 1)[0]
    return name.replace("-", "_")


def live_images_for(cfg: Any, settings: ImageSettings) -> LiveImages:
    """The cache a provisioner config points at: ``cfg.images_dir`` (else ``<cache_dir>/images``),
    built through the image mirror/proxy settings, else the installers' mirror and proxy."""
    images_dir = getattr(cfg, "images_dir", None) or Path(cfg.cache_dir) / "images"
    source = AptSource.for_config(
        settings,
        getattr(cfg, "mirror_host", ""),
        getattr(cfg, "mirror_dir", "/debian"),
        getattr(cfg, "mirror_proxy", ""),
    )
    return LiveImages(images_dir, source)


class LiveMethod:
    """What the methods booting the live environment share: its images and their settings."""

    def __init__(self, cfg: Any, settings: ImageSettings | None = None) -> None:
        self.settings = settings or ImageSettings.from_config(cfg)
        self.images = live_images_for(cfg, self.settings)

    def tools_missing(self) -> list[str]:
        return self.images.tools_missing()
