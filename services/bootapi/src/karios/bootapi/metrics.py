"""bootapi's Prometheus metrics: the names and labels of the seed (prefix ``bootapi_``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from karios.common.telemetry import new_registry


@dataclass
class BootapiMetrics:
    registry: CollectorRegistry = field(default_factory=new_registry)
    _children: dict[tuple[int, tuple[str, ...]], Any] = field(default_factory=dict, repr=False)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once (the hot path: ``labels()`` costs more than
        ``inc()``); created on first use like ``labels()``, so no series appears earlier."""
        key = (id(metric), labels)
        hit = self._children.get(key)
        if hit is None:
            hit = self._children[key] = metric.labels(*labels)
        return hit

    def __post_init__(self) -> None:
        r = self.registry
        self.http_requests = Counter(
            "bootapi_http_requests_total",
            "HTTP requests by endpoint and status class.",
            ["endpoint", "status"],
            registry=r,
        )
        self.render = Counter(
            "bootapi_render_total", "Rendered scripts/configs.", ["kind", "result"], registry=r
        )
        self.lookups = Counter(
            "bootapi_netbox_lookups_total",
            "Host lookups sent to the inventory (cache misses).",
            ["field", "result"],
            registry=r,
        )
        self.lookup_duration = Histogram(
            "bootapi_netbox_lookup_duration_seconds",
            "Inventory host lookup latency.",
            ["field"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.cache_hits = Counter(
            "bootapi_netbox_cache_hits", "Host lookups answered from memory.", registry=r
        )
        self.cache_misses = Counter(
            "bootapi_netbox_cache_misses", "Host lookups that went to the inventory.", registry=r
        )
        self.provisioned = Counter(
            "bootapi_provisioned", "POST /provisioned outcomes.", ["result"], registry=r
        )
        self.ipxe_gated = Counter(
            "bootapi_ipxe_gated", "Known hosts served the fallback because pxe_enabled=false.", registry=r
        )
        self.ipxe_fallback = Counter(
            "bootapi_ipxe_fallback", "iPXE fallback scripts served, by reason.", ["reason"], registry=r
        )
        self.ipxe_discovery = Counter(
            "bootapi_ipxe_discovery",
            "Unknown MACs answered with the live environment in discovery mode (BOOTAPI_DISCOVERY_ENABLED).",
            registry=r,
        )
        self.template_sync = Counter("bootapi_template_sync", "Template git syncs attempted.", registry=r)
        self.template_sync_failures = Counter(
            "bootapi_template_sync_failures",
            "Template git syncs that failed (last good set kept).",
            registry=r,
        )
        self.template_generation = Gauge(
            "bootapi_template_generation", "Generation of the template set being served.", registry=r
        )
        self.ready = Gauge(  # the name every service uses (karios.common.http), set at each scrape
            "karios_service_ready", "Readiness checks at the last scrape (1 ok)", ["check"], registry=r
        )
        for p in ("ok", "unauthorized", "notfound", "error", "disabled"):
            self.provisioned.labels(p)
        for f in ("mac", "name"):  # a burst inside one scrape interval still shows as a rate
            self.lookup_duration.labels(f)
        for k in ("ipxe", "kickstart", "preseed"):
            for res in ("ok", "error"):
                self.render.labels(k, res)

    def set_ready(self, templates_loaded: bool) -> None:
        """bootapi is ready when a template set is parsed (it serves from its cache without the bus)."""
        for check in ("templates", "all"):
            self.ready.labels(check).set(1 if templates_loaded else 0)
