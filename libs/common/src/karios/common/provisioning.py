"""Provisioning rules, defined once: request validation, job states, callback bounds (pure).

The gateway calls :func:`validate_provision` / :func:`validate_unprovision` before it answers 202
and sends the *normalised* spec; the provisioner trusts it (it never re-checks a name). Every
failure is :class:`ValidationFailed` naming the request field (the gateway answers 422).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from karios.common.contracts.images import IMAGE_NAME_PATTERN, SEED_MIB, SEED_NEEDS_BYTES, ImageView
from karios.common.contracts.provision import ProvisionSpec, check_debian_version, check_pool, debian_suites
from karios.common.errors import Conflict, ValidationFailed

# BMC drivers the provisioner has (karios.provisioner.drivers.DRIVERS has exactly these keys).
VENDORS: tuple[str, ...] = ("cisco", "dell", "generic", "hp", "hpe", "lenovo", "supermicro")
INSTALL_METHODS: tuple[str, ...] = ("image", "preseed")

# Job states (the provisioner's state machine checks it has exactly these terminal states).
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

# Installer callbacks: what the server keeps of a report.
MAX_MESSAGE = 1024  # bytes of an installer message
MAX_LOG_LINES = 50
MAX_LOG_LINE = 300  # characters per log line

_HOSTNAME = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_DISK = re.compile(r"^[A-Za-z0-9/_.:-]{1,200}$")
_NIC = re.compile(r"^[A-Za-z0-9_.:-]{1,32}$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_MIRROR = re.compile(r"^[A-Za-z0-9.-]{1,253}(:\d{1,5})?$")
_SSH_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [\x20-\x7e]{0,200})?$"
)
_PCI_ID = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$")


def normalize_disk(disk: str) -> str:
    """``sda`` → ``/dev/sda``; 422 naming ``selected_disks`` for anything that is not a disk name."""
    d = disk.strip()
    if not _DISK.match(d) or ".." in d:
        raise ValidationFailed(f"selected_disks: {disk!r} is not a disk name", field="selected_disks")
    return d if d.startswith("/dev/") else f"/dev/{d}"


def check_disks_known(selected: list[str], known: list[str]) -> None:
    """422 naming ``selected_disks`` and the unknown names when the inventory lists the server's
    disks (``known``) and a selected disk is not among them; no disks known → nothing to check."""
    if not known:
        return
    have = {d.removeprefix("/dev/") for d in known}
    unknown = [d.removeprefix("/dev/") for d in selected if d.removeprefix("/dev/") not in have]
    if unknown:
        raise ValidationFailed(
            f"selected_disks: {', '.join(unknown)} not among the server's disks in the inventory "
            f"({', '.join(sorted(have))})",
            field="selected_disks",
            details={"unknown": unknown, "inventory": sorted(have)},
        )


# -- disk size: the image against the selected disks (the gateway's check before the 202; the
# live environment's install.sh applies the same numbers to the disks it finds) ------------------

MIB = 1 << 20
GIB = 1 << 30
#: What each selected disk gives up before the root: the GPT (both copies), the 1 MiB BIOS boot
#: partition and the 256 MiB EFI system partition of the image install's layout.
DISK_OVERHEAD = 258 * MIB
#: The margin over the image's installed size: +25 % (ext4's inode tables and journal, logs,
#: what the first boot writes) and 256 MiB.
MARGIN_PERCENT = 25
MARGIN_BYTES = 256 * MIB
#: How each pool type turns the selected disks into room for the root (md RAID; ``n`` disks).
POOL_RULES = {
    "single": "the first disk",
    "mirror": "the smallest disk",
    "stripe": "the sum of the disks",
    "raidz1": "(n-1) x the smallest disk",
    "raidz2": "(n-2) x the smallest disk",
}


#: How the image method builds a pool (``pool_backend``). ``zfs``: an OpenZFS pool, the root a
#: dataset of it, ``/boot`` ext4 on a partition of every disk (md RAID1 across them when there are
#: several: GRUB reads it under BIOS and UEFI without a ZFS driver). ``md``: Linux md RAID
#: (``single``: a plain ext4 partition).
POOL_BACKENDS = ("zfs", "md")
#: pool_type → its ZFS vdev keyword ("": the disks side by side, as ``single`` and ``stripe``).
ZFS_VDEVS = {"single": "", "stripe": "", "mirror": "mirror", "raidz1": "raidz1", "raidz2": "raidz2"}
#: The ``/boot`` partition a ZFS pool's disks each give (kernels and initramfs images).
ZFS_BOOT_MIB = 512
ZFS_DISK_OVERHEAD = DISK_OVERHEAD + ZFS_BOOT_MIB * MIB


def resolve_pool_backend(
    requested: str | None, pool_type: str | None, method: str | None, *, catalog_archive: bool = False
) -> str:
    """The pool backend a job uses: the request's, else ``zfs`` for a pool of several disks
    (the seed's ZFS vocabulary) on Karios's own image, ``md`` otherwise. ``zfs`` is refused
    (422 ``pool_backend``) where nothing could build or boot it: the Debian installer, and a
    catalog root archive (its initramfs is not known to import a pool)."""
    name = (requested or "").lower()
    if name and name not in POOL_BACKENDS:
        raise ValidationFailed(
            f"pool_backend: {requested!r} is not one of {', '.join(POOL_BACKENDS)}", field="pool_backend"
        )
    if name == "zfs" and method == "preseed":
        raise ValidationFailed(
            "pool_backend: zfs is built by the image method (the Debian installer makes md RAID): "
            "leave install_method out or say image, or ask for pool_backend md",
            field="pool_backend",
        )
    if name == "zfs" and catalog_archive:
        raise ValidationFailed(
            "pool_backend: a ZFS root needs an initramfs that imports the pool, which Karios's own "
            "image has; a catalog root archive is installed with pool_backend md",
            field="pool_backend",
        )
    if name:
        return name
    several = (pool_type or "single").lower() != "single"
    return "zfs" if several and method in (None, "image") and not catalog_archive else "md"


def disk_overhead(backend: str) -> int:
    """What each selected disk gives up before the root with this backend."""
    return ZFS_DISK_OVERHEAD if backend == "zfs" else DISK_OVERHEAD


def root_needs(installed_bytes: int) -> int:
    """Bytes the root filesystem needs for an image of ``installed_bytes`` (with the margin)."""
    return installed_bytes + installed_bytes * MARGIN_PERCENT // 100 + MARGIN_BYTES


def pool_capacity(pool_type: str | None, disk_bytes: list[int], overhead: int = DISK_OVERHEAD) -> int:
    """Room for the root that ``disk_bytes`` (in order) give as ``pool_type``: each disk less
    ``overhead`` (:func:`disk_overhead`), then mirror → smallest, stripe → sum, raidz1 → (n-1) ×
    smallest, raidz2 → (n-2) × smallest, single → the first disk (md RAID and ZFS alike)."""
    usable = [max(0, b - overhead) for b in disk_bytes]
    if not usable:
        return 0
    name = (pool_type or "single").lower()
    if name == "stripe":
        return sum(usable)
    if name in ("mirror", "raidz1", "raidz2"):
        parity = {"mirror": len(usable) - 1, "raidz1": 1, "raidz2": 2}[name]
        return max(0, len(usable) - parity) * min(usable)
    return usable[0]


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def check_catalog_image(
    spec: ProvisionSpec, view: ImageView | None, disk_bytes: dict[str, int | None]
) -> None:
    """422 naming the field when the catalog image ``spec.image`` cannot be installed as asked:
    ``image`` unknown (``view`` None) or not ready; a whole-disk image with a pool of several disks
    (``pool_type``: it is written to one disk as it is); a selected disk smaller than the image's
    disk (``selected_disks``; ``disk_bytes``: name without ``/dev/`` → bytes or None, unknown: not
    checked here — the live environment checks it before writing)."""
    if view is None:
        raise ValidationFailed(
            f"image: no image named {spec.image!r} in the catalog (GET /controlnode/images)", field="image"
        )
    if view.state != "ready":
        why = f": {view.message}" if view.message else ""
        raise ValidationFailed(f"image: {view.name} is {view.state}, not ready{why}", field="image")
    if not view.whole_disk:
        resolve_pool_backend(spec.pool_backend, spec.pool_type, "image", catalog_archive=True)
        return
    if (spec.pool_backend or "").lower() == "zfs":
        raise ValidationFailed(
            f"pool_backend: {view.name} is a whole-disk image, written as it is to one disk (no pool)",
            field="pool_backend",
        )
    if gpu_kernel_args(spec.gpu_passthrough):
        raise ValidationFailed(
            f"gpu_passthrough: {view.name} is a whole-disk image with its own boot loader; Karios does not "
            "change its kernel arguments (set them in the image, or install a root archive)",
            field="gpu_passthrough",
        )
    if (spec.pool_type or "single") != "single" or len(spec.selected_disks) > 1:
        raise ValidationFailed(
            f"pool_type: {view.name} is a whole-disk image, written as it is to one disk: pool_type single "
            f"with at most one selected disk (got {spec.pool_type} on {len(spec.selected_disks)})",
            field="pool_type",
        )
    if not spec.selected_disks or not view.disk_bytes:
        return
    name = spec.selected_disks[0].removeprefix("/dev/")
    size = disk_bytes.get(name)
    if size and size < view.disk_bytes + SEED_NEEDS_BYTES:
        raise ValidationFailed(
            f"selected_disks: disk {name} is {gib(size)}; image {view.name} is a {gib(view.disk_bytes)} disk "
            f"(and {SEED_MIB} MiB for its cloud-init seed)",
            field="selected_disks",
            details={
                "disks": {name: size},
                "needed_bytes": view.disk_bytes + SEED_NEEDS_BYTES,
                "image": view.name,
            },
        )


def check_disk_space(
    pool_type: str | None,
    selected: list[str],
    disk_bytes: dict[str, int | None],
    installed_bytes: int | None,
    backend: str = "md",
) -> None:
    """422 naming ``selected_disks`` with the needed and available sizes when the image
    (``installed_bytes``, plus the margin) does not fit the pool the selected disks make.
    Nothing to check — accepted — when the image's size or any selected disk's size is unknown
    (``disk_bytes``: name without ``/dev/`` → bytes or None)."""
    names = [d.removeprefix("/dev/") for d in selected]
    sizes = [disk_bytes.get(n) for n in names]
    if not installed_bytes or not names or any(s is None or s <= 0 for s in sizes):
        return
    known = [int(s) for s in sizes if s is not None]
    name = (pool_type or "single").lower()
    overhead = disk_overhead(backend)
    need, have = root_needs(installed_bytes), pool_capacity(name, known, overhead)
    if have >= need:
        return
    if name == "single":
        why = (
            f"disk {names[0]} is {gib(known[0])}; the image needs {gib(need + overhead)} "
            f"({gib(installed_bytes)} installed, with margin and boot partitions)"
        )
    else:
        as_what = "a ZFS " + ZFS_VDEVS[name] if backend == "zfs" and ZFS_VDEVS[name] else name
        why = (
            f"{as_what} of {', '.join(names)} gives {gib(have)} for the root ({POOL_RULES[name]}, each "
            f"disk less {overhead // MIB} MiB of boot partitions); the image needs {gib(need)} "
            f"({gib(installed_bytes)} installed, with margin)"
        )
    raise ValidationFailed(
        f"selected_disks: {why}",
        field="selected_disks",
        details={
            "pool_type": name,
            "disks": dict(zip(names, known, strict=True)),
            "needed_bytes": need,
            "available_bytes": have,
            "installed_bytes": installed_bytes,
            "disk_overhead_bytes": overhead,
            "pool_backend": backend,
        },
    )


def check_vendor(vendor: str, field: str = "vendor") -> str:
    v = (vendor or "generic").strip().lower()
    if v not in VENDORS:
        raise ValidationFailed(f"{field}: {vendor!r} is not one of {', '.join(VENDORS)}", field=field)
    return v


def _check_url(value: str, field: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationFailed(f"{field}: expected an http(s):// URL, got {value!r}", field=field)
    return value


def _check_mirror(value: str) -> str:
    """``host[:port][/dir]`` or an http URL → ``host[:port]/dir`` (the installer's mirror form)."""
    v = value.strip()
    if v.startswith(("http://", "https://")):
        p = urlsplit(_check_url(v, "mirror"))
        v = f"{p.netloc}{p.path}"
    host, _, path = v.partition("/")
    if not _MIRROR.match(host) or ".." in path or any(c in path for c in " '\"\\$`"):
        raise ValidationFailed(f"mirror: {value!r} is not host[:port]/directory", field="mirror")
    return f"{host}/{path.strip('/')}" if path.strip("/") else f"{host}/debian"


def gpu_kernel_args(gpu: Any) -> list[str]:
    """``gpu_passthrough`` → kernel arguments of the installed system (IOMMU on, vfio-pci ids).

    Accepted forms: true/false, a list of ``vendor:device`` ids, or an object with ``enabled``
    (default true), ``device_ids``/``ids`` and optional ``iommu`` ("intel"/"amd"/"both").
    """
    if gpu in (None, False, "", {}, []):
        return []
    ids: list[str] = []
    iommu = "both"
    if isinstance(gpu, list):
        ids = [str(x) for x in gpu]
    elif isinstance(gpu, dict):
        if gpu.get("enabled") is False:
            return []
        ids = [str(x) for x in (gpu.get("device_ids") or gpu.get("ids") or [])]
        iommu = str(gpu.get("iommu") or "both")
    elif gpu is not True:
        raise ValidationFailed(
            "gpu_passthrough: expected true, a list of ids or an object", field="gpu_passthrough"
        )
    bad = next((i for i in ids if not _PCI_ID.match(i)), None)
    if bad is not None:
        raise ValidationFailed(
            f"gpu_passthrough: {bad!r} is not a vendor:device PCI id", field="gpu_passthrough"
        )
    if iommu not in ("intel", "amd", "both"):
        raise ValidationFailed("gpu_passthrough: iommu must be intel, amd or both", field="gpu_passthrough")
    args = [a for a, on in (("intel_iommu=on", iommu != "amd"), ("amd_iommu=on", iommu != "intel")) if on]
    args.append("iommu=pt")
    if ids:
        args.append("vfio-pci.ids=" + ",".join(i.lower() for i in ids))
    return args


def check_ssh_keys(keys: list[str]) -> list[str]:
    """OpenSSH public keys, one per item (no options, no newlines), at most 16 of at most 8 KB."""
    if len(keys) > 16:
        raise ValidationFailed("ssh_authorized_keys: at most 16 keys", field="ssh_authorized_keys")
    out = []
    for n, key in enumerate(keys):
        k = key.strip()
        if len(k) > 8192 or not _SSH_KEY.match(k):
            raise ValidationFailed(
                f"ssh_authorized_keys[{n}]: not an OpenSSH public key line (type base64 [comment])",
                field="ssh_authorized_keys",
            )
        out.append(k)
    return out


def validate_provision(spec: ProvisionSpec) -> ProvisionSpec:
    """The normalised spec, or :class:`ValidationFailed` naming the first bad field.

    Checks: vendor (a known driver), hostname, os_username, NIC name, disk names (normalised to
    ``/dev/…``, no duplicates), pool type against the disk count, Debian release (→ its major
    number), arch, install method, mirror, HTTP proxy and SSH public keys.
    """
    vendor = check_vendor(spec.vendor)
    if spec.hostname and not _HOSTNAME.match(spec.hostname):
        raise ValidationFailed("hostname: use lowercase letters, digits and '-' (max 63)", field="hostname")
    if not _USER.match(spec.os_username or ""):
        raise ValidationFailed("os_username: not a valid Linux user name", field="os_username")
    nic = spec.selected_nic
    if nic and nic != "auto" and not _NIC.match(nic):
        raise ValidationFailed("selected_nic: not an interface name", field="selected_nic")
    disks = [normalize_disk(d) for d in spec.selected_disks]
    if len(set(disks)) != len(disks):
        raise ValidationFailed("selected_disks: a disk is listed twice", field="selected_disks")
    pool, _level = check_pool(spec.pool_type, disks)
    suite = check_debian_version(spec.debian_version)
    major = next(k for k, v in debian_suites().items() if v == suite and k.isdigit())
    gpu_kernel_args(spec.gpu_passthrough)
    if spec.arch != "amd64":
        raise ValidationFailed("arch: only amd64 media are built", field="arch")
    if spec.install_method is not None and spec.install_method not in INSTALL_METHODS:
        raise ValidationFailed(
            f"install_method: {spec.install_method!r} is not one of {', '.join(INSTALL_METHODS)}",
            field="install_method",
        )
    method = spec.install_method
    if spec.image:
        if not re.match(IMAGE_NAME_PATTERN, spec.image):
            raise ValidationFailed(
                "image: a catalog image name (lowercase letters, digits, '.', '_', '-'; max 63)",
                field="image",
            )
        if method == "preseed":
            raise ValidationFailed(
                "install_method: a catalog image is written by the image method, not the Debian installer "
                "(leave install_method out or say image)",
                field="install_method",
            )
        method = "image"
    backend = resolve_pool_backend(spec.pool_backend, pool, method) if spec.pool_backend else None
    return spec.model_copy(
        update={
            "install_method": method,
            "pool_backend": backend,
            "vendor": vendor,
            "selected_disks": disks,
            "pool_type": pool,
            "debian_version": major,
            "mirror": _check_mirror(spec.mirror) if spec.mirror else "",
            "http_proxy": _check_url(spec.http_proxy, "http_proxy") if spec.http_proxy else "",
            "ssh_authorized_keys": check_ssh_keys(spec.ssh_authorized_keys),
        }
    )


def validate_unprovision(spec: ProvisionSpec) -> ProvisionSpec:
    """An unprovision names only the BMC and its vendor (the wipe erases every disk)."""
    return spec.model_copy(update={"vendor": check_vendor(spec.vendor)})


def refuse_second_job(bmc_ip: str, running_job_id: str | None) -> None:
    """The one rule "one running job per BMC": 409 naming the running job."""
    if running_job_id:
        raise Conflict(
            f"BMC {bmc_ip} already has running job {running_job_id}; cancel it first",
            details={"job_id": running_job_id},
        )


def bound_message(message: str | None) -> str:
    """An installer message cut to :data:`MAX_MESSAGE` bytes (on a character boundary)."""
    raw = (message or "").strip().encode()[:MAX_MESSAGE]
    return raw.decode(errors="ignore")


def bound_log(lines: list[str] | None) -> list[str]:
    """The last :data:`MAX_LOG_LINES` lines, each cut to :data:`MAX_LOG_LINE` characters."""
    return [str(line).rstrip("\r\n")[:MAX_LOG_LINE] for line in (lines or [])[-MAX_LOG_LINES:]]
