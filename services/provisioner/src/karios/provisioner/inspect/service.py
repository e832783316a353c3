"""Inspection use cases: read a BMC's hardware now (store it, announce it), return the stored record.

A synchronous request with a deadline, not a job: it only reads (nothing on the BMC changes,
nothing to undo or resume after a crash: ask again), and it ends in seconds — a few dozen GETs,
``quirks.inventory_concurrency`` at a time, the whole read bounded by :data:`INSPECT_DEADLINE`
(the gateway waits :data:`GATEWAY_WAIT`). Two requests for one BMC on one replica share one read.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from karios.common.bus.runtime import Bus
from karios.common.contracts.hardware import (
    HardwareInspected,
    HardwareNotInspected,
    HardwareQuery,
    HardwareRecord,
    InspectHardware,
)
from karios.common.contracts.inventory import BmcAccess, BmcAccessQuery
from karios.common.contracts.provision import ProvisionSpec, StartProvision
from karios.common.errors import KariosError, UpstreamError
from karios.common.telemetry import get_logger
from karios.provisioner.bmc import BmcAccessor
from karios.provisioner.drivers import DRIVERS, RedfishDriver, driver_for
from karios.provisioner.inspect.collect import Collector
from karios.provisioner.inspect.parse import vendor_of
from karios.provisioner.inspect.store import HardwareStore

log = get_logger(__name__)
INSPECT_DEADLINE = 60.0  # seconds for the whole read of one BMC
GATEWAY_WAIT = INSPECT_DEADLINE + 15.0  # the gateway's bus timeout: the answer, or its error


def target(bmc_ip: str, vendor: str) -> StartProvision:
    """What :class:`BmcAccessor` resolves an endpoint from (no job: an id that names the use)."""
    return StartProvision(
        job_id=f"inspect:{bmc_ip}", spec=ProvisionSpec(bmc_ip=bmc_ip, vendor=vendor or "generic")
    )


@dataclass
class HardwareService:
    bus: Bus
    bmcs: BmcAccessor
    store: HardwareStore
    driver_factory: Any = None  # (driver class, endpoint) -> RedfishDriver; tests may wrap it
    deadline: float = INSPECT_DEADLINE
    _inflight: dict[str, asyncio.Task[HardwareRecord]] = field(default_factory=dict)

    async def registry_vendor(self, bmc_ip: str) -> str:
        with contextlib.suppress(KariosError):
            access = await self.bus.request(
                self.bus.subjects.query("inventory", "bmc_access"),
                BmcAccessQuery(bmc_ip=bmc_ip),
                timeout=2.0,
                reply=BmcAccess,
            )
            return access.vendor.strip().lower()
        return ""

    async def inspect(self, q: InspectHardware) -> HardwareRecord:
        task = self._inflight.get(q.bmc_ip)
        if task is None:
            task = asyncio.create_task(self._inspect(q.bmc_ip, q.vendor.strip().lower()))
            self._inflight[q.bmc_ip] = task
            task.add_done_callback(lambda _t: self._inflight.pop(q.bmc_ip, None))
        return await asyncio.shield(task)

    async def _inspect(self, bmc_ip: str, vendor: str) -> HardwareRecord:
        vendor = vendor or await self.registry_vendor(bmc_ip)
        cls = driver_for(vendor) if vendor else RedfishDriver
        ep = await self.bmcs.endpoint(target(bmc_ip, vendor), probe=True)
        drv: RedfishDriver = self.driver_factory(cls, ep) if self.driver_factory else cls(ep)
        try:
            async with drv, asyncio.timeout(self.deadline):
                await drv.system_uri()  # first contact: a probe's short limits to reach it at all
                drv.relax()  # it answered: a slow BMC is alive and gets the full limits
                if not vendor:  # detect: the vendor's quirks apply to this driver from now on
                    root = await drv.service_root()
                    system = await drv.system(await drv.system_uri())
                    vendor = vendor_of(root, system)
                    drv.quirks = DRIVERS[vendor].quirks  # type: ignore[misc]
                rec = await Collector(drv, drv.quirks).run(bmc_ip, vendor or drv.vendor)
        except TimeoutError:
            raise UpstreamError(
                f"BMC {bmc_ip}: inspection did not finish within {self.deadline:.0f}s"
            ) from None
        await self.store.save(rec)
        await self.bus.publish_event(
            HardwareInspected.of(rec),
            self.bus.subjects.evt("inventory", "hardware.inspected", bmc_ip),
            entity=bmc_ip,
        )
        log.info(
            "BMC inspected",
            bmc_ip=bmc_ip,
            driver=rec.driver,
            drives=len(rec.drives),
            nics=len(rec.nics),
            gpus=len(rec.gpus),
            missing=len(rec.missing),
            duration_ms=rec.duration_ms,
        )
        return rec

    async def hardware(self, q: HardwareQuery) -> HardwareRecord:
        rec = await self.store.get(q.bmc_ip)
        if rec is None:
            raise HardwareNotInspected(
                f"bmc_ip: BMC {q.bmc_ip} was never inspected (POST /controlnode/bmc/{q.bmc_ip}/inspect)",
                field="bmc_ip",
            )
        return rec

    async def stop(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()


def wire_inspection(bus: Bus, svc: HardwareService) -> None:
    bus.query_responder(
        bus.subjects.request("provision", "inspect_hardware"), InspectHardware, svc.inspect, max_workers=8
    )
    bus.query_responder(bus.subjects.query("provision", "hardware"), HardwareQuery, svc.hardware)
