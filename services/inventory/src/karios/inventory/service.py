"""The inventory's use cases, one method each: the node registry (PostgreSQL) and the host /
hardware lookups (the cached store). Every change it makes is published as an event."""

from __future__ import annotations

import contextlib

from sqlmodel.ext.asyncio.session import AsyncSession

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
from karios.common.contracts.nodes import (
    AdoptNode,
    ComputeNode,
    ComputeNodeChanged,
    ComputeNodePage,
    ComputeNodeQuery,
    ComputeNodesQuery,
    PinnedHostKey,
    PinNodeHostKey,
    RegisterComputeNode,
    ReleasedFabricNode,
    ReleaseFabricNode,
    RemoveComputeNode,
)
from karios.common.db import Database
from karios.common.errors import NotFound, ServiceUnavailable
from karios.inventory import compute, registry
from karios.inventory.lookups import Inventory, device_changed_for
from karios.inventory.store import InventoryStore, parse_ident


class InventoryService:
    def __init__(self, bus: Bus, db: Database | None, inventory: Inventory, store: InventoryStore) -> None:
        self.bus, self._db, self.inventory, self.store = bus, db, inventory, store
        self._node_set: tuple[tuple[int, ...], tuple[NodeAccess, ...]] | None = None

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
        """The fabric's node set (registry rows with an OS IP + compute nodes), or one node."""
        async with self.db.session() as session:
            if q.node_ip and not q.bmc_ip:  # the fabric's per-node routes: that node's rows only
                pair = await compute.node_of(session, q.node_ip)
                out = [a for a in [compute.to_access(pair)] if a is not None] if pair is not None else []
            else:
                out = await self._whole_node_set(session)
        if q.bmc_ip or q.node_ip:
            out = [a for a in out if (a.bmc_ip == q.bmc_ip if q.bmc_ip else a.node_ip == q.node_ip)]
            if not out:
                what = f"BMC IP {q.bmc_ip}" if q.bmc_ip else f"IP {q.node_ip}"
                raise NotFound(f"no registered node with {what}")
        return [a for a in out if not (q.compute_only and a.is_control_node)]

    async def _whole_node_set(self, session: AsyncSession) -> list[NodeAccess]:
        """Every node's access, rebuilt only when the two tables it is read from changed.

        A fabric apply or preflight asks for the whole set (1,000 nodes: ~2,000 rows loaded and
        1,000 ``NodeAccess`` built, most of the inventory's CPU under a burst of applies). The
        tables' fingerprint (:data:`compute.NODE_SET_FINGERPRINT`: each table's row count and the
        sum of its rows' ``xmin``, which every insert, update and delete changes) is one cheap
        statement; any writer — this replica, another one, a restore in SQL — changes it. Read
        before the rows: a write committed in between leaves the set under the older
        fingerprint, and the next request reads it again.
        """
        mark = await compute.node_set_fingerprint(session)
        kept = self._node_set
        if kept is not None and kept[0] == mark:
            return list(kept[1])
        pairs = await compute.node_set(session)
        out = [a for a in (compute.to_access(p) for p in pairs) if a is not None]
        self._node_set = (mark, tuple(out))
        return out

    # -- compute nodes (the fabric's node set) --------------------------------------------------
    async def adopt_node(self, cmd: AdoptNode) -> ComputeNode:
        """Pin the host key through the fabric worker (one SSH contact), then store the node.
        Unreachable, refused login, a changed key or a fabric job running (409
        FABRIC_JOB_RUNNING): the fabric's error, nothing stored. No fabric worker: 503."""
        async with self.db.session() as session:
            earlier = await compute.get(session, cmd.node_ip)
        pin = PinNodeHostKey.model_validate(
            {
                **cmd.model_dump(exclude={"hostname", "bmc_ip"}),
                "known_host_key": earlier.host_key if earlier else None,
            }
        )
        pinned: PinnedHostKey = await self.bus.request(
            self.bus.subjects.request("fabric", "pin_host_key"),
            pin,
            timeout=cmd.connect_timeout + 5,
            reply=PinnedHostKey,
        )
        async with self.db.session() as session, session.begin():
            row, _created = await compute.upsert(
                session,
                cmd,
                source="adopted",
                hostname=cmd.hostname,
                bmc_ip=cmd.bmc_ip,
                host_key=pinned.host_key,
                fingerprint=pinned.fingerprint,
            )
            node = compute.view(row)
        await self._changed(node, "adopted")
        return node

    async def register_compute_node(self, cmd: RegisterComputeNode) -> ComputeNode:
        """First boot of a node Karios installed (idempotent per address). Its old pinned key,
        if any, is forgotten: a fresh install has a new one, pinned at the next contact."""
        with contextlib.suppress(ServiceUnavailable):  # no fabric worker yet: nothing pinned
            await self.bus.request(
                self.bus.subjects.request("fabric", "release_node"),
                ReleaseFabricNode(node_ip=cmd.node_ip, reinstalled=True),
                reply=ReleasedFabricNode,
            )
        async with self.db.session() as session, session.begin():
            row, _created = await compute.upsert(
                session, cmd, source="firstboot", hostname=cmd.hostname, bmc_ip=cmd.bmc_ip
            )
            node = compute.view(row)
        await self._changed(node, "registered")
        return node

    async def compute_nodes(self, q: ComputeNodesQuery) -> ComputeNodePage:
        async with self.db.session() as session:
            pairs, total = await compute.node_page(session, q.offset, q.limit)
        items = [compute.to_view(p) for p in pairs]
        return ComputeNodePage(items=items, total=total, offset=q.offset, limit=q.limit)

    async def compute_node(self, q: ComputeNodeQuery) -> ComputeNode:
        async with self.db.session() as session:
            pair = await compute.node_of(session, q.node_ip)
        if pair is not None:
            return compute.to_view(pair)
        raise NotFound(f"node_ip: no compute node with address {q.node_ip}", field="node_ip")

    async def remove_compute_node(self, cmd: RemoveComputeNode) -> ComputeNode:
        """409 (from the fabric worker) while the node holds fabric state or a fabric job runs;
        else the node leaves the set and its pinned host key is forgotten. No worker: 503."""
        node = await self.compute_node(ComputeNodeQuery(node_ip=cmd.node_ip))
        await self.bus.request(
            self.bus.subjects.request("fabric", "release_node"),
            ReleaseFabricNode(node_ip=cmd.node_ip),
            reply=ReleasedFabricNode,
        )
        async with self.db.session() as session, session.begin():
            await compute.remove(session, cmd.node_ip)
        await self._changed(node, "removed")
        return node

    async def _changed(self, node: ComputeNode, change: str) -> None:
        await self.bus.publish_event(
            ComputeNodeChanged(
                node_ip=node.node_ip,
                change=change,  # type: ignore[arg-type]
                hostname=node.hostname,
                bmc_ip=node.bmc_ip,
                host_key_fingerprint=node.host_key_fingerprint,
            ),
            self.bus.subjects.evt("inventory", f"node.{change}", node.node_ip),
            entity=node.node_ip,
        )

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
