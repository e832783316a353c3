"""The provisioner's domain metrics (Prometheus names, bounded labels), defined once here.

The metric objects are process-wide; every app's registry gets a collector that forwards them
(``install(registry)``), so call sites increment them without threading an object through.
Labels are bounded: ``vendor`` ∈ VENDORS (+ ``other``), ``state`` ∈ the state machine,
``stage`` ∈ the install methods' stage tables, ``operation`` ∈ :data:`BMC_OPERATIONS`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

import httpx
from prometheus_client import CollectorRegistry, Counter, Histogram, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from karios.common.httpmetrics import meter_client
from karios.common.provisioning import VENDORS
from karios.provisioner.install import INSTALL_STAGES, WIPE_STAGES

STAGE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
BMC_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = tuple(float(m << 20) for m in (8, 32, 64, 128, 256, 512, 1024, 2048, 4096))
BUILD_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

TRANSITIONS = Counter(
    "karios_provision_transitions_total",
    "Jobs entering a state",
    ["job_type", "state", "vendor"],
    registry=None,
)
STAGE_SECONDS = Histogram(
    "karios_provision_stage_seconds",
    "Time from a job's creation (queued) until it entered this state",
    ["job_type", "state"],
    buckets=STAGE_BUCKETS,
    registry=None,
)
FAILURES = Counter(
    "karios_provision_job_failures_total",
    "Jobs that failed, by vendor and the state they failed in",
    ["vendor", "reason"],
    registry=None,
)
INSTALLER_FAILURES = Counter(
    "karios_provision_installer_failures_total",
    "Installer reports of a failed step, by vendor and install stage",
    ["vendor", "stage"],
    registry=None,
)
MEDIA_BUILD_SECONDS = Histogram(
    "karios_provision_media_build_seconds",
    "Boot medium (ISO) build time",
    ["method"],
    buckets=BUILD_BUCKETS,
    registry=None,
)
MEDIA_BYTES = Histogram(
    "karios_provision_media_bytes", "Boot medium (ISO) size", ["method"], buckets=SIZE_BUCKETS, registry=None
)
BMC_SECONDS = Histogram(
    "karios_bmc_request_duration_seconds",
    "Redfish request latency (each try), by vendor and operation",
    ["vendor", "operation"],
    buckets=BMC_BUCKETS,
    registry=None,
)
BMC_REQUESTS = Counter(
    "karios_bmc_requests_total",
    "Redfish requests (each try) by vendor, operation and outcome (2xx/3xx/4xx/5xx/error)",
    ["vendor", "operation", "outcome"],
    registry=None,
)
_ALL: tuple[Collector, ...] = (
    TRANSITIONS,
    STAGE_SECONDS,
    FAILURES,
    INSTALLER_FAILURES,
    MEDIA_BUILD_SECONDS,
    MEDIA_BYTES,
    BMC_SECONDS,
    BMC_REQUESTS,
)

# Every bounded failure series exists from the start, so increase() over a window counts the
# first failure too (a series born at 1 would read as 0).
FAILABLE = ("queued", "building_media", "mounting", "booting", "installing", "first_boot", "stuck")
for _v in (*VENDORS, "other"):
    for _state in FAILABLE:
        FAILURES.labels(_v, _state)
    for _stage in sorted({s.key for s in (*INSTALL_STAGES, *WIPE_STAGES)} | {"other"}):
        INSTALLER_FAILURES.labels(_v, _stage)

# -- pure label helpers ------------------------------------------------------------------

BMC_OPERATIONS = (
    "login",
    "logout",
    "insert_media",
    "eject_media",
    "reset",
    "boot_override",
    "virtual_media",
    "system",
    "manager",
    "root",
    "other",
)
_OPS: tuple[tuple[str | None, re.Pattern[str], str], ...] = (
    ("POST", re.compile(r"/SessionService/Sessions/?$"), "login"),
    ("DELETE", re.compile(r"/SessionService/Sessions/"), "logout"),
    (None, re.compile(r"VirtualMedia\.InsertMedia"), "insert_media"),
    (None, re.compile(r"VirtualMedia\.EjectMedia"), "eject_media"),
    (None, re.compile(r"ComputerSystem\.Reset"), "reset"),
    ("PATCH", re.compile(r"/Systems/[^/]+/?$"), "boot_override"),
    (None, re.compile(r"/VirtualMedia"), "virtual_media"),
    (None, re.compile(r"/Systems"), "system"),
    (None, re.compile(r"/Managers"), "manager"),
    (None, re.compile(r"^/redfish/v1/?$"), "root"),
)


# Redfish resource collections: the segment after one is a member id (``System.Embedded.1``, a
# UUID, ``1``, ``Cd``) — a route template names it ``{id}`` so span names stay few.
_COLLECTIONS = frozenset(
    (
        "Systems",
        "Managers",
        "Chassis",
        "Sessions",
        "Accounts",
        "Roles",
        "VirtualMedia",
        "Tasks",
        "TaskMonitors",
        "EthernetInterfaces",
        "Processors",
        "Memory",
        "Storage",
        "Drives",
        "Volumes",
        "Controllers",
        "StorageControllers",
        "PCIeDevices",
        "PCIeFunctions",
        "NetworkAdapters",
        "NetworkPorts",
        "NetworkDeviceFunctions",
        "Ports",
        "FirmwareInventory",
        "SoftwareInventory",
        "LogServices",
        "Entries",
        "Certificates",
        "Subscriptions",
        "Jobs",
        "SimpleStorage",
        "Registries",
        "Sensors",
        "PowerSupplies",
        "Fans",
    )
)


def redfish_route_template(path: str) -> str:
    """``/redfish/v1/Systems/<id>/VirtualMedia/<id>`` → ``/redfish/v1/Systems/{id}/VirtualMedia/{id}``
    (a bounded set of names; the full path stays in ``url.path``)."""
    parts = path.rstrip("/").split("/")
    out: list[str] = []
    for i, seg in enumerate(parts):
        prev = parts[i - 1] if i else ""
        is_id = prev in _COLLECTIONS and seg not in ("Actions", "Oem", "Settings")
        out.append("{id}" if is_id and seg else seg)
    return "/".join(out) or "/"


def bmc_operation(method: str, path: str) -> str:
    """The bounded operation name of a Redfish request (never the path itself)."""
    for want, pattern, name in _OPS:
        if (want is None or want == method.upper()) and pattern.search(path):
            return name
    return "other"


def vendor_label(vendor: str | None) -> str:
    v = (vendor or "").strip().lower()
    return v if v in VENDORS else "other"


def outcome(status: str) -> str:
    """``"204"`` → ``"2xx"``; an exception name (no response) → ``"error"``."""
    return f"{status[0]}xx" if status.isdigit() and len(status) == 3 else "error"


# -- call sites ----------------------------------------------------------------------------


def meter_bmc(client: object, vendor: str | None) -> None:
    """Time every Redfish request ``client`` sends (the driver's own retries counted one by one)."""
    if not isinstance(client, httpx.AsyncClient):
        return  # a test double without HTTP
    v = vendor_label(vendor)

    def observe(request: httpx.Request, status: str, seconds: float) -> None:
        op = bmc_operation(request.method, request.url.path)
        BMC_SECONDS.labels(v, op).observe(seconds)
        BMC_REQUESTS.labels(v, op, outcome(status)).inc()

    meter_client(client, observe)


def job_moved(
    job_type: str, vendor: str | None, state: str, previous: str, created_at: datetime | None
) -> None:
    """A transition committed: count it and, for a new state, how long the job took to get here."""
    TRANSITIONS.labels(job_type, state, vendor_label(vendor)).inc()
    if state == previous:
        return
    if created_at is not None:
        at = created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC)
        STAGE_SECONDS.labels(job_type, state).observe(max(0.0, (datetime.now(UTC) - at).total_seconds()))
    if state == "failed":
        FAILURES.labels(vendor_label(vendor), previous).inc()


def installer_failed(vendor: str | None, stage: str | None) -> None:
    INSTALLER_FAILURES.labels(vendor_label(vendor), stage or "other").inc()


def medium_built(method: str, started: float, size: int) -> None:
    MEDIA_BUILD_SECONDS.labels(method).observe(time.perf_counter() - started)
    MEDIA_BYTES.labels(method).observe(size)


# -- jobs by type/state/vendor (a gauge read from the job table by the stuck sweep) -------

_job_counts: dict[tuple[str, str, str], int] = {}


def set_job_counts(rows: Iterable[tuple[str, str, str | None, int]]) -> None:
    """Replace the snapshot with ``(job_type, state, vendor, count)`` rows."""
    counts: dict[tuple[str, str, str], int] = {}
    for job_type, state, vendor, n in rows:
        key = (job_type, state, vendor_label(vendor))
        counts[key] = counts.get(key, 0) + int(n)
    _job_counts.clear()
    _job_counts.update(counts)


class _Forward(Collector):
    def collect(self) -> Iterator[Metric]:
        for m in _ALL:
            yield from m.collect()
        g = GaugeMetricFamily(
            "karios_provision_jobs",
            "Jobs in the job table by type, state and vendor (last stuck sweep)",
            labels=["job_type", "state", "vendor"],
        )
        for (job_type, state, vendor), n in sorted(_job_counts.items()):
            g.add_metric([job_type, state, vendor], n)
        yield g


def install(registry: CollectorRegistry, methods: Iterable[str] = ()) -> None:
    """Serve the provisioner's metrics from ``registry`` (one call per app); ``methods``: the
    installed install methods, whose media series exist from the start."""
    for name in methods:
        MEDIA_BUILD_SECONDS.labels(name)
        MEDIA_BYTES.labels(name)
    registry.register(_Forward())
