"""Write-back use cases (issue 27 item 2): an inspection written to its NetBox device, an adopted
server's device created (status ``planned``) and written. Behind ``KARIOS_INVENTORY_WRITEBACK``
(off by default); NetBox only.

- :meth:`WriteBack.on_inspected` — the ``hardware.inspected`` event (durable pull consumer
  ``inventory-writeback``, one replica per event): read the record from the provisioner
  (``q.provision.hardware``), write it to the device whose out-of-band IP is the BMC's.
- :meth:`WriteBack.write_back_device` — ``req.inventory.write_back_device`` from the provisioner's
  adoption.

Each write: under the device's advisory lock, read the device's objects, plan (pure:
``writeback.py``), apply, one journal entry (none when this inspection is journaled already and
nothing is left to do: a redelivered event changes nothing), then ``device.changed`` so caches
drop the device.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from karios.common.bus.runtime import Bus
from karios.common.contracts.hardware import HardwareInspected, HardwareQuery, HardwareRecord
from karios.common.contracts.inventory import DeviceChanged
from karios.common.contracts.netbox_writeback import NetboxWriteBack, WriteBackDevice
from karios.common.db import Database
from karios.common.errors import KariosError
from karios.common.telemetry import get_logger
from karios.inventory.devicelock import device_lock
from karios.inventory.netbox_store import NetBoxStore
from karios.inventory.netbox_writer import NetBoxWriter
from karios.inventory.settings import InventorySettings
from karios.inventory.store import InventoryStore
from karios.inventory.writeback import (
    adoption_marker,
    inspection_marker,
    journal_comments,
    journal_kind,
    plan_writeback,
    wanted_nics,
)

log = get_logger(__name__)
DURABLE = "inventory-writeback"
RETRY_DELAY = 15.0  # seconds before a failed write-back (NetBox or the provisioner away) is tried again
RECORD_TIMEOUT = 10.0
RESULTS = ("written", "unchanged", "skipped", "failed", "retry")


@dataclass
class WriteBackMetrics:
    registry: CollectorRegistry
    writes: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.writes = Counter(
            "karios_inventory_writeback",
            "NetBox write-backs by kind (inspection|adoption) and result "
            "(written|unchanged|skipped|failed|retry)",
            ["kind", "result"],
            registry=self.registry,
        )
        for kind in ("inspection", "adoption"):
            for result in RESULTS:
                self.writes.labels(kind, result)


def retry_later(err: KariosError) -> bool:
    """A failure worth another try: NetBox or a service away, not a request NetBox refused (4xx)."""
    status = err.details.get("netbox_status") if isinstance(err.details, dict) else None
    return err.retryable and not (isinstance(status, int) and 400 <= status < 500)


@dataclass
class WriteBack:
    bus: Bus
    db: Database | None
    store: InventoryStore
    settings: InventorySettings
    metrics: WriteBackMetrics | None = None
    on_change: Callable[[DeviceChanged], Awaitable[None]] | None = None
    writer: NetBoxWriter | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if isinstance(self.store, NetBoxStore):
            s = self.settings
            self.writer = NetBoxWriter(
                self.store, disk_role=s.disk_role, gpu_role=s.gpu_role, pxe_field=s.pxe_field
            )

    @property
    def off_reason(self) -> str:
        """Why nothing is written ('' when the write-back is on)."""
        if not self.settings.writeback:
            return "NetBox write-back is off (KARIOS_INVENTORY_WRITEBACK)"
        if self.writer is None:
            return "the inventory is a YAML file, not NetBox: there is nothing to write back to"
        return ""

    @property
    def enabled(self) -> bool:
        return not self.off_reason

    def _count(self, kind: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.writes.labels(kind, result).inc()

    # -- inspections ---------------------------------------------------------------------------
    async def on_inspected(self, evt: HardwareInspected, _envelope: Any = None) -> None:
        """The event handler: a failure worth retrying raises (the event comes back in
        ``RETRY_DELAY`` s); any other is logged and the event dropped."""
        if not self.enabled:
            return
        try:
            rec: HardwareRecord = await self.bus.request(
                self.bus.subjects.query("provision", "hardware"),
                HardwareQuery(bmc_ip=evt.bmc_ip),
                timeout=RECORD_TIMEOUT,
                reply=HardwareRecord,
            )
            await self.write_inspection(rec)
        except KariosError as err:
            if retry_later(err):
                self._count("inspection", "retry")
                log.warning("write-back of an inspection postponed", bmc_ip=evt.bmc_ip, error=err.message)
                raise
            self._count("inspection", "failed")
            log.warning(
                "write-back of an inspection failed", bmc_ip=evt.bmc_ip, code=err.code, error=err.message
            )

    async def write_inspection(self, rec: HardwareRecord) -> NetboxWriteBack:
        """Write one hardware record to the device whose out-of-band IP is its BMC's (else the only
        device with its serial)."""
        if not self.enabled:
            self._count("inspection", "skipped")
            return NetboxWriteBack(written=False, reason=self.off_reason)
        assert self.writer is not None
        device = await self.writer.device_for_record(rec.bmc_ip, rec.system.serial)
        if device is None:
            self._count("inspection", "skipped")
            reason = (
                f"no NetBox device has the out-of-band IP {rec.bmc_ip} (or the serial {rec.system.serial!r})"
            )
            log.info("inspection not written back", bmc_ip=rec.bmc_ip, reason=reason)
            return NetboxWriteBack(written=False, reason=reason)
        title = f"Karios inspection of BMC {rec.bmc_ip} ({rec.driver}), read {rec.inspected_at}"
        return await self._write("inspection", device, rec, marker=inspection_marker(rec), title=title)

    # -- adoption ------------------------------------------------------------------------------
    async def write_back_device(self, q: WriteBackDevice) -> NetboxWriteBack:
        """The adopted server's device (found by name or serial, else created ``planned``), written."""
        if not self.enabled:
            self._count("adoption", "skipped")
            return NetboxWriteBack(written=False, reason=self.off_reason, device_name=q.device.name)
        s = self.settings
        if not (s.writeback_site and s.writeback_role):
            self._count("adoption", "skipped")
            return NetboxWriteBack(
                written=False,
                device_name=q.device.name,
                reason="no site or role to create the NetBox device with: set "
                "KARIOS_INVENTORY_WRITEBACK_SITE and KARIOS_INVENTORY_WRITEBACK_ROLE",
            )
        assert self.writer is not None
        who = f", adopted by {q.requested_by}" if q.requested_by else ""
        title = f"Karios: discovered server {q.source}{who}"
        try:
            async with device_lock(self.db, f"name:{q.device.name}"):
                device = await self.writer.find_device(q.device.name, q.device.serial)
                created = device is None
                if device is None:
                    device = await self.writer.create_device(
                        q.device,
                        site=s.writeback_site,
                        role=s.writeback_role,
                        device_type=s.writeback_device_type,
                        comments=f"Created by Karios from discovered server {q.source}{who}.",
                    )
                    log.info(
                        "NetBox device created",
                        device=device.get("name"),
                        id=device.get("id"),
                        source=q.source,
                    )
                result = await self._write(
                    "adoption",
                    device,
                    q.hardware,
                    marker=adoption_marker(q.source),
                    title=title,
                    created=created,
                )
        except KariosError:
            self._count("adoption", "failed")
            raise
        return result

    # -- both ----------------------------------------------------------------------------------
    async def _write(
        self,
        kind: str,
        device: dict[str, Any],
        rec: HardwareRecord,
        *,
        marker: str,
        title: str,
        created: bool = False,
    ) -> NetboxWriteBack:
        assert self.writer is not None
        t0 = time.monotonic()
        dev_id, name = int(device["id"]), str(device.get("name") or "")
        async with device_lock(self.db, f"id:{dev_id}"):
            state = await self.writer.state(device, [n.mac for n in wanted_nics(rec)])
            plan = plan_writeback(
                rec, state, disk_role=self.settings.disk_role, gpu_role=self.settings.gpu_role
            )
            if (plan.empty or plan.conflict) and await self.writer.journaled(dev_id, marker):
                self._count(kind, "unchanged")
                return NetboxWriteBack(
                    written=not plan.conflict, device_id=dev_id, device_name=name, reason=plan.conflict
                )
            if not plan.conflict:
                await self.writer.apply(state, plan)
            entry = await self.writer.journal(
                dev_id,
                journal_kind(plan),
                journal_comments(plan, title=title, marker=marker, missing=rec.missing),
            )
        changes = plan.changes()
        self._count(kind, "failed" if plan.conflict else ("written" if changes or created else "unchanged"))
        log.info(
            "written back to NetBox" if not plan.conflict else "not written back to NetBox",
            kind=kind,
            device=name,
            device_id=dev_id,
            changes=len(changes),
            notes=len(plan.notes),
            conflict=plan.conflict or None,
            duration_ms=round((time.monotonic() - t0) * 1000),
        )
        if (changes or created) and self.on_change is not None:
            await self.on_change(DeviceChanged(device_id=dev_id, name=name, macs=plan.new_macs))
        return NetboxWriteBack(
            written=not plan.conflict,
            reason=plan.conflict,
            device_id=dev_id,
            device_name=name,
            device_created=created,
            changes=changes,
            journal_entry_id=entry,
        )

    async def start(self) -> None:
        """Consume ``hardware.inspected`` (with the write-back on): one replica per event."""
        if not self.enabled:
            if self.settings.writeback:
                log.warning("NetBox write-back is on but unused", reason=self.off_reason)
            return
        await self.bus.pull_events(
            DURABLE,
            self.bus.subjects.events_of_fact("inventory", "hardware.inspected"),
            HardwareInspected,
            self.on_inspected,
            retry_delay=RETRY_DELAY,
        )
