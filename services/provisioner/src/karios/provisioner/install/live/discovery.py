"""The live environment in discovery mode (issue 27 item 3), pure: the overlay a discovery boot
loads after ``live.img``, as the install and wipe media load theirs.

bootapi answers a MAC no host owns (``BOOTAPI_DISCOVERY_ENABLED``) with an iPXE script booting
``<images>/<suite>/vmlinuz`` + ``live.img`` and this overlay, fetched from the provisioner at
``GET /discovery/<token>/overlay.img``. The overlay holds ``/karios/run.sh`` (``discover.sh.j2``:
DMI, disks, NICs, PCI read in band and posted to the gateway with the token) and
``/karios/net.env`` (DHCP on the NIC that PXE-booted); ``/init`` brings the network up, runs the
script and powers the machine off.
"""

from __future__ import annotations

from karios.common.netaddr import normalize_mac
from karios.provisioner.install.live import net_env, script_environment
from karios.provisioner.media.cpio import gzip_overlay

_SCRIPTS = script_environment("karios.provisioner.install.live")
REPORT_PATH = "/discovery/report"  # under the gateway's /controlnode


def report_url(callback_base: str) -> str:
    """Where the script posts its report: ``<gateway>/controlnode/discovery/report``."""
    return f"{callback_base.rstrip('/')}{REPORT_PATH}"


def render_discovery_script(report_url: str, token: str, boot_mac: str) -> str:
    """``/karios/run.sh`` of a discovery boot."""
    return _SCRIPTS.get_template("discover.sh.j2").render(
        report_url=report_url, token=token, boot_mac=normalize_mac(boot_mac)
    )


def discovery_overlay(
    report_url: str, token: str, boot_mac: str, nameservers: list[str] | None = None
) -> dict[str, str]:
    """The overlay's files: path inside the initramfs → text (``.sh`` made executable)."""
    return {
        "karios/run.sh": render_discovery_script(report_url, token, boot_mac),
        "karios/net.env": net_env(normalize_mac(boot_mac), None, list(nameservers or [])),
    }


def discovery_overlay_image(
    report_url: str, token: str, boot_mac: str, nameservers: list[str] | None = None
) -> bytes:
    """The overlay as the second initrd: a gzip'd newc archive the kernel unpacks over live.img."""
    return gzip_overlay(discovery_overlay(report_url, token, boot_mac, nameservers))
