"""The inventory as the rest of the service sees it: one small interface, two implementations.

- :class:`karios.inventory.netbox_store.NetBoxStore` — the real thing (pynetbox).
- :class:`karios.inventory.file_store.FileStore` — YAML, the embedded default and the demo data.

Implementations answer ``None`` for "no such device" and raise :class:`KariosError`s
(``UpstreamError`` when the backend fails, ``Forbidden`` when a write is refused); they never
let a library exception escape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from karios.common.contracts.inventory import BmcHardware, Host, IpAllocation
from karios.common.errors import ValidationFailed
from karios.common.netaddr import is_mac, normalize_mac


class InventoryStore(Protocol):
    kind: str  # "netbox" | "file"

    async def host_by_mac(self, mac: str) -> Host | None:
        """The device owning an interface with this (normalised) MAC."""
        ...

    async def host_by_name(self, name: str) -> Host | None: ...

    async def set_pxe_enabled(self, name: str, enabled: bool) -> Host | None:
        """Write the ``pxe_enabled`` custom field of device ``name``; ``None`` if it does not exist."""
        ...

    async def bmc_hardware(self, bmc_ip: str) -> BmcHardware | None:
        """Disks, GPUs and NICs of the device whose out-of-band IP is ``bmc_ip``."""
        ...

    async def allocate_ip(self, name: str, prefix_id: int | None = None) -> IpAllocation | None:
        """A static IPv4 for device ``name`` (its primary IPv4 if it has one; else from prefix ``prefix_id``
        or the configured pool); ``None`` if the device is unknown."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Ident:
    """What a caller asked for: a MAC (normalised) or a device name."""

    field: Literal["mac", "name"]
    value: str

    @property
    def key(self) -> str:
        return f"{self.field}:{self.value}"


def parse_ident(*, mac: str | None = None, name: str | None = None, ident: str | None = None) -> Ident:
    """``mac=`` must be a MAC in any notation; ``ident=`` is a MAC if it parses as one, else a name.

    A twelve-hex-digit device name (``deadbeef0001``) is read as a MAC: use ``name=`` for it.
    """
    if mac:
        try:
            return Ident("mac", normalize_mac(mac))
        except ValueError:
            raise ValidationFailed(f"mac: not a MAC address: {mac!r}", field="mac") from None
    if ident:
        ident = ident.strip()
        if is_mac(ident):
            return Ident("mac", normalize_mac(ident))
        name = ident
    if name and name.strip():
        return Ident("name", name.strip())
    raise ValidationFailed("mac: give a MAC address or a device name", field="mac")
