"""Read a server's hardware through its BMC (the adapter: Redfish GETs through the driver).

Links are followed, never guessed, except where a firmware is known to leave one out (the
FirmwareInventory of a BMC whose UpdateService does not answer). A collection the BMC does not
offer, or answers with an error, is named in ``missing`` and the rest is still read: a partial
record says what it lacks. GETs run ``quirks.inventory_concurrency`` at a time (BMCs are small
computers); the whole read has a deadline (the caller's ``asyncio.timeout``).

Order: service root → System → (Processors, Memory, Storage→Drives | SimpleStorage,
EthernetInterfaces, PCIeDevices from the System's links else its Chassis, FirmwareInventory,
Manager) concurrently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from karios.common.contracts.hardware import Drive, HardwareRecord, PcieDevice
from karios.common.errors import KariosError
from karios.common.telemetry import get_logger
from karios.provisioner.drivers.quirks import Quirks
from karios.provisioner.drivers.redfish import ROOT, RedfishDriver
from karios.provisioner.inspect import parse
from karios.provisioner.inspect.parse import Doc, link, links

log = get_logger(__name__)
T = TypeVar("T")


class Collector:
    """One inspection of one BMC through ``drv`` (already knows its endpoint and system id)."""

    def __init__(self, drv: RedfishDriver, quirks: Quirks) -> None:
        self.drv = drv
        self.quirks = quirks
        self.missing: list[str] = []
        self._gate = asyncio.Semaphore(max(1, quirks.inventory_concurrency))

    async def get(self, uri: str) -> Doc:
        async with self._gate:
            return await self.drv.get(uri)

    async def optional(self, what: str, uri: str) -> Doc | None:
        """GET ``uri``; None (and ``what`` named in ``missing``) if the link is absent or fails."""
        if not uri:
            self.missing.append(f"{what}: not offered by the BMC")
            return None
        try:
            return await self.get(uri)
        except KariosError as exc:
            # A 4xx/5xx of one collection (or a member) is a gap, not a failed inspection; a
            # refused credential or certificate fails the first request (the System) instead.
            self.missing.append(f"{what}: {str(exc)[:160]}")
            log.info(
                "inspection: resource not read", bmc_ip=self.drv.ep.bmc_ip, what=what, error=str(exc)[:200]
            )
            return None

    async def members(self, what: str, uri: str) -> list[Doc]:
        """Every member of a collection (each read; one that fails is named, the others kept)."""
        coll = await self.optional(what, uri)
        if coll is None:
            return []
        return await self.each(what, links(coll, "Members"))

    async def each(self, what: str, uris: list[str]) -> list[Doc]:
        got = await asyncio.gather(*(self.optional(f"{what} {parse.last_segment(u)}", u) for u in uris))
        return [d for d in got if d is not None]

    # -- the collections ----------------------------------------------------------------
    async def drives(self, system: Doc) -> list[Drive]:
        out: list[Drive] = []
        storage_uri = link(system, "Storage")
        if storage_uri:
            for stor in await self.members("Storage", storage_uri):
                ctrl = parse.text(stor.get("Id")) or parse.last_segment(parse.text(stor.get("@odata.id")))
                for d in await self.each(f"Drive of {ctrl}", links(stor, "Drives")):
                    found = parse.drive(d, ctrl)
                    if found is not None:
                        out.append(found)
        if out:
            return out
        # No Storage (older firmware) or no drive found through it: SimpleStorage lists disks inline.
        simple_uri = link(system, "SimpleStorage")
        if simple_uri:
            for ss in await self.members("SimpleStorage", simple_uri):
                out.extend(parse.simple_storage_drives(ss))
        elif not storage_uri:
            self.missing.append("Storage: not offered by the BMC (neither Storage nor SimpleStorage)")
        return out

    async def pcie(self, system: Doc) -> list[PcieDevice]:
        uris = links(system, "PCIeDevices")  # older layout: the System lists its devices
        if not uris:
            chassis = links(system.get("Links") or {}, "Chassis")
            for ch_uri in chassis[:1]:
                ch = await self.optional("Chassis", ch_uri)
                if ch is not None and link(ch, "PCIeDevices"):
                    coll = await self.optional("PCIeDevices", link(ch, "PCIeDevices"))
                    uris = links(coll or {}, "Members")
            if not uris:
                self.missing.append("PCIeDevices: not offered by the BMC")
                return []
        devices = await self.each("PCIeDevice", list(dict.fromkeys(u.rstrip("/") for u in uris)))

        async def one(dev: Doc) -> PcieDevice:
            fn_uris = links(dev, "PCIeFunctions")  # older: a list; newer: a collection link
            if not fn_uris and link(dev, "PCIeFunctions"):
                coll = await self.optional("PCIeFunctions", link(dev, "PCIeFunctions"))
                fn_uris = links(coll or {}, "Members")
            if not fn_uris:  # iDRAC: the functions are linked from Links.PCIeFunctions
                fn_uris = links(dev.get("Links") or {}, "PCIeFunctions")
            functions = await self.each("PCIeFunction", fn_uris[:1]) if fn_uris else []
            return parse.pcie_device(dev, functions, self.quirks)

        return list(await asyncio.gather(*(one(d) for d in devices)))

    async def firmware(self, root: Doc) -> list[Any]:
        upd_uri = link(root, "UpdateService")
        inv_uri = ""
        if upd_uri:
            try:
                inv_uri = link(await self.get(upd_uri), "FirmwareInventory")
            except KariosError:  # the service does not answer; its inventory often still does
                inv_uri = f"{ROOT}/UpdateService/FirmwareInventory"
        docs = await self.members("FirmwareInventory", inv_uri)
        return [c for c in (parse.firmware(d, self.quirks) for d in docs) if c is not None]

    async def manager(self, system: Doc, root: Doc) -> Doc | None:
        uris = links(system.get("Links") or {}, "ManagedBy")
        if not uris and link(root, "Managers"):
            coll = await self.optional("Managers", link(root, "Managers"))
            uris = links(coll or {}, "Members")
        return await self.optional("Manager", uris[0] if uris else "")

    async def run(self, bmc_ip: str, driver: str) -> HardwareRecord:
        started = time.monotonic()
        read_at = datetime.now(UTC)
        root = await self.drv.service_root()
        sys_uri = await self.drv.system_uri()
        system = await self.drv.get(sys_uri)  # fresh: power state now, not a cached read

        async def listed(what: str, key: str, fn: Callable[[Doc], T | None]) -> list[T]:
            docs = await self.members(what, link(system, key))
            return [x for x in map(fn, docs) if x is not None]

        procs, dimms, drives, nics, pcie, firmware, manager = await asyncio.gather(
            listed("Processors", "Processors", parse.processor),
            listed("Memory", "Memory", parse.memory_module),
            self.drives(system),
            listed("EthernetInterfaces", "EthernetInterfaces", lambda d: parse.nic(d, self.quirks)),
            self.pcie(system),
            self.firmware(root),
            self.manager(system, root),
        )
        if not firmware:  # no FirmwareInventory: what the System and the Manager say they run
            firmware = parse.firmware_of_system(system, manager or {})
        total_gib = parse.memory_total_gib(system)
        if total_gib is None and dimms:
            total_gib = round(sum(d.size_mib or 0 for d in dimms) / 1024, 1)
        return HardwareRecord(
            bmc_ip=bmc_ip,
            inspected_at=read_at.isoformat(),
            driver=driver,
            duration_ms=int((time.monotonic() - started) * 1000),
            system=parse.system_info(system),
            processors=procs,
            processor_count=len(procs) or parse.processor_count(system),
            memory_total_gib=total_gib,
            memory=dimms,
            drives=drives,
            nics=nics,
            pcie_devices=pcie,
            gpus=[p for p in pcie if p.is_gpu],
            firmware=firmware,
            bmc=parse.bmc_identity(manager or {}, root),
            missing=sorted(set(self.missing)),
        )
