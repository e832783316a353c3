"""Address parsing shared by every service: MACs in any common notation, IPs, CIDRs."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator

_HEX = re.compile(r"^[0-9a-f]{12}$")


def normalize_mac(value: str) -> str:
    """``AA-BB-CC-DD-EE-FF``, ``aabb.ccdd.eeff``, ``aa:bb:…``, bare hex → ``aa:bb:cc:dd:ee:ff``."""
    raw = re.sub(r"[:\-.]", "", value.strip().lower())
    if not _HEX.match(raw):
        raise ValueError(f"not a MAC address: {value!r}")
    return ":".join(raw[i : i + 2] for i in range(0, 12, 2))


def mac_or_none(value: object) -> str | None:
    """:func:`normalize_mac` for data we only read (NetBox fields, URL idents): None if not a MAC."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return normalize_mac(value)
    except ValueError:
        return None


def is_mac(value: str) -> bool:
    return mac_or_none(value) is not None


def normalize_ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValueError(f"not an IP address: {value!r}") from None


def host_address_problem(value: str, *, allow_loopback: bool = False) -> str | None:
    """Why ``value`` (an IP address) cannot be a host Karios connects to, or None: unspecified,
    loopback (unless allowed: a lab on one machine), broadcast, multicast, link-local or another
    reserved address (an IPv4-mapped IPv6 address is judged as its IPv4 address)."""
    ip = ipaddress.ip_address(value.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    kinds = [
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback and not allow_loopback),
        ("broadcast", ip == ipaddress.IPv4Address("255.255.255.255")),
        ("multicast", ip.is_multicast),
        ("link-local", ip.is_link_local),
        ("reserved", ip.is_reserved and not ip.is_loopback),
    ]
    kind = next((k for k, hit in kinds if hit), None)
    return f"{value} is a{'n' if kind[0] in 'aeiou' else ''} {kind} address, not a host's" if kind else None


def normalize_ipv4(value: str) -> str:
    try:
        return str(ipaddress.IPv4Address(value.strip()))
    except ValueError:
        raise ValueError(f"not an IPv4 address: {value!r}") from None


def normalize_cidr(value: str, *, strict: bool = False) -> str:
    try:
        return str(ipaddress.ip_network(value.strip(), strict=strict))
    except ValueError:
        raise ValueError(f"not a CIDR: {value!r}") from None


MacStr = Annotated[str, AfterValidator(normalize_mac)]
IPStr = Annotated[str, AfterValidator(normalize_ip)]
IPv4Str = Annotated[str, AfterValidator(normalize_ipv4)]
CIDRStr = Annotated[str, AfterValidator(normalize_cidr)]


def _optional(fn):  # type: ignore[no-untyped-def]
    def inner(v: str | None) -> str | None:
        if v is None or v == "":
            return None
        return fn(v)  # type: ignore[no-any-return]

    return inner


OptMacStr = Annotated[str | None, AfterValidator(_optional(normalize_mac))]
OptIPStr = Annotated[str | None, AfterValidator(_optional(normalize_ip))]


def ip_sort_key(ip: str) -> tuple[int, int | str]:
    """Order addresses numerically, IPv4 before IPv6 (mixed versions cannot be compared), and
    anything unparsable last, by text."""
    try:
        a = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return (9, ip)
    return (a.version, int(a))
