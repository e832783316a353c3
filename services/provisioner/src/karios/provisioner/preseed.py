"""Per-host installer configuration: validation, RAID mapping and Jinja2 rendering (pure).

``render_media_files(ctx)`` returns the files that go into the initrd (``preseed.cfg`` plus the
callback and first-boot scripts); nothing here touches the disk or the network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from passlib.hash import sha512_crypt

from karios.common.contracts.provision import POOL_TYPES, check_pool
from karios.common.errors import ValidationFailed

_ENV = Environment(
    loader=PackageLoader("karios.provisioner", "templates"),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # noqa: S701 - preseed/shell text, never HTML
)

_HOSTNAME = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_DISK = re.compile(r"^[A-Za-z0-9/_.:-]{1,200}$")
_NIC = re.compile(r"^[A-Za-z0-9_.:-]{1,32}$")
_PCI_ID = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class RaidLevel:
    pool_type: str
    md_level: int | None  # None: no md array (one plain disk)
    min_disks: int
    max_disks: int | None = None


# pool_type (the UI's ZFS-style names) → Linux md-RAID level for the Debian installer.
RAID_MAP: dict[str, RaidLevel] = {name: RaidLevel(name, *row) for name, row in POOL_TYPES.items()}


def normalize_disk(disk: str) -> str:
    d = disk.strip()
    if not _DISK.match(d) or ".." in d:
        raise ValidationFailed(f"selected_disks: {disk!r} is not a disk name", field="selected_disks")
    return d if d.startswith("/dev/") else f"/dev/{d}"


def raid_layout(pool_type: str, disks: list[str]) -> tuple[RaidLevel, list[str]]:
    """Validate ``pool_type`` against the disk count; return the level and normalized disks."""
    devs = [normalize_disk(d) for d in disks]
    if len(set(devs)) != len(devs):
        raise ValidationFailed("selected_disks: a disk is listed twice", field="selected_disks")
    name, _level = check_pool(pool_type, devs)
    return RAID_MAP[name], devs


def gpu_kernel_args(gpu: Any) -> list[str]:
    """``gpu_passthrough`` → kernel arguments (IOMMU on, vfio-pci claims the listed ids).

    Accepted forms: true/false, a list of ``vendor:device`` ids, or an object with
    ``enabled`` (default true), ``device_ids``/``ids`` and optional ``iommu`` ("intel"/"amd"/"both").
    """
    if gpu in (None, False, "", {}, []):
        return []
    ids: list[str] = []
    iommu = "both"
    if gpu is True:
        pass
    elif isinstance(gpu, list):
        ids = [str(x) for x in gpu]
    elif isinstance(gpu, dict):
        if gpu.get("enabled") is False:
            return []
        ids = [str(x) for x in (gpu.get("device_ids") or gpu.get("ids") or [])]
        iommu = str(gpu.get("iommu") or "both")
    else:
        raise ValidationFailed(
            "gpu_passthrough: expected true, a list of ids or an object", field="gpu_passthrough"
        )
    for i in ids:
        if not _PCI_ID.match(i):
            raise ValidationFailed(
                f"gpu_passthrough: {i!r} is not a vendor:device PCI id", field="gpu_passthrough"
            )
    if iommu not in ("intel", "amd", "both"):
        raise ValidationFailed("gpu_passthrough: iommu must be intel, amd or both", field="gpu_passthrough")
    args = []
    if iommu in ("intel", "both"):
        args.append("intel_iommu=on")
    if iommu in ("amd", "both"):
        args.append("amd_iommu=on")
    args.append("iommu=pt")
    if ids:
        args.append("vfio-pci.ids=" + ",".join(i.lower() for i in ids))
    return args


def hash_password(password: str, *, salt: str | None = None) -> str:
    """SHA-512 crypt, the form ``passwd/user-password-crypted`` takes."""
    return sha512_crypt.using(rounds=5000, **({"salt": salt} if salt else {})).hash(password)


@dataclass
class HostContext:
    """Everything the templates need for one host (already validated)."""

    job_id: str
    token: str
    callback_base: str  # e.g. http://10.0.0.1:8080/controlnode
    hostname: str
    bmc_ip: str
    os_username: str
    password_hash: str
    root_password_hash: str = ""
    disks: list[str] = field(default_factory=list)
    md_level: int | None = None
    nic: str = "auto"
    nic_mac: str = ""
    static: dict[str, Any] | None = None  # address, netmask, gateway, nameservers
    kernel_args: list[str] = field(default_factory=list)
    suite: str = "bookworm"
    mirror_host: str = "deb.debian.org"
    mirror_dir: str = "/debian"
    job_type: str = "provision"


def validate_host(hostname: str, os_username: str, nic: str) -> None:
    if hostname and not _HOSTNAME.match(hostname):
        raise ValidationFailed("hostname: use lowercase letters, digits and '-' (max 63)", field="hostname")
    if not _USER.match(os_username):
        raise ValidationFailed("os_username: not a valid Linux user name", field="os_username")
    if nic and nic != "auto" and not _NIC.match(nic):
        raise ValidationFailed("selected_nic: not an interface name", field="selected_nic")


def partition(disk: str, n: int) -> str:
    """``/dev/sda`` 2 → ``/dev/sda2``; ``/dev/nvme0n1`` 2 → ``/dev/nvme0n1p2`` (names ending in a digit)."""
    return f"{disk}p{n}" if disk[-1:].isdigit() else f"{disk}{n}"


def render_media_files(ctx: HostContext) -> dict[str, str]:
    """Files for the initrd overlay, by path inside the initrd."""
    data = {"h": ctx, "raid_members": "#".join(partition(d, 2) for d in ctx.disks)}
    if ctx.job_type == "unprovision":
        return {
            "preseed.cfg": _ENV.get_template("wipe.cfg.j2").render(**data),
            "karios/cb.sh": _ENV.get_template("cb.sh.j2").render(**data),
            "karios/wipe.sh": _ENV.get_template("wipe.sh.j2").render(**data),
        }
    return {
        "preseed.cfg": _ENV.get_template("preseed.cfg.j2").render(**data),
        "karios/cb.sh": _ENV.get_template("cb.sh.j2").render(**data),
        "karios/karios-firstboot.sh": _ENV.get_template("firstboot.sh.j2").render(**data),
        "karios/karios-firstboot.service": _ENV.get_template("firstboot.service.j2").render(**data),
    }


def render_boot_configs(*, label: str, kernel_args: list[str]) -> dict[str, str]:
    """isolinux (BIOS) and GRUB (UEFI) menus of the ISO; both boot the preseeded installer."""
    data = {"label": label, "args": " ".join(["auto=true", "priority=critical", *kernel_args])}
    return {
        "isolinux/isolinux.cfg": _ENV.get_template("isolinux.cfg.j2").render(**data),
        "boot/grub/grub.cfg": _ENV.get_template("grub.cfg.j2").render(**data),
    }
