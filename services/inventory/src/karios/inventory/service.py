"""The inventory's use cases, one method each: the node registry (PostgreSQL) and the host /
hardware lookups (the cached store). Every change it makes is published as an event."""

from __future__ import annotations

from karios.common.bus.runtime import Bus
from karios.common.contracts.inventory import (
    AllocateIp,
    BmcAccess,
    BmcAccessQuery,
    BmcHardware,
    BmcHardwareQuery,
    DeviceChanged,
    Host,
    HostQuery,
    IpAllocation,
    NodeAccess,
    NodeAccessQuery,
    NodeQuery,
    NodeRegistered,
    NodeSummary,
    RegisterNode,
    RegisterNodeResult,
    SetPxeEnabled,
)
from karios.common.db import Database
from karios.common.errors import NotFound
from karios.inventory import registry
from karios.inventory.lookups import Inventory, device_changed_for
from karios.inventory.store import InventoryStore, parse_ident


class InventoryService:
    def __init__(self, bus: Bus, db: Database | None, inventory: Inventory, store: InventoryStore) -> None:
        self.bus, self._db, self.inventory, self.store = bus, db, inventory, store

    @property
    def db(self) -> Database:
        assert self._db is not None
        return self._db

    # -- node registry ----------------------------------------------------------------------
    async def register_node(self, cmd: RegisterNode) -> RegisterNodeResult:
        async with self.db.session() as session, session.begin():
            result = await registry.upsert_node(session, cmd)
        await self.bus.publish_event(
            NodeRegistered(
                bmc_ip=result.bmc_ip,
                created=result.created,
                hostname=result.hostname,
                node_ip=result.node_ip,
                vendor=cmd.vendor or "",
                is_control_node=cmd.is_control_node,
            ),
            self.bus.subjects.evt("inventory", "node.registered", result.bmc_ip),
            entity=result.bmc_ip,
        )
        return result

    async def get_node(self, q: NodeQuery) -> NodeSummary:
        async with self.db.session() as session:
            row = await registry.get_node(session, bmc_ip=q.bmc_ip, node_ip=q.node_ip)
        if row is None:
            raise NotFound(
                f"no registered node with BMC IP {q.bmc_ip}" if q.bmc_ip else f"no node with IP {q.node_ip}"
            )
        return registry.summarize(row)

    async def list_nodes(self, _q: NodeQuery) -> list[NodeSummary]:
        async with self.db.session() as session:
            return [registry.summarize(r) for r in await registry.list_nodes(session)]

    async def node_access(self, q: NodeAccessQuery) -> list[NodeAccess]:
        async with self.db.session() as session:
            if q.bmc_ip or q.node_ip:
                row = await registry.get_node(session, bmc_ip=q.bmc_ip, node_ip=q.node_ip)
                if row is None:
                    what = f"BMC IP {q.bmc_ip}" if q.bmc_ip else f"IP {q.node_ip}"
                    raise NotFound(f"no registered node with {what}")
                rows = [row]
            else:
                rows = await registry.list_nodes(session)
        out = [a for a in (registry.node_access(r) for r in rows) if a is not None]
        return [a for a in out if not (q.compute_only and a.is_control_node)]

    async def bmc_access(self, q: BmcAccessQuery) -> BmcAccess:
        async with self.db.session() as session:
            row = await registry.get_node(session, bmc_ip=q.bmc_ip)
        if row is None:
            raise NotFound(f"no registered node with BMC IP {q.bmc_ip}", field="bmc_ip")
        return registry.bmc_access(row)

    # -- inventory lookups --------------------------------------------------------------------
    async def host(self, q: HostQuery) -> Host:
        return await self.inventory.host(parse_ident(mac=q.mac, name=q.name))

    async def set_pxe_enabled(self, q: SetPxeEnabled) -> Host:
        host = await self.inventory.set_pxe_enabled(parse_ident(ident=q.ident), q.enabled)
        await self.publish_change(device_changed_for(host))
        return host

    async def bmc_hardware(self, q: BmcHardwareQuery) -> BmcHardware:
        return await self.inventory.bmc_hardware(q.bmc_ip)

    async def allocate_ip(self, q: AllocateIp) -> IpAllocation:
        got = await self.store.allocate_ip(q.name, prefix_id=q.prefix_id)
        if got is None:
            raise NotFound(f"no device named {q.name} in the inventory ({self.store.kind})", field="name")
        return got

    # -- device changes -----------------------------------------------------------------------
    async def device_changed(self, evt: DeviceChanged) -> None:
        """A change seen here first (the NetBox webhook): drop our cache, tell every replica."""
        self.inventory.apply_change(evt)
        await self.publish_change(evt)

    async def on_device_changed(self, evt: DeviceChanged) -> None:
        """A change broadcast by any replica (this one included): drop the cache entries."""
        self.inventory.apply_change(evt)

    async def publish_change(self, evt: DeviceChanged) -> None:
        entity = evt.name or (str(evt.device_id) if evt.device_id is not None else "unknown")
        await self.bus.publish_event(
            evt, self.bus.subjects.evt("inventory", "device.changed", entity), entity=entity
        )
