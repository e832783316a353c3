"""NetBox adapter of the write-back (issue 27 item 2): reads a device's objects into the pure
core's :class:`~karios.inventory.writeback.DeviceState`, carries a
:class:`~karios.inventory.writeback.Plan` out, writes the journal entry, finds or creates the
device of an adopted server. Every call goes through :class:`NetBoxStore`'s plumbing (worker
thread, errors translated once); this module imports neither pynetbox nor requests.

Writes are bulk calls (NetBox creates or updates a list in one transaction): the interfaces of a
device in one call, its new MACs in one, its new items in one — a half-written plan is never left
by one call, and the next write-back completes what a failed one did not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from karios.common.contracts.discovery import NetboxDevice
from karios.common.contracts.hardware import usable_dmi
from karios.common.errors import Conflict, KariosError, ValidationFailed
from karios.inventory.netbox_store import NetBoxStore
from karios.inventory.writeback import (
    DeviceState,
    Plan,
    device_state,
    device_type_slug,
    manufacturer_name,
    pick_device_type,
    pick_manufacturer,
    slugify,
)

Json = dict[str, Any]

#: What a refused write-back call lacks (for the 403 message).
NEEDS = (
    "for the write-back (add/change on dcim.device, dcim.interface, dcim.macaddress, "
    "dcim.inventoryitem, extras.journalentry; adoption also dcim.manufacturer, dcim.devicetype)"
)
_IFACE_FIELDS = "id,name,mac_address,primary_mac_address,mac_addresses"
_HOLDER_FIELDS = "id,name,device,mac_address,primary_mac_address,mac_addresses"
_ITEM_FIELDS = "id,name,role,serial,part_id,description,discovered,custom_fields"
_ROLE_NAMES = {"gpu": "GPU", "disk": "Disk"}


class NetBoxWriter:
    def __init__(
        self,
        store: NetBoxStore,
        *,
        disk_role: str = "disk",
        gpu_role: str = "gpu",
        pxe_field: str = "pxe_enabled",
    ) -> None:
        self.store = store
        self.disk_role, self.gpu_role, self.pxe_field = disk_role, gpu_role, pxe_field
        self._role_ids: dict[str, int] = {}

    @property
    def _nb(self) -> Any:
        return self.store.api

    async def _write(self, what: str, fn: Callable[[], Any]) -> Any:
        return await self.store.call(what, fn, write=True, needs=NEEDS)

    # -- which device ------------------------------------------------------------------------
    async def device_for_record(self, bmc_ip: str, serial: str) -> Json | None:
        """The device whose out-of-band IP is ``bmc_ip``; else the only device with ``serial``."""
        device = await self.store.device_by_bmc_ip(bmc_ip) if bmc_ip else None
        serial = usable_dmi(serial)
        if device is None and serial:
            found = await self.store.rows(
                f"look up the device with serial {serial!r}", self._nb.dcim.devices, serial=serial
            )
            device = found[0] if len(found) == 1 else None
        return device

    # -- what it holds -----------------------------------------------------------------------
    async def state(self, device: Json, macs: list[str]) -> DeviceState:
        nb, dev_id = self._nb, int(device["id"])
        rows = self.store.rows

        async def holders() -> list[Json]:
            if not macs:
                return []
            return await rows(
                "look up the interfaces holding the inspected MACs",
                nb.dcim.interfaces,
                mac_address=macs,
                fields=_HOLDER_FIELDS,
            )

        async def item_fields() -> list[str]:
            found = await rows(
                "list the custom fields of inventory items",
                nb.extras.custom_fields,
                object_type="dcim.inventoryitem",
                fields="name",
            )
            return [str(f["name"]) for f in found]

        interfaces, items, modules, holding, fields = await asyncio.gather(
            rows(
                f"list interfaces of device {dev_id}",
                nb.dcim.interfaces,
                device_id=dev_id,
                fields=_IFACE_FIELDS,
            ),
            rows(
                f"list inventory items of device {dev_id}",
                nb.dcim.inventory_items,
                device_id=dev_id,
                fields=_ITEM_FIELDS,
            ),
            rows(f"list modules of device {dev_id}", nb.dcim.modules, device_id=dev_id, fields="id,serial"),
            holders(),
            item_fields(),
        )
        return device_state(device, interfaces, items, modules, holding, fields)

    async def _roles(self) -> dict[str, int]:
        """Ids of the disk and GPU inventory-item roles, created when NetBox has none yet (the
        inventory reads disks and GPUs by these roles: ``KARIOS_INVENTORY_DISK_ROLE`` / ``_GPU_ROLE``)."""
        for slug in (self.disk_role, self.gpu_role):
            if slug not in self._role_ids:
                self._role_ids[slug] = await self._ensure(
                    "inventory-item role",
                    self._nb.dcim.inventory_item_roles,
                    lambda rows, slug=slug: next((r for r in rows if r.get("slug") == slug), None),
                    {"name": _ROLE_NAMES.get(slug, slug.title()), "slug": slug},
                    slug=slug,
                )
        return self._role_ids

    # -- carrying a plan out -----------------------------------------------------------------
    async def apply(self, state: DeviceState, plan: Plan) -> None:
        nb, dev = self._nb, state.id
        if plan.device_serial:
            body = [{"id": dev, "serial": plan.device_serial}]
            await self._write(
                f"set the serial of device {state.name!r}", lambda: nb.dcim.devices.update(body)
            )
        if plan.interfaces:
            ifaces = [
                {
                    "device": dev,
                    "name": i.name,
                    "type": i.type,
                    "mac_address": i.mac,  # NetBox ≥ 4.2: a MAC object, made the interface's primary
                    **({"speed": i.speed_kbps} if i.speed_kbps else {}),
                }
                for i in plan.interfaces
            ]
            await self._write(
                f"create {len(ifaces)} interface(s) on device {state.name!r}",
                lambda: nb.dcim.interfaces.create(ifaces),
            )
        if plan.macs:
            macs = [
                {
                    "mac_address": m.mac,
                    "assigned_object_type": "dcim.interface",
                    "assigned_object_id": m.interface_id,
                }
                for m in plan.macs
            ]
            created = await self._write(
                f"add {len(macs)} MAC address(es) on device {state.name!r}",
                lambda: nb.dcim.mac_addresses.create(macs),
            )
            primaries = [
                {"id": m.interface_id, "primary_mac_address": int(dict(c)["id"])}
                for m, c in zip(plan.macs, created, strict=True)
                if m.primary
            ]
            if primaries:
                await self._write(
                    f"set primary MACs on device {state.name!r}", lambda: nb.dcim.interfaces.update(primaries)
                )
        roles = await self._roles() if plan.items or any("role" in u.fields for u in plan.updates) else {}
        role_of = {"disk": self.disk_role, "gpu": self.gpu_role}
        if plan.items:
            items = [
                {
                    "device": dev,
                    "name": i.name,
                    "role": roles[role_of[i.kind]],
                    "serial": i.serial,
                    "part_id": i.part_id,
                    "description": i.description,
                    "discovered": True,  # "created from a discovery": the write-back keeps it in step
                    **({"custom_fields": dict(i.custom_fields)} if i.custom_fields else {}),
                }
                for i in plan.items
            ]
            await self._write(
                f"create {len(items)} inventory item(s) on device {state.name!r}",
                lambda: nb.dcim.inventory_items.create(items),
            )
        if plan.updates:
            updates = []
            for u in plan.updates:
                body: dict[str, Any] = {"id": u.id, **u.fields}
                if "role" in body:
                    body["role"] = roles[str(body["role"])]
                updates.append(body)
            await self._write(
                f"update {len(updates)} inventory item(s) on device {state.name!r}",
                lambda: nb.dcim.inventory_items.update(updates),
            )

    # -- the journal -------------------------------------------------------------------------
    async def journaled(self, device_id: int, marker: str) -> bool:
        """Whether the device's journal already has the entry of this inspection / adoption."""
        found = await self.store.rows(
            f"look up journal entries of device {device_id}",
            self._nb.extras.journal_entries,
            assigned_object_type="dcim.device",
            assigned_object_id=device_id,
            q=marker,
            fields="id,comments",
        )
        return any(marker in str(e.get("comments") or "") for e in found)

    async def journal(self, device_id: int, kind: str, comments: str) -> int:
        body = {
            "assigned_object_type": "dcim.device",
            "assigned_object_id": device_id,
            "kind": kind,
            "comments": comments,
        }
        entry = await self._write(
            f"write a journal entry on device {device_id}",
            lambda: self._nb.extras.journal_entries.create(body),
        )
        return int(dict(entry)["id"])

    # -- the device of an adopted server -----------------------------------------------------
    async def find_device(self, name: str, serial: str) -> Json | None:
        """The device named ``name`` (it must not be another machine), else the only one with ``serial``."""
        serial = usable_dmi(serial)
        device = await self.store.device_by_name(name)
        if device is not None:
            have = usable_dmi(str(device.get("serial") or ""))
            if serial and have and have.lower() != serial.lower():
                raise Conflict(
                    f"hostname: the NetBox device {name!r} is another machine (serial {have}, this "
                    f"server {serial}): adopt it under another hostname",
                    field="hostname",
                )
            return device
        if serial:
            found = await self.store.rows(
                f"look up the device with serial {serial!r}", self._nb.dcim.devices, serial=serial
            )
            if len(found) == 1:
                return found[0]
        return None

    async def _one(self, what: str, endpoint: Any, setting: str, **filters: Any) -> int:
        found = await self.store.rows(f"look up {what}", endpoint, **filters)
        if not found:
            raise ValidationFailed(
                f"{setting}: NetBox has no {what} (KARIOS_INVENTORY_{setting.upper()})", field=setting
            )
        if len(found) > 1:
            raise Conflict(f"{setting}: NetBox has several {what}s: use a unique slug", field=setting)
        return int(found[0]["id"])

    async def _ensure(
        self, what: str, endpoint: Any, pick: Callable[[list[Json]], Json | None], body: Json, **filters: Any
    ) -> int:
        """The object ``pick`` chooses among ``endpoint``'s, else one created with ``body``."""
        found = pick(await self.store.rows(f"list {what}s", endpoint, **filters))
        if found is None:
            try:
                found = dict(
                    await self._write(
                        f"create {what} {body.get('name') or body.get('model')!r}",
                        lambda: endpoint.create(body),
                    )
                )
            except KariosError:
                found = pick(await self.store.rows(f"list {what}s", endpoint, **filters))  # a replica made it
                if found is None:
                    raise
        return int(found["id"])

    async def device_type_id(self, slug: str, dmi_vendor: str, dmi_model: str) -> int:
        """``slug`` (the setting) when given; else the type of the DMI make and model: the one NetBox
        has (same manufacturer and model, any case) or one created, with its manufacturer if needed."""
        nb = self._nb
        if slug:
            return await self._one(
                f"device type with slug {slug!r}", nb.dcim.device_types, "writeback_device_type", slug=slug
            )
        maker, model = manufacturer_name(dmi_vendor), usable_dmi(dmi_model)[:100]
        if not maker or not model:
            raise ValidationFailed(
                "writeback_device_type: the server reports no DMI make and model to find its device type "
                "by: set KARIOS_INVENTORY_WRITEBACK_DEVICE_TYPE",
                field="writeback_device_type",
            )
        maker_id = await self._ensure(
            "manufacturer",
            nb.dcim.manufacturers,
            lambda rows: pick_manufacturer(maker, rows),
            {
                "name": maker,
                "slug": slugify(maker),
                "description": "created by Karios (DMI of an adopted server)",
            },
            fields="id,name,slug",
        )
        return await self._ensure(
            "device type",
            nb.dcim.device_types,
            lambda rows: pick_device_type(maker, model, rows),
            {
                "manufacturer": maker_id,
                "model": model,
                "slug": device_type_slug(maker, model),
                "comments": "Created by Karios from the DMI of an adopted server: check its height, ports.",
            },
            manufacturer_id=maker_id,
            fields="id,model,slug,part_number",
        )

    async def device_custom_fields(self, wanted: Mapping[str, Any]) -> Json:
        """``wanted`` limited to the custom fields NetBox defines on devices (an unknown one is a 400);
        ``pxe_enabled`` is written to the configured PXE field."""
        fields = await self.store.rows(
            "list the custom fields of devices",
            self._nb.extras.custom_fields,
            object_type="dcim.device",
            fields="name",
        )
        names = {str(f["name"]) for f in fields}
        out = {}
        for key, value in wanted.items():
            key = self.pxe_field if key == "pxe_enabled" else key
            if key in names:
                out[key] = value
        return out

    async def create_device(
        self, dev: NetboxDevice, *, site: str, role: str, device_type: str, comments: str
    ) -> Json:
        """The device of an adopted server, status ``planned``."""
        nb = self._nb
        site_id, role_id, type_id, custom = await asyncio.gather(
            self._one(f"site with slug {site!r}", nb.dcim.sites, "writeback_site", slug=site),
            self._one(f"device role with slug {role!r}", nb.dcim.device_roles, "writeback_role", slug=role),
            self.device_type_id(device_type, dev.manufacturer, dev.model),
            self.device_custom_fields(dev.custom_fields),
        )
        body: Json = {
            "name": dev.name,
            "status": "planned",
            "serial": usable_dmi(dev.serial)[:50],
            "site": site_id,
            "role": role_id,
            "device_type": type_id,
            "comments": comments,
            **({"custom_fields": custom} if custom else {}),
        }
        created = await self._write(f"create device {dev.name!r}", lambda: nb.dcim.devices.create(body))
        return dict(created)
