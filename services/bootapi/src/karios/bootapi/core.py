"""The rules of bootapi, with no I/O: identify the caller, pick the script, render it.

Everything here takes plain values (a :class:`Host` or ``None``, a :class:`TemplateSet`)
and returns text or a decision, so the handler tests can compare exact output.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote

from karios.common.contracts.inventory import Host
from karios.common.discovery_token import KERNEL_ARG as DISCOVERY_KERNEL_ARG
from karios.common.netaddr import mac_or_none
from karios.common.oscatalog import CatalogEntry, NoCatalogEntry, TemplateSet

_HOSTNAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})$")
_BARE_HEX = re.compile(r"^[0-9A-Fa-f]{12}$")


class FallbackReason(enum.StrEnum):
    UNKNOWN = "unknown"  # no host owns the MAC
    BAD_MAC = "bad_mac"  # the path is not a MAC at all
    ERROR = "error"  # the inventory failed or did not answer
    GATED = "gated"  # known host with pxe_enabled=false
    NO_CATALOG = "no_catalog"  # known host whose platform/role no catalog entry serves
    RENDER = "render"  # the template failed for this host


# -- identifying the caller ---------------------------------------------------------


def strip_suffix(value: str, suffixes: tuple[str, ...]) -> str:
    for s in suffixes:
        if value.lower().endswith(s):
            return value[: -len(s)]
    return value


@lru_cache(maxsize=65536)  # the boot storm's route: the same few MACs, over and over
def parse_ipxe_mac(raw: str | None) -> str | None:
    """The MAC of ``/ipxe/{mac}`` in any notation (``.ipxe`` stripped), or None if it is not one."""
    return mac_or_none(strip_suffix(raw.strip(), (".ipxe",))) if raw else None


@dataclass(frozen=True)
class Ident:
    """``/ks/{ident}`` and ``/provisioned/{ident}``: a MAC (auto-detected) or a device name."""

    mac: str | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        return self.mac or self.name or ""

    @property
    def could_be_name(self) -> bool:
        """Bare 12-hex idents are tried as a MAC first, then as a name."""
        return self.name is not None


def parse_ident(raw: str) -> Ident | None:
    """Parse an ident (``.ks``/``.cfg`` stripped); None when it can be neither a MAC nor a hostname."""
    value = strip_suffix(raw.strip(), (".ks", ".cfg"))
    mac = mac_or_none(value)
    if mac is not None and not _BARE_HEX.match(value):
        return Ident(mac=mac)
    name = value if _HOSTNAME.match(value) else None
    if mac is None and name is None:
        return None
    return Ident(mac=mac, name=name)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token from ``Authorization: Bearer …`` or a bare ``token`` header."""
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    bare = headers.get("token", "").strip()
    return bare or None


def token_matches(presented: str | None, expected: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


# -- choosing ----------------------------------------------------------------------


@dataclass(frozen=True)
class BootDecision:
    """What ``/ipxe`` serves: an installer for ``entry``, or a fallback for ``reason``."""

    entry: CatalogEntry | None = None
    reason: FallbackReason | None = None


def decide_boot(host: Host | None, templates: TemplateSet) -> BootDecision:
    """Unknown → fallback; gated (``pxe_enabled=false``) → fallback; else the catalog entry."""
    if host is None:
        return BootDecision(reason=FallbackReason.UNKNOWN)
    if not host.pxe_enabled:
        return BootDecision(reason=FallbackReason.GATED)
    try:
        return BootDecision(entry=templates.catalog.select(host.platform, host.role))
    except NoCatalogEntry:
        return BootDecision(reason=FallbackReason.NO_CATALOG)


def boot_mac(host: Host) -> str:
    """The MAC an installer should configure: first non-management interface that has one."""
    for iface in [*(i for i in host.interfaces if not i.mgmt_only), *host.interfaces]:
        for m in iface.macs:
            if (mac := mac_or_none(m)) is not None:
                return mac
    return ""


# -- rendering ---------------------------------------------------------------------


def config_url(base_url: str, host: Host) -> str:
    return f"{base_url}/ks/{quote(host.name, safe='')}"


def provisioned_url(base_url: str, host: Host) -> str:
    return f"{base_url}/provisioned/{quote(host.name, safe='')}"


def installer_args(entry: CatalogEntry, config: str) -> list[str]:
    """Catalog arguments plus the one that points the installer at its config."""
    # Anaconda reads inst.ks=; debian-installer reads url= (with auto=true priority=critical in the catalog).
    extra = [f"inst.ks={config}"] if entry.installer == "kickstart" else [f"url={config}"]
    names = [f"initrd={u.rsplit('/', 1)[-1]}" for u in entry.initrd_urls]
    return [*entry.args, *extra, *names]


def render_ipxe_script(
    templates: TemplateSet, host: Host, mac: str, entry: CatalogEntry, base_url: str
) -> str:
    """The installer boot script for ``host`` booting from ``mac``."""
    return templates.render(
        "ipxe/boot.ipxe.j2",
        host=host.model_dump(),
        mac=mac,
        entry=entry,
        vars=entry.vars,
        base_url=base_url,
        kernel_url=entry.kernel_url,
        initrd_urls=entry.initrd_urls,
        args=installer_args(entry, config_url(base_url, host)),
        config_url=config_url(base_url, host),
    )


def render_fallback_script(templates: TemplateSet, fallback: str, mac: str | None) -> str:
    """The ``local`` (sanboot) or ``shell`` script; it never depends on inventory data."""
    return templates.render(f"ipxe/fallback-{fallback}.ipxe.j2", mac=mac or "", base_url="")


# -- discovery (issue 27 item 3) ---------------------------------------------------------------

DISCOVERY_TEMPLATE = "ipxe/discover.ipxe.j2"
#: The live environment's kernel line, as the provisioner's install and wipe media boot it
#: (``install.image.LIVE_KERNEL_ARGS``).
LIVE_KERNEL_ARGS = ("rdinit=/init", "panic=30")


@dataclass(frozen=True)
class DiscoveryBoot:
    """How a MAC no host owns boots when discovery is on: the provisioner's live environment
    (``<images_url>/images/<suite>/vmlinuz`` + ``live.img``) and the discovery overlay for this
    boot's token (``<images_url>/discovery/<token>/overlay.img``)."""

    images_url: str  # the provisioner as PXE targets reach it
    suite: str = "bookworm"
    kernel_args: tuple[str, ...] = ()  # consoles etc., after LIVE_KERNEL_ARGS

    def kernel_url(self) -> str:
        return f"{self.images_url}/images/{quote(self.suite, safe='')}/vmlinuz"

    def initrd_urls(self, token: str) -> list[str]:
        return [
            f"{self.images_url}/images/{quote(self.suite, safe='')}/live.img",
            f"{self.images_url}/discovery/{quote(token, safe='')}/overlay.img",
        ]

    def args(self, token: str) -> list[str]:
        """The kernel line: the initrds by name (UEFI), the live environment's arguments, the token."""
        names = [f"initrd={u.rsplit('/', 1)[-1]}" for u in self.initrd_urls(token)]
        return [*names, *LIVE_KERNEL_ARGS, *self.kernel_args, f"{DISCOVERY_KERNEL_ARG}={token}"]


def render_discovery_script(templates: TemplateSet, boot: DiscoveryBoot, mac: str, token: str) -> str:
    """The iPXE script booting an unknown machine into discovery mode (hardware report, power off)."""
    return templates.render(
        DISCOVERY_TEMPLATE,
        mac=mac,
        kernel_url=boot.kernel_url(),
        initrd_urls=boot.initrd_urls(token),
        args=boot.args(token),
    )


def default_gateway(iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> str:
    """The first usable address of the network (the usual router address); '' for a /31, a /32,
    IPv6, or when that address is the host's own."""
    net = iface.network
    if net.version != 4 or net.prefixlen >= 31:
        return ""
    first = net.network_address + 1
    return "" if first == iface.ip else str(first)


def _ip_parts(cidr: str, gateway: str = "") -> dict[str, str]:
    """Template variables of the primary IPv4; ``gateway`` is the inventory's, else the default."""
    empty = {"ip_address": "", "prefix_length": "", "netmask": "", "gateway": ""}
    if not cidr:
        return empty
    try:
        iface = ipaddress.ip_interface(cidr)
    except ValueError:
        return empty
    return {
        "ip_address": str(iface.ip),
        "prefix_length": str(iface.network.prefixlen),
        "netmask": str(iface.network.netmask),
        "gateway": gateway or default_gateway(iface),
    }


def render_install_config(
    templates: TemplateSet, host: Host, entry: CatalogEntry, *, mac: str, base_url: str, provision_token: str
) -> str:
    """The kickstart or preseed of ``host``; it calls ``/provisioned/<host>`` at the end of the install."""
    short, _, domain = host.name.partition(".")
    return templates.render(
        entry.template,
        host=host.model_dump(),
        entry=entry,
        vars=entry.vars,
        mac=mac,
        short_name=short,
        domain=domain or entry.vars.get("domain", "localdomain"),
        base_url=base_url,
        config_url=config_url(base_url, host),
        provisioned_url=provisioned_url(base_url, host),
        provision_token=provision_token,
        **_ip_parts(host.primary_ipv4, host.ipv4_gateway),
    )


def config_kind(entry: CatalogEntry) -> str:
    """Metric label of an install config."""
    return "kickstart" if entry.installer == "kickstart" else "preseed"


def catalog_table(entries: Iterable[CatalogEntry]) -> str:
    """The Markdown table of catalog entries and the NetBox platform slugs each accepts
    (docs/bootapi.md embeds it; a test keeps the two equal)."""
    rows = [
        "| entry | installer | accepted platform slugs | roles | description |",
        "|---|---|---|---|---|",
    ]
    for e in sorted(entries, key=lambda e: e.name):
        slugs = ", ".join(f"`{p}`" for p in e.platforms)
        roles = ", ".join(f"`{r}`" for r in e.roles) or "any"
        rows.append(f"| `{e.name}` | {e.installer} | {slugs} | {roles} | {e.description} |")
    return "\n".join(rows) + "\n"
