"""JetStream health for Prometheus: stream depths, consumer pending / redeliveries, DLQ depth.

One periodic JSM read (``stream_info`` + ``consumers_info`` of the three streams) in one place;
the last snapshot is exposed by a collector, so a scrape never waits on NATS. One service runs
it (the api-gateway); every other service reads the same numbers from the dashboards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ConsumerStat:
    stream: str
    consumer: str
    pending: int
    ack_pending: int
    redelivered: int


@dataclass(frozen=True, slots=True)
class BusSnapshot:
    streams: dict[str, int]  # stream role (cmd / evt / dlq) → messages held
    consumers: list[ConsumerStat]
    at: float


def _role(subjects: Any) -> dict[str, str]:
    return {subjects.cmd_stream: "cmd", subjects.evt_stream: "evt", subjects.dlq_stream: "dlq"}


@dataclass(eq=False)
class BusStats(Collector):
    """``await refresh()`` reads JetStream; :meth:`collect` exposes the last read."""

    bus: Any  # karios.common.bus.runtime.Bus (the only holder of the NATS client)
    interval: float = 10.0
    snapshot: BusSnapshot | None = None
    failures: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    def register(self, registry: CollectorRegistry) -> BusStats:
        registry.register(self)
        return self

    async def refresh(self) -> BusSnapshot:
        js = self.bus.js
        streams: dict[str, int] = {}
        consumers: list[ConsumerStat] = []
        for name, role in _role(self.bus.subjects).items():
            info = await js.stream_info(name)
            streams[role] = int(info.state.messages or 0)
            for c in await js.consumers_info(name):
                consumers.append(
                    ConsumerStat(
                        role,
                        c.name or c.config.durable_name or "ephemeral",
                        int(c.num_pending or 0),
                        int(c.num_ack_pending or 0),
                        int(c.num_redelivered or 0),
                    )
                )
        self.snapshot = BusSnapshot(streams, consumers, time.time())
        return self.snapshot

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # NATS away: keep the last snapshot, count the failure
                self.failures += 1
                log.warning("bus stats read failed", error=type(exc).__name__)
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="bus-stats")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot
        failures = GaugeMetricFamily(
            "karios_bus_stats_read_failures", "JetStream statistics reads that failed (since start)"
        )
        failures.add_metric([], self.failures)
        yield failures
        if snap is None:
            return
        age = GaugeMetricFamily(
            "karios_bus_stats_timestamp_seconds", "When JetStream statistics were last read"
        )
        age.add_metric([], snap.at)
        yield age
        msgs = GaugeMetricFamily("karios_bus_stream_messages", "Messages held by a stream", labels=["stream"])
        for role, n in sorted(snap.streams.items()):
            msgs.add_metric([role], n)
        yield msgs
        dlq = GaugeMetricFamily("karios_bus_dlq_messages", "Dead letters held (commands that gave up)")
        dlq.add_metric([], snap.streams.get("dlq", 0))
        yield dlq
        labels = ["stream", "consumer"]
        pending = GaugeMetricFamily(
            "karios_bus_consumer_pending", "Messages not yet delivered to a consumer", labels=labels
        )
        ack = GaugeMetricFamily(
            "karios_bus_consumer_ack_pending", "Messages delivered and not yet acknowledged", labels=labels
        )
        redelivered = GaugeMetricFamily(
            "karios_bus_consumer_redelivered", "Redelivered messages awaiting ack", labels=labels
        )
        for c in snap.consumers:
            pending.add_metric([c.stream, c.consumer], c.pending)
            ack.add_metric([c.stream, c.consumer], c.ack_pending)
            redelivered.add_metric([c.stream, c.consumer], c.redelivered)
        yield from (pending, ack, redelivered)
