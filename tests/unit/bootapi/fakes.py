"""Test doubles for the pure core and the service layer (matchbox style: fixed, empty, broken)."""

from __future__ import annotations

from karios.common.contracts.inventory import Host, HostInterface
from karios.common.errors import NotFound, ServiceUnavailable, UpstreamError
from karios.common.netaddr import is_mac, normalize_mac

ALMA = Host(
    id=11,
    name="node-a1.lab.example",
    platform="almalinux-9",
    role="compute",
    site="syd1",
    primary_ipv4="10.20.0.11/24",
    interfaces=[
        HostInterface(name="bmc", macs=["aa:bb:cc:00:00:01"], mgmt_only=True),
        HostInterface(name="eno1", macs=["52:54:00:aa:00:11"], ipv4=["10.20.0.11/24"]),
    ],
)
FEDORA = Host(
    id=12,
    name="node-f1.lab.example",
    platform="fedora",
    role="compute",
    interfaces=[HostInterface(name="eno1", macs=["52:54:00:aa:00:12"])],
)
DEBIAN = Host(
    id=13,
    name="node-d1.lab.example",
    platform="debian-12",
    role="storage",
    primary_ipv4="10.20.0.13/24",
    interfaces=[HostInterface(name="eno1", macs=["52:54:00:aa:00:13"])],
)
GATED = Host(
    id=14,
    name="node-done.lab.example",
    platform="almalinux-9",
    pxe_enabled=False,
    interfaces=[HostInterface(name="eno1", macs=["52:54:00:aa:00:14"])],
)
NO_OS = Host(
    id=15,
    name="node-windows.lab.example",
    platform="windows-2022",
    interfaces=[HostInterface(name="eno1", macs=["52:54:00:aa:00:15"])],
)
HOSTS = [ALMA, FEDORA, DEBIAN, GATED, NO_OS]


class FixedHosts:
    """A fixed inventory; records calls so single-flight and invalidation can be counted."""

    def __init__(self, hosts: list[Host] | None = None) -> None:
        self.hosts = {h.name: h.model_copy(deep=True) for h in (HOSTS if hosts is None else hosts)}
        self.calls: list[tuple[str, str]] = []
        self.pxe_writes: list[tuple[str, bool]] = []

    def _by_mac(self, mac: str) -> Host | None:
        mac = normalize_mac(mac)
        for h in self.hosts.values():
            if any(normalize_mac(m) == mac for i in h.interfaces for m in i.macs):
                return h
        return None

    async def by_mac(self, mac: str) -> Host | None:
        self.calls.append(("mac", mac))
        return self._by_mac(mac)

    async def by_name(self, name: str) -> Host | None:
        self.calls.append(("name", name))
        return next((h for h in self.hosts.values() if h.name.lower() == name.lower()), None)

    async def set_pxe_enabled(self, ident: str, enabled: bool) -> None:
        by_name = next((h for h in self.hosts.values() if h.name.lower() == ident.lower()), None)
        host = by_name or (self._by_mac(ident) if is_mac(ident) else None)
        if host is None:
            raise NotFound(f"no device {ident}")
        host.pxe_enabled = enabled
        self.pxe_writes.append((ident, enabled))


class EmptyHosts(FixedHosts):
    def __init__(self) -> None:
        super().__init__([])


class BrokenHosts:
    """An inventory that fails every call (NetBox down, or nobody answering on the bus)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error or UpstreamError("netbox: 500 Internal Server Error")

    async def by_mac(self, mac: str) -> Host | None:
        raise self.error

    async def by_name(self, name: str) -> Host | None:
        raise self.error

    async def set_pxe_enabled(self, ident: str, enabled: bool) -> None:
        raise self.error


UNAVAILABLE = ServiceUnavailable("no service answers karios.q.inventory.host")
