"""The image-based install: the live environment writes a prebuilt Debian root filesystem.

The method Ironic's agent and Tinkerbell's image2disk use: no installer, no udebs. The live
environment (``install.live``) boots from the per-host medium, runs ``install.sh`` (rendered
here from ``templates/install.sh.j2``) which partitions the selected disks per pool, streams
``root.tar.zst`` from ``ctx.image_url`` onto them, configures the host, installs GRUB for BIOS
and UEFI, reports every stage of :data:`INSTALL_STAGES` and reboots into the installed system,
whose first boot calls back (:mod:`karios.provisioner.install.firstboot`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from karios.common.contracts.images import SEED_NEEDS_BYTES
from karios.common.errors import PermanentFailure
from karios.common.provisioning import ZFS_BOOT_MIB, disk_overhead, root_needs
from karios.provisioner.install import INSTALL_STAGES, HostContext, Medium, Stage, ca_overlay
from karios.provisioner.install.firstboot import firstboot_script, firstboot_unit
from karios.provisioner.install.image.cloudinit import LIVE_NIC_MAC, SEED_MIB, seed_files
from karios.provisioner.install.image.manifest import root_manifest
from karios.provisioner.install.live import (
    LiveMethod,
    as_list,
    dev_paths,
    net_env,
    script_environment,
)

_SCRIPTS = script_environment("karios.provisioner.install.image")
LIVE_KERNEL_ARGS = ["rdinit=/init", "panic=30"]


def serial_grub(serial_console: str) -> tuple[str, str]:
    """``ttyS1,115200n8`` → (GRUB serial unit "1", speed "115200")."""
    dev, _, opts = serial_console.partition(",")
    unit = dev.removeprefix("ttyS") if dev.startswith("ttyS") and dev[4:].isdigit() else "0"
    speed = "".join(c for c in opts.split("n")[0] if c.isdigit()) or "115200"
    return unit, speed


def installed_cmdline(ctx: HostContext) -> str:
    """The installed system's kernel line: consoles (VGA + serial) and the requested arguments."""
    consoles = ["console=tty0", f"console={ctx.serial_console}"] if ctx.serial_console else []
    return " ".join([*consoles, *ctx.kernel_args])


def network_unit(ctx: HostContext) -> str:
    """systemd-networkd unit of the installed system: DHCP, or the static address."""
    match = f"MACAddress={ctx.nic_mac.lower()}" if ctx.nic_mac else "Name=en* eth*"
    lines = ["[Match]", match, "", "[Network]"]
    st = ctx.static or {}
    if st.get("address"):
        iface = ipaddress.ip_interface(f"{st['address']}/{st.get('netmask') or st.get('prefix') or 24}")
        lines.append(f"Address={iface.with_prefixlen}")
        if st.get("gateway"):
            lines.append(f"Gateway={st['gateway']}")
    else:
        lines.append("DHCP=ipv4")
    for ns in ctx.nameservers or as_list(st.get("nameservers")):
        lines.append(f"DNS={ns}")
    return "\n".join(lines) + "\n"


def pool_words(ctx: HostContext) -> str:
    """The pool as a failure message names it: "a ZFS raidz1", "RAID5", "a ZFS stripe"."""
    if ctx.pool_backend == "zfs":
        return f"a ZFS {ctx.zfs_vdev or ('stripe' if len(ctx.disks) > 1 else 'pool')}"
    return f"RAID{ctx.md_level}" if ctx.md_level is not None else "one disk"


def stage_percents(stages: tuple[Stage, ...]) -> dict[str, int]:
    return {s.key: s.percent for s in stages}


class ImageMethod(LiveMethod):
    """:class:`~karios.provisioner.install.InstallMethod` ``image``."""

    name = "image"
    stages = INSTALL_STAGES

    def prepare(self, major: str, suite: str) -> None:
        self.images.build(suite)
        self.installed_bytes(suite)  # the manifest, measured once after a build

    def image_path(self, suite: str) -> str:
        """The root archive's path under ``images_dir`` (what ``GET /images/{path}`` serves)."""
        return f"{suite}/root.tar.zst"

    def installed_bytes(self, suite: str) -> int | None:
        """What the suite's root archive takes once installed (its manifest), None if not built."""
        manifest = root_manifest(self.images.images_dir / suite)
        return int(manifest["installed_bytes"]) if manifest else None

    def render_install_script(self, ctx: HostContext, installed_bytes: int | None = None) -> str:
        """``install.sh`` for one host (pure). ``installed_bytes``: the image's installed size
        (its manifest): the script checks the disks against it before streaming (None: no check)."""
        if not ctx.image_url:
            raise PermanentFailure("image_url: the image method needs the root filesystem URL")
        unit, speed = serial_grub(ctx.serial_console or "ttyS0,115200n8")
        data = {
            **vars(ctx),
            "md_level": "" if ctx.md_level is None else str(ctx.md_level),
            "disks": dev_paths(ctx.disks),
            "nameservers": ctx.nameservers or as_list((ctx.static or {}).get("nameservers")),
        }
        return _SCRIPTS.get_template("install.sh.j2").render(
            **data,
            stages=stage_percents(self.stages),
            cmdline=installed_cmdline(ctx),
            serial_unit=unit,
            serial_speed=speed,
            network_unit=network_unit(ctx),
            installed_bytes=installed_bytes or "",
            root_needs=root_needs(installed_bytes) if installed_bytes else "",
            disk_overhead=disk_overhead(ctx.pool_backend),
            zfs_boot_mib=ZFS_BOOT_MIB,
            pool_words=pool_words(ctx),
        )

    def render_disk_script(self, ctx: HostContext) -> str:
        """``install.sh`` of a whole-disk catalog image for one host (pure)."""
        if not (ctx.image_url and ctx.image_sha256 and ctx.image_disk_bytes):
            raise PermanentFailure("image: a whole-disk image needs its URL, SHA-256 and disk size")
        return _SCRIPTS.get_template("install_disk.sh.j2").render(
            **{**vars(ctx), "disks": dev_paths(ctx.disks)},
            stages=stage_percents(self.stages),
            seed_mib=SEED_MIB,
            seed_needs=SEED_NEEDS_BYTES,
            live_nic_mac=LIVE_NIC_MAC,
        )

    def medium(self, ctx: HostContext) -> Medium:
        if self.settings.url:  # targets reach the provisioner at another address than BMCs
            path = ctx.image_path or self.image_path(ctx.suite)
            ctx = replace(ctx, image_url=f"{self.settings.url.rstrip('/')}/images/{path}")
        art = self.images.artifacts(ctx.suite)
        if not self.images.ready(ctx.suite):
            raise PermanentFailure(f"image: artifacts for {ctx.suite} not built under {art.kernel.parent}")
        net = {
            "karios/net.env": net_env(ctx.nic_mac, ctx.static, ctx.nameservers),
            **ca_overlay(ctx.ca_bundle),
        }
        if ctx.whole_disk:  # a catalog disk image: its own boot loader, cloud-init's first boot
            seed = {f"karios/cidata/{name}": text for name, text in seed_files(ctx).items()}
            return Medium(
                kernel=art.kernel,
                initrd=art.initrd,
                overlay={"karios/run.sh": self.render_disk_script(ctx), **net, **seed},
                kernel_args=list(LIVE_KERNEL_ARGS),
                label="Karios image install",
            )
        # Karios's own root archive of the suite (its manifest: the disk-size check), or a
        # catalog root archive (size unknown: not checked).
        installed = None if ctx.image_name else self.installed_bytes(ctx.suite)
        overlay = {
            "karios/run.sh": self.render_install_script(ctx, installed),
            "karios/firstboot.sh": firstboot_script(ctx),
            "karios/firstboot.service": firstboot_unit(ctx),
            **net,
        }
        return Medium(
            kernel=art.kernel,
            initrd=art.initrd,
            overlay=overlay,
            kernel_args=list(LIVE_KERNEL_ARGS),
            label="Karios image install",
        )
