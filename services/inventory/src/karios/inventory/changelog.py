"""Following NetBox's change log (``/api/core/object-changes/``): changes arrive in seconds even
when no NetBox webhook is configured.

The core (:func:`affected_by`, :func:`events_for`) is pure: change-log records (as the REST API
returns them) → the devices they touch → the same :class:`DeviceChanged` events the webhook path
emits, so every cache (the inventory's and bootapi's, on every replica) drops the entry. A change
no single device owns (a config context, a module type, a platform, a role, a site, a rack) is one
event naming no device: every cache drops everything.

:class:`ChangeLogFollower` is the I/O edge: one replica polls (a PostgreSQL session advisory
lock, :class:`PgLeaderLock`); whenever a replica becomes the follower it starts at the newest
record and emits one drop-everything event, which covers whatever changed while nobody followed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy.ext.asyncio import AsyncConnection

from karios.common.contracts.inventory import DeviceChanged
from karios.common.db import Database
from karios.common.errors import KariosError
from karios.common.netaddr import mac_or_none
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger
from karios.inventory.webhook import DEVICE_CHILDREN, EVERY_DEVICE

log = get_logger(__name__)
Json = Mapping[str, Any]

#: The advisory lock key (``hashtext`` of it) the polling replica holds.
LOCK_NAME = "karios.inventory.changelog"


@dataclass
class Affected:
    """What a batch of change-log records touches."""

    devices: dict[int, str] = field(default_factory=dict)  # device id → name ("" if unknown)
    macs: set[str] = field(default_factory=set)
    interfaces: set[int] = field(default_factory=set)  # IP addresses assigned to these interfaces
    everything: bool = False


def _data(change: Json) -> list[Json]:
    return [
        d for d in (change.get("postchange_data"), change.get("prechange_data")) if isinstance(d, Mapping)
    ]


def _device_of(change: Json) -> tuple[int | None, str]:
    nested = change.get("changed_object")
    if isinstance(nested, Mapping) and isinstance(nested.get("device"), Mapping):
        dev = nested["device"]
        if isinstance(dev.get("id"), int):
            return dev["id"], str(dev.get("name") or "")
    for data in _data(change):  # snapshots serialise the device as a bare id
        if isinstance(data.get("device"), int):
            return data["device"], ""
    return None, ""


def affected_by(changes: Iterable[Json]) -> Affected:
    """The devices, MACs and interfaces a batch of ``core.objectchange`` records touches."""
    out = Affected()
    for change in changes:
        kind = str(change.get("changed_object_type") or "")
        if kind in EVERY_DEVICE:
            out.everything = True
        elif kind == "dcim.device" and isinstance(change.get("changed_object_id"), int):
            names = [str(d.get("name") or "") for d in _data(change)]
            out.devices[change["changed_object_id"]] = next((n for n in names if n), "")
        elif kind in DEVICE_CHILDREN:
            dev_id, name = _device_of(change)
            if dev_id is not None:
                out.devices[dev_id] = out.devices.get(dev_id) or name
        elif kind == "dcim.macaddress":
            out.macs |= {m for d in _data(change) if (m := mac_or_none(d.get("mac_address")))}
        elif kind == "ipam.ipaddress":
            out.interfaces |= {
                d["assigned_object_id"] for d in _data(change) if isinstance(d.get("assigned_object_id"), int)
            }
    return out


def events_for(affected: Affected, interface_devices: Mapping[int, tuple[int, str]]) -> list[DeviceChanged]:
    """One event per device (deduplicated), one per changed MAC; a single drop-everything event
    when any record touches every device, or an IP's interface is gone (its device is unknown)."""
    if affected.everything or any(i not in interface_devices for i in affected.interfaces):
        return [DeviceChanged()]
    devices = dict(affected.devices)
    for dev_id, name in (interface_devices[i] for i in sorted(affected.interfaces)):
        devices[dev_id] = devices.get(dev_id) or name
    events = [DeviceChanged(device_id=i, name=n) for i, n in sorted(devices.items())]
    return events + [DeviceChanged(macs=[m]) for m in sorted(affected.macs)]


# -- the I/O edge -------------------------------------------------------------------------------


class ChangeSource(Protocol):
    async def latest_change_id(self) -> int: ...

    async def changes_after(self, cursor: int, limit: int = 500) -> list[Json]: ...

    async def devices_of_interfaces(self, ids: list[int]) -> dict[int, tuple[int, str]]: ...


class PgLeaderLock:
    """Leadership = a session advisory lock held on one dedicated connection. A lost connection
    loses the lock (PostgreSQL releases it), and :meth:`ensure` reports that at the next tick."""

    def __init__(self, db: Database, name: str = LOCK_NAME) -> None:
        self._db, self._name = db, name
        self._conn: AsyncConnection | None = None

    async def ensure(self) -> bool:
        """True while this replica holds the lock (taking it when free)."""
        try:
            if self._conn is not None:
                await self._conn.execute(sa.text("SELECT 1"))
                return True
            conn = await self._db.engine.connect()
            got = (
                await conn.execute(sa.text("SELECT pg_try_advisory_lock(hashtext(:n))"), {"n": self._name})
            ).scalar()
            await conn.commit()
            if got:
                self._conn = conn
                return True
            await conn.close()
        except Exception as exc:  # a dead connection or database: not the leader until it is back
            log.warning("changelog leader lock unavailable", error=type(exc).__name__)
            await self.release()
        return False

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                # Discard the connection rather than return it to the pool: ending the session is
                # what releases the advisory lock (a pooled connection would keep holding it).
                await conn.invalidate()
            with contextlib.suppress(Exception):
                await conn.close()


@dataclass
class ChangeLogMetrics:
    registry: CollectorRegistry
    changes: Counter = field(init=False)
    errors: Counter = field(init=False)
    leader: Gauge = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.changes = Counter(
            "karios_inventory_changelog_changes", "NetBox change-log records read", registry=r
        )
        self.errors = Counter("karios_inventory_changelog_errors", "Change-log polls that failed", registry=r)
        self.leader = Gauge("karios_inventory_changelog_leader", "1 on the replica that polls", registry=r)


class ChangeLogFollower:
    """Polls the change log every ``interval`` seconds while it is the leader."""

    def __init__(
        self,
        source: ChangeSource,
        emit: Callable[[DeviceChanged], Awaitable[None]],
        *,
        interval: float = 3.0,
        lock: PgLeaderLock | None = None,
        metrics: ChangeLogMetrics | None = None,
        batch: int = 500,
        max_pages: int = 20,
    ) -> None:
        self.source, self.emit, self.interval, self.lock = source, emit, interval, lock
        self.metrics, self.batch, self.max_pages = metrics, batch, max_pages
        self.cursor: int | None = None  # None = not following (start at the newest record)
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> int:
        """One poll: returns how many events were emitted."""
        if self.lock is not None and not await self.lock.ensure():
            self.cursor = None
            self._leader(False)
            return 0
        self._leader(True)
        if self.cursor is None:
            self.cursor = await self.source.latest_change_id()
            log.info("following the NetBox change log", after=self.cursor)
            await self.emit(DeviceChanged())  # whatever changed while nobody followed
            return 1
        emitted = 0
        for _ in range(self.max_pages):  # a bulk edit is read in pages, up to max_pages a tick
            changes = await self.source.changes_after(self.cursor, self.batch)
            if not changes:
                break
            if self.metrics:
                self.metrics.changes.inc(len(changes))
            affected = affected_by(changes)
            iface_devices = await self.source.devices_of_interfaces(sorted(affected.interfaces))
            for evt in events_for(affected, iface_devices):
                await self.emit(evt)
                emitted += 1
            self.cursor = max(int(c["id"]) for c in changes)
            if len(changes) < self.batch:
                break
        return emitted

    def _leader(self, on: bool) -> None:
        if self.metrics:
            self.metrics.leader.set(1 if on else 0)

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except KariosError as exc:  # NetBox or the bus failed: keep the cursor, try again
                if self.metrics:
                    self.metrics.errors.inc()
                log.warning("change-log poll failed", code=exc.code, error=exc.message)
            except Exception as exc:
                if self.metrics:
                    self.metrics.errors.inc()
                log.warning("change-log poll failed", error=type(exc).__name__)
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="netbox-changelog")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self.lock is not None:
            await self.lock.release()
        self._leader(False)
