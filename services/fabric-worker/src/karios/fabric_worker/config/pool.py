"""VTEP loopback pool arithmetic (pure).

The pool is ``router_id_base/router_id_prefix_len``. Addresses are handed out from
``start_ip`` (the base, moved past a ``.0``/``.255``) to the end of the subnet; the ``.0`` and
``.255`` of every /24 are never used (some NOS and operators treat them as network/broadcast
even on /32 loopbacks), and neither is the switch's own peering IP when it sits inside the pool.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

DEFAULT_BASE = "10.255.0.0"
DEFAULT_PREFIX = 24


def _usable(addr: ipaddress.IPv4Address) -> bool:
    return int(addr) & 0xFF not in (0, 255)


@dataclass(frozen=True)
class VtepPool:
    base: ipaddress.IPv4Address
    prefix_len: int
    reserved: frozenset[ipaddress.IPv4Address] = frozenset()

    @classmethod
    def of(cls, base: str, prefix_len: int, reserved: Iterable[str] = ()) -> VtepPool:
        res = frozenset(ipaddress.IPv4Address(r) for r in reserved if r)
        return cls(ipaddress.IPv4Address(base), prefix_len, res)

    # Computed once per pool (frozen: cached_property writes the instance dict, not __setattr__):
    # contains() runs once per allocation, and a 1,000-node fabric re-parsed them 1,000 times.
    @cached_property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.base}/{self.prefix_len}", strict=False)

    @cached_property
    def start(self) -> ipaddress.IPv4Address | None:
        last = self.subnet.broadcast_address
        addr = self.base
        while addr <= last:
            if _usable(addr) and addr not in self.reserved:
                return addr
            if addr == last:
                break
            addr += 1
        return None

    def addresses(self) -> Iterator[ipaddress.IPv4Address]:
        """Every allocatable address, lowest first."""
        start = self.start
        if start is None:
            return
        last = int(self.subnet.broadcast_address)
        for i in range(int(start), last + 1):
            a = ipaddress.IPv4Address(i)
            if _usable(a) and a not in self.reserved:
                yield a

    @property
    def total_usable(self) -> int:
        start = self.start
        if start is None:
            return 0
        first, last = int(start), int(self.subnet.broadcast_address)
        span = last - first + 1
        # Count the .0/.255 in [first, last] arithmetically (a /8 pool has 16M addresses).
        bad = _count_octet(first, last, 0) + _count_octet(first, last, 255)
        reserved = sum(1 for r in self.reserved if first <= int(r) <= last and _usable(r))
        return span - bad - reserved

    @cached_property
    def _span(self) -> tuple[int, int, frozenset[int]] | None:
        """(first, last, reserved) as integers: contains() compares numbers, not address objects."""
        start = self.start
        if start is None:
            return None
        return int(start), int(self.subnet.broadcast_address), frozenset(int(r) for r in self.reserved)

    def contains(self, ip: str) -> bool:
        span = self._span
        if span is None:
            return False
        try:
            a = int(ipaddress.IPv4Address(ip))
        except ValueError:
            return False
        first, last, reserved = span
        return first <= a <= last and a & 0xFF not in (0, 255) and a not in reserved

    def first_free(self, taken: set[str]) -> str | None:
        for a in self.addresses():
            if str(a) not in taken:
                return str(a)
        return None


def _count_octet(first: int, last: int, octet: int) -> int:
    """How many integers in [first, last] have ``octet`` as their last byte."""

    def upto(n: int) -> int:  # count in [0, n]
        return 0 if n < octet else (n - octet) // 256 + 1

    return upto(last) - upto(first - 1)


def usable_in_prefix(prefix_len: int) -> int:
    """Usable addresses of a whole pool of this size starting at a /24 boundary."""
    return VtepPool.of("10.0.0.0", prefix_len).total_usable


def auto_prefix(expected_nodes: int, *, headroom: float = 0.25) -> int:
    """Smallest pool (never below /24) holding ``expected_nodes`` plus headroom and the switch."""
    if expected_nodes <= 0:
        return DEFAULT_PREFIX
    need = expected_nodes + int(expected_nodes * headroom + 0.999) + 1
    prefix = DEFAULT_PREFIX
    while prefix > 8 and usable_in_prefix(prefix) < need:
        prefix -= 1
    return prefix
