"""What the Karios dashboards show: one table of panels per dashboard (title, PromQL, unit).

Pure data, no Grafana library: ``build.py`` turns it into dashboards with grafana-foundation-sdk,
and ``tests/integration/test_prometheus_dashboards.py`` runs every query against a real
Prometheus. Template variables: ``$vendor`` (provisioning), ``$node`` (fabric). ``$__rate_interval``
is Grafana's own. A panel with ``trace`` links to Tempo searches of that service's traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RI = "$__rate_interval"
SERVICES = ("api-gateway", "inventory", "provisioner", "bootapi", "fabric-worker")
JOB = 'job=~"karios-.*"'


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str
    unit: str = "short"
    legend: str = ""
    kind: str = "timeseries"  # or "stat"
    trace: str = ""  # service.name whose traces the panel links to
    exemplars: bool = False
    description: str = ""
    width: int = 12


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    variables: dict[str, str] = field(default_factory=dict)  # name → label_values() query


def ratio(errors: str, total: str, by: str) -> str:
    """errors/total, 0 (not absent) when there are no errors."""
    return f"(sum by ({by}) ({errors}) or sum by ({by}) ({total}) * 0) / sum by ({by}) ({total})"


def tagged(*parts: tuple[str, str, str]) -> str:
    """Several series in one query, told apart by a label (``or`` alone would merge them)."""
    return " or ".join(f'label_replace({q}, "{label}", "{value}", "", "")' for label, value, q in parts)


def p95(bucket: str, by: str) -> str:
    return f"histogram_quantile(0.95, sum by ({by}, le) (rate({bucket}[{RI}])))"


OVERVIEW = Dashboard(
    "karios-overview",
    "Karios / Overview",
    "Health of every service, the bus (JetStream) and the database.",
    (
        Panel("Services up", f"up{{{JOB}}}", "bool_yes_no", "{{job}}", "stat"),
        Panel(
            "Services ready", f'karios_service_ready{{check="all",{JOB}}}', "bool_yes_no", "{{job}}", "stat"
        ),
        Panel(
            "Bus reachable", f'karios_service_ready{{check="bus",{JOB}}}', "bool_yes_no", "{{job}}", "stat"
        ),
        Panel(
            "Database reachable",
            f'karios_service_ready{{check="database",{JOB}}}',
            "bool_yes_no",
            "{{job}}",
            "stat",
        ),
        Panel(
            "HTTP requests by service",
            f"sum by (job) (rate(karios_http_requests_total[{RI}]))",
            "reqps",
            "{{job}}",
            trace="api-gateway",
        ),
        Panel(
            "HTTP 5xx ratio by service",
            ratio(
                f'rate(karios_http_requests_total{{status=~"5.."}}[{RI}])',
                f"rate(karios_http_requests_total[{RI}])",
                "job",
            ),
            "percentunit",
            "{{job}}",
        ),
        Panel(
            "HTTP latency p95 by service",
            p95("karios_http_request_duration_seconds_bucket", "job"),
            "s",
            "{{job}}",
            trace="api-gateway",
            exemplars=True,
        ),
        Panel("Bus stream depth", "karios_bus_stream_messages", "short", "{{stream}}"),
        Panel("Dead letters (DLQ depth)", "karios_bus_dlq_messages", "short", "DLQ", "stat"),
        Panel(
            "Consumer pending (not yet delivered)",
            "karios_bus_consumer_pending",
            "short",
            "{{stream}}/{{consumer}}",
        ),
        Panel(
            "Consumer ack pending / redelivered",
            tagged(
                ("what", "ack pending", "karios_bus_consumer_ack_pending"),
                ("what", "redelivered", "karios_bus_consumer_redelivered"),
            ),
            "short",
            "{{what}} {{stream}}/{{consumer}}",
        ),
        Panel(
            "SSE clients connected / dropped for lag (1h)",
            tagged(
                ("what", "connected", "sum(karios_sse_clients)"),
                ("what", "dropped for lag", "sum(increase(karios_sse_client_overflows_total[1h]))"),
            ),
            "short",
            "{{what}}",
        ),
        Panel("Resident memory", f"process_resident_memory_bytes{{{JOB}}}", "bytes", "{{job}}"),
        Panel("CPU by service", f"rate(process_cpu_seconds_total{{{JOB}}}[{RI}])", "percentunit", "{{job}}"),
    ),
)

V = 'vendor=~"$vendor"'
PROVISIONING = Dashboard(
    "karios-provisioning",
    "Karios / Provisioning",
    "Jobs in flight, stage timings, BMC (Redfish) latency and errors, boot media, failures.",
    (
        Panel(
            "Jobs in flight",
            f'sum(karios_provision_jobs{{state!~"completed|failed|cancelled",{V}}}) or vector(0)',
            "short",
            "in flight",
            "stat",
            trace="provisioner",
        ),
        Panel("Jobs by state", f"sum by (state) (karios_provision_jobs{{{V}}})", "short", "{{state}}"),
        Panel(
            "Jobs by vendor and type",
            f"sum by (vendor, job_type) (karios_provision_jobs{{{V}}})",
            "short",
            "{{vendor}} {{job_type}}",
        ),
        Panel(
            "State transitions",
            f"sum by (state) (rate(karios_provision_transitions_total{{{V}}}[{RI}]))",
            "ops",
            "{{state}}",
            trace="provisioner",
        ),
        Panel(
            "Time from queued to each state (p95)",
            p95("karios_provision_stage_seconds_bucket", "state"),
            "s",
            "{{state}}",
            trace="provisioner",
            exemplars=True,
        ),
        Panel(
            "Failures by vendor and reason (1h)",
            f"sum by (vendor, reason) (increase(karios_provision_job_failures_total{{{V}}}[1h]))",
            "short",
            "{{vendor}} failed in {{reason}}",
        ),
        Panel(
            "Installer failures by stage (1h)",
            f"sum by (vendor, stage) (increase(karios_provision_installer_failures_total{{{V}}}[1h]))",
            "short",
            "{{vendor}} {{stage}}",
        ),
        Panel(
            "BMC request latency p95 by vendor and operation",
            p95(f"karios_bmc_request_duration_seconds_bucket{{{V}}}", "vendor, operation"),
            "s",
            "{{vendor}} {{operation}}",
            trace="provisioner",
            exemplars=True,
        ),
        Panel(
            "BMC error ratio by vendor",
            ratio(
                f'rate(karios_bmc_requests_total{{outcome=~"4xx|5xx|error",{V}}}[{RI}])',
                f"rate(karios_bmc_requests_total{{{V}}}[{RI}])",
                "vendor",
            ),
            "percentunit",
            "{{vendor}}",
        ),
        Panel(
            "BMC requests by operation",
            f"sum by (operation, outcome) (rate(karios_bmc_requests_total{{{V}}}[{RI}]))",
            "reqps",
            "{{operation}} {{outcome}}",
        ),
        Panel(
            "Media build time p95",
            p95("karios_provision_media_build_seconds_bucket", "method"),
            "s",
            "{{method}}",
        ),
        Panel(
            "Media size (mean)",
            "sum by (method) (karios_provision_media_bytes_sum)"
            " / sum by (method) (karios_provision_media_bytes_count)",
            "bytes",
            "{{method}}",
        ),
    ),
    {"vendor": "label_values(karios_provision_transitions_total, vendor)"},
)

N = 'node=~"$node"'
FABRIC = Dashboard(
    "karios-fabric",
    "Karios / Fabric",
    "Per-node state and EVPN sessions from the last apply/verify, apply history, drift.",
    (
        Panel(
            "Node last apply succeeded",
            f"karios_fabric_node_last_apply_ok{{{N}}}",
            "bool_yes_no",
            "{{node}}",
            "stat",
        ),
        Panel(
            "EVPN sessions established",
            f"karios_fabric_node_evpn_sessions_established{{{N}}}",
            "short",
            "{{node}}",
            "stat",
        ),
        Panel("EVPN prefixes sent", f"karios_fabric_node_evpn_prefixes_sent{{{N}}}", "short", "{{node}}"),
        Panel(
            "Since the node's last apply",
            f"time() - karios_fabric_node_last_apply_timestamp_seconds{{{N}}}",
            "s",
            "{{node}}",
        ),
        Panel(
            "Node steps by outcome (1h)",
            "sum by (step, outcome) (increase(karios_fabric_node_step_seconds_count[1h]))",
            "short",
            "{{step}} {{outcome}}",
            trace="fabric-worker",
        ),
        Panel(
            "Node step duration p95",
            p95("karios_fabric_node_step_seconds_bucket", "step"),
            "s",
            "{{step}}",
            trace="fabric-worker",
            exemplars=True,
        ),
        Panel(
            "Apply jobs by end state (24h)",
            "sum by (kind, status) (increase(karios_fabric_jobs_total[24h]))",
            "short",
            "{{kind}} {{status}}",
        ),
        Panel("Nodes drifted", "max(karios_fabric_nodes_drifted)", "short", "drifted", "stat"),
        Panel(
            "Fabric API requests",
            "sum by (route, status) "
            f'(rate(karios_http_requests_total{{route=~"/controlnode/fabric.*"}}[{RI}]))',
            "reqps",
            "{{route}} {{status}}",
            trace="api-gateway",
        ),
    ),
    {"node": "label_values(karios_fabric_node_last_apply_ok, node)"},
)

BOOTAPI = Dashboard(
    "karios-bootapi",
    "Karios / Boot API",
    "iPXE/kickstart/preseed requests, the host cache (boot storms), fallbacks, template syncs.",
    (
        Panel(
            "Requests by endpoint",
            f"sum by (endpoint, status) (rate(bootapi_http_requests_total[{RI}]))",
            "reqps",
            "{{endpoint}} {{status}}",
            trace="bootapi",
        ),
        Panel(
            "Host cache hit ratio",
            f"sum(rate(bootapi_netbox_cache_hits_total[{RI}]))"
            f" / (sum(rate(bootapi_netbox_cache_hits_total[{RI}]))"
            f" + sum(rate(bootapi_netbox_cache_misses_total[{RI}])))",
            "percentunit",
            "hit ratio",
        ),
        Panel(
            "Cache hits and misses",
            tagged(
                ("kind", "hit", f"sum(rate(bootapi_netbox_cache_hits_total[{RI}]))"),
                ("kind", "miss", f"sum(rate(bootapi_netbox_cache_misses_total[{RI}]))"),
            ),
            "ops",
            "{{kind}}",
        ),
        Panel(
            "Inventory lookup latency p95",
            p95("bootapi_netbox_lookup_duration_seconds_bucket", "field"),
            "s",
            "{{field}}",
            exemplars=True,
        ),
        Panel(
            "iPXE fallbacks by reason",
            f"sum by (reason) (rate(bootapi_ipxe_fallback_total[{RI}]))",
            "ops",
            "{{reason}}",
        ),
        Panel(
            "Rendered scripts by kind",
            f"sum by (kind, result) (rate(bootapi_render_total[{RI}]))",
            "ops",
            "{{kind}} {{result}}",
        ),
        Panel("Template generation", "max(bootapi_template_generation)", "short", "generation", "stat"),
    ),
)

DASHBOARDS = (OVERVIEW, PROVISIONING, FABRIC, BOOTAPI)
