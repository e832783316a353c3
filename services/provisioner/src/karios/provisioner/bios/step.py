"""The provisioning job's BIOS step: before its one reset, and after it (issue 27 item 4).

``before_reset``: the intents of the job (``gpu_passthrough`` → virtualization + iommu), the plan
against the BIOS's current attributes, one PATCH of the settings object with only what differs
(the vendor's apply time: it takes effect on the reset the job does anyway, no extra reboot).
``after_reset``: read ``Bios`` back (polling while the BMC still applies it, up to a deadline) and
say which attributes were set and which do not read back as wanted.

Never fatal: a BMC without ``Bios``, an attribute the BIOS lacks, a refused PATCH are reported on
the job's message; when the intent was required by ``gpu_passthrough`` the message says WARNING.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from karios.common.contracts.provision import StartProvision
from karios.common.errors import KariosError
from karios.common.provisioning import gpu_kernel_args
from karios.common.telemetry import get_logger
from karios.provisioner.bios import apply as rf
from karios.provisioner.bios.intents import (
    GPU_PASSTHROUGH_INTENTS,
    BiosPlan,
    Mismatch,
    intents_for,
    plan,
    plan_message,
    readback_message,
    verify,
)
from karios.provisioner.drivers.redfish import RedfishDriver

log = get_logger(__name__)
MAX_NOTE = 700  # characters of the job message the BIOS step may take (messages: 1 KiB)
READBACK_POLL = 1.0


@dataclass
class BiosStep:
    plan: BiosPlan | None
    note: str  # for the job's message at the reset
    resource: rf.BiosResource | None = None
    written: bool = False


def wants_gpu(cmd: StartProvision) -> bool:
    try:
        return bool(gpu_kernel_args(cmd.spec.gpu_passthrough))
    except KariosError:  # validated by the gateway; a bad value here sets nothing
        return False


def _cut(text: str) -> str:
    return text if len(text) <= MAX_NOTE else text[: MAX_NOTE - 1] + "…"


def _gpu_warning(gpu: bool) -> str:
    return (
        " WARNING: gpu_passthrough needs virtualization and iommu set in the BIOS; passthrough may not work"
        if gpu
        else ""
    )


async def before_reset(drv: RedfishDriver, cmd: StartProvision) -> BiosStep | None:
    """Plan and PATCH (only what differs); None when the job has no BIOS intent."""
    gpu = wants_gpu(cmd)
    intents = intents_for(gpu)
    if not intents:
        return None
    required = GPU_PASSTHROUGH_INTENTS if gpu else ()
    try:
        uri = await rf.bios_uri(drv)
        if not uri:
            absent = ", ".join(intents)
            return BiosStep(
                None,
                _cut(f"BIOS: the BMC offers no Bios resource; not set: {absent}.{_gpu_warning(gpu)}"),
            )
        res = await rf.read(drv, uri)
        p = plan(
            drv.vendor, intents, res.attributes, suffixed=drv.quirks.bios_names_suffixed, required=required
        )
        if p.attributes:
            await rf.write(drv, res, p.attributes)
        log.info(
            "BIOS settings planned",
            bmc_ip=drv.ep.bmc_ip,
            set=sorted(p.attributes),
            absent=p.absent,
            unmapped=p.unmapped,
            apply_time=res.apply_time,
        )
        return BiosStep(p, _cut(plan_message(p, res.apply_time)), res, bool(p.attributes))
    except KariosError as exc:
        log.warning("BIOS settings not applied", bmc_ip=drv.ep.bmc_ip, error=str(exc)[:200])
        return BiosStep(None, _cut(f"BIOS settings not applied: {exc.message[:300]}.{_gpu_warning(gpu)}"))


async def after_reset(drv: RedfishDriver, step: BiosStep, deadline: float) -> str:
    """Read back until every wanted attribute reads as wanted or ``deadline`` seconds passed;
    the message for the job ('' when there was nothing to check)."""
    if step.plan is None or step.resource is None or not step.plan.wanted:
        return ""
    end = time.monotonic() + deadline
    mismatches: list[Mismatch] = []
    try:
        while True:
            after = await rf.read(drv, step.resource.uri)
            mismatches = verify(step.plan, after.attributes)
            if not mismatches or time.monotonic() >= end:
                break
            await asyncio.sleep(READBACK_POLL)
        if mismatches:
            mismatches = verify(step.plan, after.attributes, await rf.pending(drv, step.resource))
    except KariosError as exc:
        return _cut(f"BIOS not read back after the reset: {exc.message[:300]}")
    if mismatches:
        log.warning(
            "BIOS attributes do not read back as set",
            bmc_ip=drv.ep.bmc_ip,
            mismatches=[m.attribute for m in mismatches],
        )
    return _cut(readback_message(step.plan, mismatches))
