"""Install methods: one package per way of putting an OS on (or wiping) a server.

Each method (``preseed``: the Debian installer; ``image``: a live environment that writes a
prebuilt root filesystem; ``wipe``: the same live environment erasing every disk) provides

- the base artifacts it boots (kernel + initrd), prepared once per release and cached
  (:meth:`InstallMethod.prepare`, blocking, may take minutes the first time);
- the per-host files loaded after that initrd and the kernel arguments (:meth:`InstallMethod.medium`,
  pure given prepared artifacts) — the job service hands the :class:`Medium` to the ISO writer;
- the stages its scripts report, in order (:attr:`InstallMethod.stages`).

The job service calls only this interface; it never knows which method it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Stage:
    """One step the target reports: ``key`` is the ``step`` field of ``POST /job/{id}/step``."""

    key: str
    label: str
    percent: int


# The stages every OS install reports, in order (the image method reports "mirror" when its root
# filesystem source answers and "packages" while it configures the system). Percentages sit
# between "Booting" (35) and "First boot" (90) of the job state machine.
INSTALL_STAGES: tuple[Stage, ...] = (
    Stage("network", "Network configured", 52),
    Stage("mirror", "Install source reached", 56),
    Stage("partitioning", "Partitioning disks", 60),
    Stage("base-system", "Installing the base system", 68),
    Stage("packages", "Installing packages", 76),
    Stage("bootloader", "Installing the bootloader", 84),
    Stage("late-command", "Finishing the installation", 88),
)

# A wipe reports "network", then one "wipe:<disk>" step per disk, then "wiped".
WIPE_STAGES: tuple[Stage, ...] = (
    Stage("network", "Network configured", 50),
    Stage("wipe", "Wiping disks", 60),
    Stage("wiped", "Disks wiped", 88),
)


@dataclass
class HostContext:
    """Everything a method needs to render one host's medium (already validated)."""

    job_id: str
    token: str
    callback_base: str  # e.g. http://10.0.0.1:8080/controlnode
    hostname: str
    bmc_ip: str
    os_username: str
    password_hash: str
    root_password_hash: str = ""
    ssh_authorized_keys: list[str] = field(default_factory=list)
    disks: list[str] = field(default_factory=list)
    md_level: int | None = None  # md RAID level; with pool_backend zfs: the same capacity rule
    pool_backend: str = "md"  # zfs | md (karios.common.provisioning.resolve_pool_backend)
    zfs_vdev: str = ""  # mirror | raidz1 | raidz2 | "" (single, stripe)
    nic: str = "auto"
    nic_mac: str = ""
    static: dict[str, Any] | None = None  # address, netmask, gateway, nameservers
    nameservers: list[str] = field(default_factory=list)  # also used with DHCP when set
    kernel_args: list[str] = field(default_factory=list)  # e.g. GPU passthrough (installed system)
    serial_console: str = "ttyS0,115200n8"  # per vendor (SOL is often ttyS1); "" = none
    suite: str = "bookworm"
    major: str = "12"
    mirror_host: str = "deb.debian.org"
    mirror_dir: str = "/debian"
    mirror_proxy: str = ""  # HTTP proxy for the installer's downloads ("" = none)
    security_host: str = ""  # security repository host ("" = off)
    security_dir: str = "/debian-security"
    updates: bool = False  # <suite>-updates
    image_url: str = ""  # image method: URL of the root filesystem archive (or of a catalog image)
    # A catalog image (issue 25; "" = Karios's own root archive of `suite`): its path under
    # /images, what that serves (tar.zst: a root archive; raw, raw.zst|xz|gz: a whole disk), the
    # served file's SHA-256 (the live environment verifies it while writing) and, for a whole
    # disk, its size (the target disk must hold it).
    image_name: str = ""
    image_path: str = ""
    image_format: str = "tar.zst"
    image_sha256: str = ""
    image_disk_bytes: int = 0
    job_type: str = "provision"  # provision | unprovision
    # PEM CA certificates the live environment trusts besides its own store (the deployment's
    # private CA: /images and callbacks over HTTPS); "" = none. The image and wipe media carry it.
    ca_bundle: str = ""

    @property
    def whole_disk(self) -> bool:
        """A whole-disk image (partition table, boot loader, cloud-init) rather than a root archive."""
        return self.image_format.startswith("raw")


@dataclass
class Medium:
    """What the ISO writer needs: a kernel, a base initrd, the per-host overlay and kernel args.

    Only ``overlay`` may differ from host to host: kernel, initrd, kernel line and label make the
    base ISO shared by every host of a release (a per-host value there costs a base ISO per host).
    """

    kernel: Path
    initrd: Path  # the base initrd; the overlay is loaded after it as a second initrd
    overlay: dict[str, str]  # path inside the initrd → text (scripts are made executable)
    kernel_args: list[str]  # the boot entry's kernel line (the writer adds console= itself)
    label: str  # the boot menu's entry (no host name: see above)


class InstallMethod(Protocol):
    name: str  # "preseed" | "image" | "wipe"
    stages: tuple[Stage, ...]

    def tools_missing(self) -> list[str]:
        """Host tools or files this method needs that are not installed (empty when ready)."""
        ...

    def prepare(self, major: str, suite: str) -> None:
        """Prepare and cache the base artifacts of one release (blocking; once per release)."""
        ...

    def medium(self, ctx: HostContext) -> Medium:
        """The per-host medium (pure once prepared)."""
        ...


#: Where a live medium's overlay puts the deployment's CA certificates (``callbacks.sh.j2`` adds
#: them to the live environment's trust store before the first request).
CA_PATH = "karios/ca.pem"


def ca_overlay(ca_bundle: str) -> dict[str, str]:
    """The overlay entry carrying ``ca_bundle`` (PEM), or none."""
    return {CA_PATH: ca_bundle} if ca_bundle else {}


def stage_of(stages: tuple[Stage, ...], key: str) -> Stage | None:
    """The stage a reported step belongs to (``wipe:/dev/vda`` → ``wipe``)."""
    base = key.split(":", 1)[0]
    return next((s for s in stages if s.key == base), None)
