"""The fabric worker's domain metrics (Prometheus names, bounded labels), defined once here.

Process-wide metric objects forwarded into each app's registry by ``install(registry)``. Labels:
``step`` ∈ apply/verify/rollback, ``outcome`` ∈ ok/failed, ``node`` = a fabric node's IP
(bounded by the fleet). The per-node gauges come from the last apply/verify this process ran.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric
from prometheus_client.registry import Collector

from karios.common.contracts.fabric_rollout import JobStatus

STEPS = ("apply", "verify", "rollback")
OUTCOMES = ("ok", "failed")
STEP_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)

NODE_STEP_SECONDS = Histogram(
    "karios_fabric_node_step_seconds",
    "Duration of one node's apply (load→diff→commit→verify), verify or rollback, by outcome",
    ["step", "outcome"],
    buckets=STEP_BUCKETS,
    registry=None,
)
NODE_LAST_OK = Gauge(
    "karios_fabric_node_last_apply_ok",
    "1 when the node's last apply succeeded, 0 when it failed",
    ["node"],
    registry=None,
)
NODE_LAST_TS = Gauge(
    "karios_fabric_node_last_apply_timestamp_seconds",
    "Unix time the node's last apply ended",
    ["node"],
    registry=None,
)
EVPN_UP = Gauge(
    "karios_fabric_node_evpn_sessions_established",
    "BGP l2vpn-evpn sessions Established on the node at its last verify (0 or 1: the fabric peer)",
    ["node"],
    registry=None,
)
EVPN_PREFIXES = Gauge(
    "karios_fabric_node_evpn_prefixes_sent",
    "EVPN prefixes the node advertised to the fabric peer at its last verify",
    ["node"],
    registry=None,
)
JOBS = Counter(
    "karios_fabric_jobs_total",
    "Fabric rollout jobs ended, by kind and end state",
    ["kind", "status"],
    registry=None,
)
_ALL: tuple[Collector, ...] = (NODE_STEP_SECONDS, NODE_LAST_OK, NODE_LAST_TS, EVPN_UP, EVPN_PREFIXES, JOBS)

for _step in STEPS:  # every bounded series exists from the start (rates are 0, not absent)
    for _outcome in OUTCOMES:
        NODE_STEP_SECONDS.labels(_step, _outcome)
for _status in JobStatus:
    if _status is not JobStatus.RUNNING:
        JOBS.labels("apply", _status.value)


def step_done(step: str, ok: bool, seconds: float) -> None:
    NODE_STEP_SECONDS.labels(step, "ok" if ok else "failed").observe(max(0.0, seconds))


@contextlib.contextmanager
def timed(step: str, failure: type[BaseException]) -> Iterator[None]:
    """Time a step: ok when it returns, failed when it raises ``failure`` (a cancel is neither)."""
    t0 = time.monotonic()
    try:
        yield
    except failure:
        step_done(step, False, time.monotonic() - t0)
        raise
    step_done(step, True, time.monotonic() - t0)


def node_applied(node: str, ok: bool, seconds: float) -> None:
    step_done("apply", ok, seconds)
    NODE_LAST_OK.labels(node).set(1 if ok else 0)
    NODE_LAST_TS.labels(node).set(time.time())


def evpn_seen(node: str, peer: Any) -> None:
    """From one verify poll: ``peer`` is the parsed EVPN neighbor (``state``, ``pfx_snt``) or None."""
    up = peer is not None and peer.state == "Established"
    EVPN_UP.labels(node).set(1 if up else 0)
    EVPN_PREFIXES.labels(node).set(peer.pfx_snt if peer is not None else 0)


def job_ended(kind: str, status: object) -> None:
    JOBS.labels(kind, str(getattr(status, "value", status))).inc()


class _Forward(Collector):
    def collect(self) -> Iterator[Metric]:
        for m in _ALL:
            yield from m.collect()


def install(registry: CollectorRegistry) -> None:
    """Serve the fabric worker's metrics from ``registry`` (one call per app)."""
    registry.register(_Forward())
