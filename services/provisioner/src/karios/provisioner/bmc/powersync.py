"""Power-state sync (issue 27 item 7): a periodic, rate-limited read of every known BMC's power
state and health; a change no Karios job made is announced.

Known BMCs: the registry's, the inspected ones (hardware records) and the
configured ones (``bmc_endpoints``). One sweep every ``power_sync_interval`` seconds (0 = off), on
one replica at a time (a transaction-scoped advisory lock; the others skip that sweep). Reads start
at most ``power_sync_rate`` per second and :data:`CONCURRENCY` at once; each is one GET of the
System with the probe's short limits and no retry (a dead BMC costs seconds, not minutes).

The last state is kept in ``provision.bmc_power_states``. When a read differs from it and no job
of that BMC is running, ``karios.evt.provision.power.changed.<ip>`` (:class:`PowerStateChanged`):
e.g. ``powered_off`` by someone else. During a job the new state is recorded silently (the job
changes power itself). The first read of a BMC only records.

Metrics: ``karios_bmc_power_reads_total{result}``, ``karios_bmc_power_changes_total{change,
during_job}``, ``karios_bmc_power_state{state}`` (BMCs per state at the last sweep).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import Field, SQLModel

from karios.common.bus.runtime import Bus
from karios.common.contracts.hardware import PowerStateChanged
from karios.common.contracts.inventory import NodeQuery, NodeSummary
from karios.common.db import Database
from karios.common.errors import KariosError
from karios.common.provisioning import TERMINAL_STATES
from karios.common.telemetry import get_logger
from karios.provisioner.bmc import BmcAccessor
from karios.provisioner.drivers import RedfishDriver, driver_for
from karios.provisioner.inspect.parse import health
from karios.provisioner.inspect.store import HardwareRow
from karios.provisioner.models import SCHEMA, Job

log = get_logger(__name__)
CONCURRENCY = 4
LOCK_KEY = 0x6B70_7379  # "kpsy": one power sync at a time across replicas
STATES = ("On", "Off", "PoweringOn", "PoweringOff", "unknown")

READS = Counter(
    "karios_bmc_power_reads_total", "BMC power-state reads of the power sync", ["result"], registry=None
)
CHANGES = Counter(
    "karios_bmc_power_changes_total",
    "Power-state changes the power sync saw (during_job=false: no Karios job made them)",
    ["change", "during_job"],
    registry=None,
)
IN_STATE = Gauge(
    "karios_bmc_power_state", "Known BMCs per power state at the last sweep", ["state"], registry=None
)
for _r in ("ok", "error"):
    READS.labels(_r)
for _c in ("powered_off", "powered_on", "other"):
    for _j in ("true", "false"):
        CHANGES.labels(_c, _j)
for _s in STATES:
    IN_STATE.labels(_s)


def install(registry: CollectorRegistry) -> None:
    for metric in (READS, CHANGES, IN_STATE):
        with contextlib.suppress(ValueError):  # already in this registry
            registry.register(metric)


class BmcPowerState(SQLModel, table=True):
    """The power state each BMC reported at its last read (migration 0007)."""

    __tablename__ = "bmc_power_states"
    __table_args__ = {"schema": SCHEMA}

    bmc_ip: str = Field(primary_key=True, max_length=64)
    power_state: str = Field(default="", max_length=32)
    health: str = Field(default="", max_length=32)
    read_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    changed_at: datetime = Field(sa_type=sa.DateTime(timezone=True))


P = BmcPowerState.__table__  # type: ignore[attr-defined]


def change_of(previous: str, current: str) -> str:
    if current == "Off":
        return "powered_off"
    if current == "On":
        return "powered_on"
    return "other"


async def paced(
    items: list[str],
    rate: float,
    work: Callable[[str], Awaitable[None]],
    *,
    concurrency: int = CONCURRENCY,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[float]:
    """Run ``work`` for each item, starting at most ``rate`` per second and ``concurrency`` at once.
    Returns when each was started (seconds after the first)."""
    gate = asyncio.Semaphore(concurrency)
    spacing, start = 1.0 / rate, clock()

    async def one(item: str) -> None:
        try:
            await work(item)
        finally:
            gate.release()

    tasks, started = [], []
    for i, item in enumerate(items):
        wait = start + i * spacing - clock()
        if wait > 0:
            await sleep(wait)
        await gate.acquire()
        started.append(clock() - start)
        tasks.append(asyncio.create_task(one(item)))
    await asyncio.gather(*tasks)
    return started


@dataclass
class PowerSync:
    bus: Bus
    db: Database
    bmcs: BmcAccessor
    driver_factory: Any = None
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    last_changes: list[PowerStateChanged] = field(default_factory=list)

    @property
    def interval(self) -> float:
        return float(self.bmcs.cfg.power_sync_interval)

    async def loop(self) -> None:
        while self.interval > 0:
            try:
                await self.sweep()
            except Exception as exc:  # a sweep that failed is logged; the next one runs
                log.warning("power sync sweep failed", error=str(exc)[:300])
            await asyncio.sleep(self.interval)

    async def known(self) -> dict[str, str]:
        """BMC ip → vendor of every BMC the sync reads."""
        out: dict[str, str] = dict.fromkeys(self.bmcs.cfg.bmc_endpoints, "")
        async with self.db.session() as s:
            for (ip,) in (await s.exec(sa.select(HardwareRow.bmc_ip))).all():  # type: ignore[call-overload]
                out.setdefault(ip, "")
        with contextlib.suppress(KariosError):
            nodes = await self.bus.request(
                self.bus.subjects.query("inventory", "nodes"), NodeQuery(), timeout=5.0
            )
            for raw in nodes or []:
                node = NodeSummary.model_validate(raw)  # without credentials: the defaults are tried
                out[node.bmc_ip] = node.vendor or out.get(node.bmc_ip, "")
        return out

    async def sweep(self) -> list[PowerStateChanged]:
        """One read of every known BMC (skipped when another replica is sweeping)."""
        self.last_changes = []
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            if not (await conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(LOCK_KEY)))).scalar():
                log.info("power sync: another replica is sweeping")
                return []
            bmcs = await self.known()
            states: dict[str, str] = {}

            async def work(ip: str) -> None:
                states[ip] = await self._one(ip, bmcs[ip])

            await paced(sorted(bmcs), self.bmcs.cfg.power_sync_rate, work, sleep=self.sleep)
        for state in STATES:
            IN_STATE.labels(state).set(sum(1 for v in states.values() if (v or "unknown") == state))
        return self.last_changes

    async def read(self, ip: str, vendor: str) -> tuple[str, str]:
        from karios.provisioner.inspect.service import target

        ep = await self.bmcs.endpoint(target(ip, vendor), probe=True)
        ep.retries = 0
        cls = driver_for(vendor) if vendor else RedfishDriver
        drv: RedfishDriver = self.driver_factory(cls, ep) if self.driver_factory else cls(ep)
        async with drv:
            system = await drv.get(await drv.system_uri())
        return str(system.get("PowerState") or ""), health(system)

    async def _one(self, ip: str, vendor: str) -> str:
        try:
            state, hlth = await self.read(ip, vendor)
        except KariosError as exc:
            READS.labels("error").inc()
            log.info("power sync: BMC not read", bmc_ip=ip, error=str(exc)[:200])
            return "unknown"
        READS.labels("ok").inc()
        now = datetime.now(UTC)
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            before = (
                await conn.execute(
                    sa.select(P.c.power_state, P.c.read_at).where(P.c.bmc_ip == ip).with_for_update()
                )
            ).first()
            changed = before is not None and before[0] != state
            stmt = pg_insert(P).values(bmc_ip=ip, power_state=state, health=hlth, read_at=now, changed_at=now)
            update = {"power_state": state, "health": hlth, "read_at": now}
            if changed:
                update["changed_at"] = now
            await conn.execute(stmt.on_conflict_do_update(index_elements=[P.c.bmc_ip], set_=update))
            job = None
            if changed:
                job = (
                    await conn.execute(
                        sa.select(Job.id).where(Job.bmc_ip == ip, Job.state.notin_(TERMINAL_STATES)).limit(1)  # type: ignore[attr-defined]
                    )
                ).first()
        if not changed or before is None:
            return state
        change = change_of(before[0], state)
        CHANGES.labels(change, "true" if job else "false").inc()
        if job is not None:
            log.info(
                "power state changed during a job",
                bmc_ip=ip,
                job_id=job[0],
                previous=before[0],
                current=state,
            )
            return state
        evt = PowerStateChanged(
            bmc_ip=ip,
            previous=before[0],
            current=state,
            change=change,
            health=hlth,
            observed_at=now.isoformat(),
            previous_read_at=before[1].isoformat(),
        )
        await self.bus.publish_event(evt, self.bus.subjects.evt("provision", "power.changed", ip), entity=ip)
        self.last_changes.append(evt)
        log.warning("power state changed outside a job", bmc_ip=ip, previous=before[0], current=state)
        return state
