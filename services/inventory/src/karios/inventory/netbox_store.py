"""NetBox adapter (pynetbox). The only module that imports pynetbox or requests.

pynetbox is synchronous: every call runs in a worker thread, and independent calls for one
device (interfaces, IPs, inventory items, modules) run concurrently. Library errors are
translated once, in :func:`translate_error`, into ``UpstreamError`` (502), ``Forbidden``
(a write the token may not make) or ``NotFound``. The token never appears in a message.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pynetbox
import requests
from pynetbox.core.query import ContentError, RequestError

from karios.common.contracts.inventory import BmcHardware, Host, IpAllocation
from karios.common.errors import Conflict, Forbidden, KariosError, NotFound, UpstreamError, ValidationFailed
from karios.common.telemetry import get_logger
from karios.inventory import mapping
from karios.inventory.mapping import HardwareRules

log = get_logger(__name__)
T = TypeVar("T")
Json = dict[str, Any]


# Only what the mapping reads (NetBox ≥ 4.0 ``?fields=``): serialising less makes each call cheaper.
_IFACE_FIELDS = "id,name,type,speed,mgmt_only,enabled,mac_address,primary_mac_address,mac_addresses"
_IP_FIELDS = "id,address,assigned_object_type,assigned_object_id"
_CHANGE_FIELDS = "id,changed_object_type,changed_object_id,changed_object,prechange_data,postchange_data"


class _TimeoutSession(requests.Session):
    """pynetbox has no timeout setting: give every request one."""

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = timeout
        self.trust_env = False  # NetBox is on our network: no proxy from the environment

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", self._timeout)
        return super().request(*args, **kwargs)


def _where(url: str) -> str:
    """scheme://host:port of the NetBox URL (no credentials, no path) for messages."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: What a refused write needs, when the caller does not say (the ``pxe_enabled`` write).
PXE_WRITE_NEEDS = "on dcim.device — writing pxe_enabled needs a token with write enabled"


def translate_error(
    exc: BaseException, what: str, *, url: str, write: bool = False, needs: str = PXE_WRITE_NEEDS
) -> KariosError:
    """The one place a NetBox/pynetbox/requests failure becomes a Karios error. ``needs``: what
    permission a refused write lacks, for the message."""
    if isinstance(exc, KariosError):
        return exc
    where = _where(url)
    if isinstance(exc, RequestError):
        status = exc.req.status_code
        if status in (401, 403) and write:
            return Forbidden(
                f"NetBox refused to {what} ({status}): the NetBox token has no write permission "
                f"{needs} (see docs/inventory.md)",
                details={"netbox_status": status},
            )
        if status in (401, 403):
            return UpstreamError(
                f"NetBox at {where} refused the token ({status}) while trying to {what}: "
                "check KARIOS_NETBOX_TOKEN and its permissions",
                details={"netbox_status": status},
            )
        if status == 404:
            return NotFound(f"NetBox has no such object ({what})", details={"netbox_status": status})
        return UpstreamError(
            f"NetBox at {where} answered {status} to {what}: {_short(exc.error)}",
            details={"netbox_status": status},
        )
    if isinstance(exc, ContentError):
        return UpstreamError(f"NetBox at {where} answered something that is not JSON to {what}")
    if isinstance(exc, requests.Timeout):
        return UpstreamError(f"NetBox at {where} did not answer in time ({what})")
    if isinstance(exc, requests.ConnectionError):
        return UpstreamError(f"cannot reach NetBox at {where} ({what})")
    if isinstance(exc, requests.RequestException | ValueError):
        return UpstreamError(f"NetBox request failed ({what}): {type(exc).__name__}")
    return UpstreamError(f"NetBox request failed ({what}): {type(exc).__name__}")


class NetBoxStore:
    kind = "netbox"

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        rules: HardwareRules | None = None,
        pxe_field: str = "pxe_enabled",
        timeout: float = 10.0,
        static_pool: str = "",
    ) -> None:
        self.url = url.rstrip("/")
        self._nb = pynetbox.api(self.url, token=token or None)
        self._nb.http_session = _TimeoutSession(timeout)
        self._rules = rules or HardwareRules()
        self._pxe_field = pxe_field
        self._static_pool = static_pool
        self.calls = 0  # NetBox HTTP round trips started (tests and benchmarks read it)

    # -- plumbing ---------------------------------------------------------------------------
    async def _run(
        self, what: str, fn: Callable[[], T], *, write: bool = False, needs: str = PXE_WRITE_NEEDS
    ) -> T:
        self.calls += 1
        try:
            return await asyncio.to_thread(fn)
        except Exception as exc:
            err = translate_error(exc, what, url=self.url, write=write, needs=needs)
            log.warning("netbox call failed", what=what, code=err.code, error=err.message)
            raise err from None

    async def _list(self, what: str, endpoint: Any, **filters: Any) -> list[Json]:
        return await self._run(what, lambda: [dict(r) for r in endpoint.filter(**filters)])

    # The write-back adapter (``netbox_writer.py``) goes through the same plumbing.
    @property
    def api(self) -> Any:
        """The pynetbox API object (its endpoints); call it only through :meth:`call`/:meth:`rows`."""
        return self._nb

    async def call(self, what: str, fn: Callable[[], T], *, write: bool = False, needs: str = "") -> T:
        """One NetBox call in a worker thread, its failure translated (``needs``: see translate_error)."""
        return await self._run(what, fn, write=write, needs=needs or PXE_WRITE_NEEDS)

    async def rows(self, what: str, endpoint: Any, **filters: Any) -> list[Json]:
        """Every object of ``endpoint`` matching ``filters``, as plain dicts."""
        return await self._list(what, endpoint, **filters)

    async def device_by_bmc_ip(self, bmc_ip: str) -> Json | None:
        return await self._device_by_bmc_ip(bmc_ip)

    async def device_by_name(self, name: str) -> Json | None:
        """The device of that name (``Conflict`` when several sites hold one)."""
        return await self._device_by_name(name)

    # -- reads ------------------------------------------------------------------------------
    async def _device_by_id(self, device_id: int) -> Json | None:
        rec = await self._run(f"get device {device_id}", lambda: self._nb.dcim.devices.get(device_id))
        return dict(rec) if rec is not None else None

    async def _interfaces_and_ips(self, dev_id: int) -> tuple[list[Json], list[Json]]:
        nb = self._nb
        interfaces, ips = await asyncio.gather(
            self._list(
                f"list interfaces of device {dev_id}",
                nb.dcim.interfaces,
                device_id=dev_id,
                fields=_IFACE_FIELDS,
            ),
            self._list(
                f"list IP addresses of device {dev_id}",
                nb.ipam.ip_addresses,
                device_id=dev_id,
                fields=_IP_FIELDS,
            ),
        )
        return interfaces, ips

    async def _host(self, device: Json) -> Host:
        interfaces, ips = await self._interfaces_and_ips(int(device["id"]))
        return mapping.host_from_netbox(device, interfaces, ips, pxe_field=self._pxe_field)

    async def _host_by_id(self, dev_id: int) -> Host | None:
        # The device and its interfaces/IPs only need the id: fetch them concurrently.
        device, (interfaces, ips) = await asyncio.gather(
            self._device_by_id(dev_id), self._interfaces_and_ips(dev_id)
        )
        if device is None:
            return None
        return mapping.host_from_netbox(device, interfaces, ips, pxe_field=self._pxe_field)

    async def host_by_mac(self, mac: str) -> Host | None:
        ifaces = await self._list(
            f"look up MAC {mac}", self._nb.dcim.interfaces, mac_address=mac, fields="id,device"
        )
        devices = {int(i["device"]["id"]): i["device"].get("name") or "" for i in ifaces if i.get("device")}
        if not devices:
            return None
        if len(devices) > 1:
            raise Conflict(
                f"MAC {mac} is on interfaces of several devices: {', '.join(sorted(devices.values()))}",
                field="mac",
            )
        return await self._host_by_id(next(iter(devices)))

    async def _device_by_name(self, name: str) -> Json | None:
        found = await self._list(f"look up device {name!r}", self._nb.dcim.devices, name=name)
        if len(found) > 1:
            raise Conflict(
                f"several NetBox devices are named {name!r} (one per site?): use a MAC", field="name"
            )
        return found[0] if found else None

    async def host_by_name(self, name: str) -> Host | None:
        device = await self._device_by_name(name)
        return await self._host(device) if device else None

    async def _device_by_bmc_ip(self, bmc_ip: str) -> Json | None:
        ips = await self._list(f"look up IP {bmc_ip}", self._nb.ipam.ip_addresses, address=bmc_ip)
        ids = [int(ip["id"]) for ip in ips]
        if not ids:
            return None
        devices = await self._list(
            f"look up device with OOB IP {bmc_ip}", self._nb.dcim.devices, oob_ip_id=ids
        )
        if devices:
            return devices[0]
        for ip in ips:  # fall back to the device owning an interface with that IP
            obj = ip.get("assigned_object") or {}
            if ip.get("assigned_object_type") == "dcim.interface" and obj.get("device"):
                return await self._device_by_id(int(obj["device"]["id"]))
        return None

    async def bmc_hardware(self, bmc_ip: str) -> BmcHardware | None:
        device = await self._device_by_bmc_ip(bmc_ip)
        if device is None:
            return None
        dev_id = int(device["id"])
        nb = self._nb
        (interfaces, ips), items, modules = await asyncio.gather(
            self._interfaces_and_ips(dev_id),
            self._list(f"list inventory items of device {dev_id}", nb.dcim.inventory_items, device_id=dev_id),
            self._list(f"list modules of device {dev_id}", nb.dcim.modules, device_id=dev_id),
        )
        type_ids = sorted({int(m["module_type"]["id"]) for m in modules if m.get("module_type")})
        module_types: dict[int, Json] = {}
        if type_ids:
            types = await self._list("list module types", nb.dcim.module_types, id=type_ids)
            module_types = {int(t["id"]): t for t in types}
        return mapping.bmc_hardware_from_netbox(
            device, bmc_ip, interfaces, ips, items, modules, module_types, self._rules
        )

    # -- writes -----------------------------------------------------------------------------
    async def set_pxe_enabled(self, name: str, enabled: bool) -> Host | None:
        device = await self._device_by_name(name)
        if device is None:
            return None
        dev_id = int(device["id"])
        field = self._pxe_field
        if field not in (device.get("custom_fields") or {}):
            raise UpstreamError(
                f"NetBox has no custom field {field!r} on dcim.device: create a boolean custom field "
                f"{field!r} for devices (see docs/inventory.md)"
            )
        updated = await self._run(
            f"set {field}={str(enabled).lower()} on device {name!r}",
            lambda: self._nb.dcim.devices.update([{"id": dev_id, "custom_fields": {field: enabled}}]),
            write=True,
        )
        fresh = dict(updated[0]) if updated else await self._device_by_id(dev_id)
        if fresh is None:
            return None
        return await self._host(fresh)

    async def allocate_ip(self, name: str, prefix_id: int | None = None) -> IpAllocation | None:
        """The device's primary IPv4, else an address reserved for it in NetBox IPAM.

        The address comes from prefix ``prefix_id`` when given (the UI's VLAN/prefix choice),
        else from ``static_pool``.
        """
        device = await self._device_by_name(name)
        if device is None:
            return None
        primary = (device.get("primary_ip4") or {}).get("address")
        if primary:
            return IpAllocation(name=name, address=primary, created=False)
        if prefix_id is not None:
            return await self._allocate_in_prefix_id(name, prefix_id)
        if not self._static_pool:
            raise ValidationFailed(
                "static_pool: no static IP pool configured (KARIOS_INVENTORY_STATIC_POOL)",
                field="static_pool",
            )
        tag = f"karios static address of {name}"
        nb = self._nb
        existing = await self._list(
            f"look up the static address of {name!r}",
            nb.ipam.ip_addresses,
            parent=self._static_pool,
            description=tag,
        )
        if existing:
            return IpAllocation(name=name, address=str(existing[0]["address"]), created=False)
        pool = self._static_pool
        prefix = await self._run(f"get prefix {pool}", lambda: nb.ipam.prefixes.get(prefix=pool))
        if prefix is None:
            raise UpstreamError(f"NetBox has no prefix {pool} (KARIOS_INVENTORY_STATIC_POOL)")
        created = await self._run(
            f"allocate an address in {pool}",
            lambda: prefix.available_ips.create({"description": tag, "dns_name": name, "status": "reserved"}),
            write=True,
        )
        return IpAllocation(name=name, address=str(dict(created)["address"]), created=True)

    async def _allocate_in_prefix_id(self, name: str, prefix_id: int) -> IpAllocation:
        nb = self._nb
        prefix = await self._run(f"get prefix {prefix_id}", lambda: nb.ipam.prefixes.get(prefix_id))
        if prefix is None:
            raise NotFound(f"prefix_id: NetBox has no prefix with id {prefix_id}", field="prefix_id")
        tag = f"karios static address of {name}"
        existing = await self._list(
            f"look up the static address of {name!r}",
            nb.ipam.ip_addresses,
            parent=str(prefix.prefix),
            description=tag,
        )
        if existing:
            return IpAllocation(name=name, address=str(existing[0]["address"]), created=False)
        created = await self._run(
            f"allocate an address in prefix {prefix_id}",
            lambda: prefix.available_ips.create({"description": tag, "dns_name": name, "status": "reserved"}),
            write=True,
        )
        return IpAllocation(name=name, address=str(dict(created)["address"]), created=True)

    # -- the change log (karios.inventory.changelog follows it) ------------------------------
    async def latest_change_id(self) -> int:
        """Id of the newest ``core.objectchange`` (0 when the log is empty)."""
        ep = self._nb.core.object_changes
        rows = await self._run(
            "read the change log",
            lambda: [dict(r) for r in itertools.islice(ep.filter(ordering="-id", limit=1, fields="id"), 1)],
        )
        return int(rows[0]["id"]) if rows else 0

    async def changes_after(self, cursor: int, limit: int = 500) -> list[Json]:
        """Change-log records with id > ``cursor``, oldest first, at most ``limit``."""
        ep = self._nb.core.object_changes
        page = min(limit, 200)
        return await self._run(
            f"read the change log after {cursor}",
            lambda: [
                dict(r)
                for r in itertools.islice(
                    ep.filter(id__gt=cursor, ordering="id", limit=page, fields=_CHANGE_FIELDS), limit
                )
            ],
        )

    async def devices_of_interfaces(self, ids: list[int]) -> dict[int, tuple[int, str]]:
        """Interface id → (device id, device name), for the interfaces that still exist."""
        if not ids:
            return {}
        rows = await self._list(
            "look up interfaces of changed IP addresses", self._nb.dcim.interfaces, id=ids, fields="id,device"
        )
        return {
            int(r["id"]): (int(r["device"]["id"]), str(r["device"].get("name") or ""))
            for r in rows
            if isinstance(r.get("device"), dict) and r["device"].get("id") is not None
        }

    async def ping(self) -> bool:
        try:
            await self._run("read status", self._nb.status)
        except KariosError:
            return False
        return True

    async def close(self) -> None:
        self._nb.http_session.close()
