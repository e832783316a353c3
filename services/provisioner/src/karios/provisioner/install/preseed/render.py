"""Per-host installer configuration: validation, RAID mapping and Jinja2 rendering (pure).

``render_media_files(ctx)`` returns the files that go into the initrd (``preseed.cfg`` plus the
callback and first-boot scripts); nothing here touches the disk or the network.
"""

from __future__ import annotations

import re
from typing import Any

from passlib.hash import sha512_crypt

from karios.common.errors import ValidationFailed
from karios.common.provisioning import gpu_kernel_args, normalize_disk
from karios.provisioner.install import INSTALL_STAGES, HostContext  # HostContext: kept importable from here
from karios.provisioner.install.firstboot import firstboot_script, firstboot_unit
from karios.provisioner.templating import package_templates

__all__ = ["HostContext", "gpu_kernel_args", "normalize_disk", "render_media_files"]

_ENV = package_templates("karios.provisioner.install.preseed")

_SERIAL = re.compile(r"^ttyS(?P<unit>[0-9]{1,2})(?:,(?P<speed>[0-9]{3,7})(?:[noe][5-8]?)?)?$")
_LINE_SAFE = re.compile(r"^[^\x00-\x1f\x7f]*$")
# Seconds a callback is retried before the installer gives it up (and logs that it did).
CALLBACK_RETRY_FOR = 300
# Path in the initrd of the file /sbin/debian-installer sources before starting debconf.
DEBCONF_DEBUG_HOOK = "lib/debian-installer.d/S69karios-debconf-debug"


def hash_password(password: str, *, salt: str | None = None) -> str:
    """SHA-512 crypt, the form ``passwd/user-password-crypted`` takes."""
    return sha512_crypt.using(rounds=5000, **({"salt": salt} if salt else {})).hash(password)


def partition(disk: str, n: int) -> str:
    """``/dev/sda`` 2 → ``/dev/sda2``; ``/dev/nvme0n1`` 2 → ``/dev/nvme0n1p2`` (names ending in a digit)."""
    return f"{disk}p{n}" if disk[-1:].isdigit() else f"{disk}{n}"


def serial_port(console: str) -> tuple[int, int] | None:
    """``ttyS1,115200n8`` → (1, 115200); ``""`` → None (no serial console)."""
    if not console:
        return None
    m = _SERIAL.match(console)
    if not m:
        raise ValidationFailed(
            f"serial_console: {console!r} is not like ttyS0,115200n8", field="serial_console"
        )
    return int(m["unit"]), int(m["speed"] or 115200)


def nameservers_of(ctx: HostContext) -> str:
    """Name servers for ``netcfg/get_nameservers``: the context's list, else the static ones."""
    ns: Any = ctx.nameservers or (ctx.static or {}).get("nameservers") or []
    return " ".join(ns.replace(",", " ").split() if isinstance(ns, str) else [str(x) for x in ns])


def _check_lines(ctx: HostContext) -> None:
    """Values written into preseed lines must not carry control characters (a newline would add
    an answer of its own)."""
    fields = ("hostname", "nic", "mirror_host", "mirror_dir", "mirror_proxy", "security_host")
    values = {f: str(getattr(ctx, f)) for f in fields}
    values.update({"nameservers": nameservers_of(ctx), "security_dir": ctx.security_dir})
    values.update({f"static.{k}": str(v) for k, v in (ctx.static or {}).items()})
    values.update({"kernel_args": " ".join(ctx.kernel_args)})
    for name, value in values.items():
        if not _LINE_SAFE.match(value):
            raise ValidationFailed(f"{name}: control characters are not allowed", field=name)


def _template_data(ctx: HostContext) -> dict[str, Any]:
    _check_lines(ctx)
    port = serial_port(ctx.serial_console)
    console = ["console=tty0", f"console={ctx.serial_console}"] if port else []
    services = ([] if not ctx.security_host else ["security"]) + (["updates"] if ctx.updates else [])
    disks = [normalize_disk(d) for d in ctx.disks]
    return {
        "h": ctx,
        "disks": disks,
        "raid_members": "#".join(partition(d, 2) for d in disks),
        "nameservers": nameservers_of(ctx),
        "services": ", ".join(services),
        "kernel_opts": " ".join([*console, *ctx.kernel_args]),
        "serial_unit": port[0] if port else None,
        "serial_speed": port[1] if port else None,
        "stages": INSTALL_STAGES,
        "retry_for": CALLBACK_RETRY_FOR,
    }


def render_media_files(ctx: HostContext) -> dict[str, str]:
    """Files for the initrd overlay, by path inside the initrd."""
    data = _template_data(ctx)
    if ctx.job_type == "unprovision":
        return {
            "preseed.cfg": _ENV.get_template("wipe.cfg.j2").render(**data),
            "karios/cb.sh": _ENV.get_template("cb.sh.j2").render(**data),
            "karios/wipe.sh": _ENV.get_template("wipe.sh.j2").render(**data),
        }
    return {
        "preseed.cfg": _ENV.get_template("preseed.cfg.j2").render(**data),
        "karios/cb.sh": _ENV.get_template("cb.sh.j2").render(**data),
        "karios/reporter.sh": _ENV.get_template("reporter.sh.j2").render(**data),
        DEBCONF_DEBUG_HOOK: _ENV.get_template("debconf-debug.sh.j2").render(**data),
        "karios/karios-firstboot.sh": firstboot_script(ctx),
        "karios/karios-firstboot.service": firstboot_unit(ctx),
    }


def render_boot_configs(*, label: str, kernel_args: list[str]) -> dict[str, str]:
    """isolinux (BIOS) and GRUB (UEFI) menus of the ISO; both boot the preseeded installer."""
    data = {"label": label, "args": " ".join(["auto=true", "priority=critical", *kernel_args])}
    return {
        "isolinux/isolinux.cfg": _ENV.get_template("isolinux.cfg.j2").render(**data),
        "boot/grub/grub.cfg": _ENV.get_template("grub.cfg.j2").render(**data),
    }
