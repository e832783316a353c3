"""A full disk is a reported state (issue 24 item 5): which store of this process answered its
last write with "full", since when, and how often.

One :class:`StorageAlarm` per store: the database's (:class:`karios.common.db.Database`, set by
its engine's error hook) and the message store's (:class:`karios.common.bus.runtime.Bus`, set by a
refused publish). Both decide "full" with :func:`karios.common.errors.resource_error` (the one
mapping; the caller gets :class:`~karios.common.errors.StorageFull`, 503 + ``Retry-After``).

The alarm clears by itself, without a restart: the database's when a probe write succeeds
(``/readyz`` and every ``/metrics`` scrape run it while the alarm is on), the bus's on the next
publish JetStream stores, or :data:`BUS_HOLD_S` after the last refusal. ``/readyz`` fails the
``storage`` check with the alarm's reason meanwhile; :class:`StorageCollector` exports the
``karios_storage_full`` gauge and the ``karios_storage_full_errors_total`` counter.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: A bus alarm with no probe write ends this long after JetStream last refused a publish (a
#: refusal after that starts it again). The database's ends when its probe write succeeds.
BUS_HOLD_S = 60.0

#: What each store's alarm says in ``/readyz`` (``reasons.storage``).
_WHAT = {
    "database": "the database's disk is full (SQLSTATE 53100): writes fail until space is freed",
    "bus": "the message store (JetStream) is full: publishes are refused until space is freed",
}


@dataclass
class StorageAlarm:
    """Whether ``store``'s last write failed for want of space. Plain state (the clock is passed
    in, or read once per call): no I/O, no driver."""

    store: str
    #: Wall-clock time of the first failure of the current episode (``None``: not full).
    since: float | None = None
    #: Wall-clock time of the latest failure.
    last: float | None = None
    #: Every "full" error seen since the process started (the counter).
    failures: int = 0

    @property
    def active(self) -> bool:
        return self.since is not None

    def record_full(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.failures += 1
        self.last = now
        if self.since is None:
            self.since = now

    def record_ok(self) -> None:
        """A write succeeded: the store has room again."""
        self.since = None

    def expire(self, hold_s: float, now: float | None = None) -> None:
        """End the episode when nothing failed for ``hold_s`` (a store without a probe write)."""
        now = time.time() if now is None else now
        if self.last is not None and now - self.last >= hold_s:
            self.since = None

    def reason(self) -> str | None:
        if self.since is None:
            return None
        stamp = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        what = _WHAT.get(self.store, f"the {self.store} store is full")
        return f"{what} (since {stamp}, {self.failures} failed write(s))"


class StorageCollector(Collector):
    """``karios_storage_full{store}`` (1 while the alarm is on) and
    ``karios_storage_full_errors_total{store}``, read from the alarms at each scrape."""

    def __init__(self, alarms: Iterable[StorageAlarm]) -> None:
        self.alarms = list(alarms)

    def collect(self) -> Iterator[Metric]:
        full = GaugeMetricFamily(
            "karios_storage_full",
            "1 while the store's last write failed for a full disk / store (cleared once a write succeeds)",
            labels=["store"],
        )
        errors = CounterMetricFamily(
            "karios_storage_full_errors",
            "Writes refused because the store's disk or JetStream store was full",
            labels=["store"],
        )
        for alarm in self.alarms:
            full.add_metric([alarm.store], 1.0 if alarm.active else 0.0)
            errors.add_metric([alarm.store], float(alarm.failures))
        yield full
        yield errors
