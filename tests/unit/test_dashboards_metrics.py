"""The pure parts behind the dashboards' metrics: bounded labels, the metered httpx transport, the
JetStream statistics collector's exposition, the fabric/provisioner call-site helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from karios.common.bus.stats import BusSnapshot, BusStats, ConsumerStat
from karios.common.httpmetrics import MeteredTransport, meter_client
from karios.fabric_worker import metrics as fabric_metrics
from karios.provisioner import metrics as prov_metrics


@pytest.mark.parametrize(
    ("method", "path", "op"),
    [
        ("POST", "/redfish/v1/SessionService/Sessions", "login"),
        ("DELETE", "/redfish/v1/SessionService/Sessions/12", "logout"),
        ("POST", "/redfish/v1/Managers/1/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia", "insert_media"),
        ("POST", "/redfish/v1/Systems/abc/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia", "eject_media"),
        ("POST", "/redfish/v1/Systems/abc/Actions/ComputerSystem.Reset", "reset"),
        ("PATCH", "/redfish/v1/Systems/abc", "boot_override"),
        ("GET", "/redfish/v1/Systems/abc/VirtualMedia/Cd", "virtual_media"),
        ("GET", "/redfish/v1/Systems/abc", "system"),
        ("GET", "/redfish/v1/Managers/1", "manager"),
        ("GET", "/redfish/v1/", "root"),
        ("GET", "/redfish/v1/UpdateService", "other"),
    ],
)
def test_bmc_operation_is_bounded(method: str, path: str, op: str) -> None:
    assert prov_metrics.bmc_operation(method, path) == op
    assert op in prov_metrics.BMC_OPERATIONS


def test_labels_stay_bounded() -> None:
    assert prov_metrics.vendor_label("Dell") == "dell"
    assert prov_metrics.vendor_label("acme-bmc-9000") == "other"
    assert prov_metrics.vendor_label(None) == "other"
    assert [prov_metrics.outcome(s) for s in ("204", "404", "503", "ReadTimeout")] == [
        "2xx",
        "4xx",
        "5xx",
        "error",
    ]


async def test_metered_transport_sees_responses_and_failures() -> None:
    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/down":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(503 if request.url.path == "/busy" else 200)

    client = httpx.AsyncClient(base_url="http://bmc", transport=httpx.MockTransport(handler))
    meter_client(client, lambda req, status, s: seen.append((req.url.path, status)))
    meter_client(client, lambda req, status, s: seen.append(("twice", status)))  # idempotent
    assert isinstance(client._transport, MeteredTransport)
    await client.get("/ok")
    await client.get("/busy")
    with pytest.raises(httpx.ConnectError):
        await client.get("/down")
    await client.aclose()
    assert seen == [("/ok", "200"), ("/busy", "503"), ("/down", "ConnectError")]


def test_meter_bmc_records_latency_and_outcome_by_vendor_and_operation() -> None:
    before = prov_metrics.BMC_REQUESTS.labels("hp", "reset", "5xx")._value.get()
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    prov_metrics.meter_bmc(client, "HP")
    observe = client._transport.observe  # type: ignore[attr-defined]
    observe(httpx.Request("POST", "http://b/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"), "500", 0.2)
    assert prov_metrics.BMC_REQUESTS.labels("hp", "reset", "5xx")._value.get() == before + 1
    prov_metrics.meter_bmc(object(), "hp")  # a test double without HTTP: ignored


def test_job_moved_counts_and_times_new_states_only() -> None:
    reg = CollectorRegistry()
    prov_metrics.install(reg)
    created = datetime.now(UTC) - timedelta(seconds=42)
    count = prov_metrics.STAGE_SECONDS.labels("provision", "booting")._sum.get()
    prov_metrics.job_moved(
        job_type="provision", vendor="dell", state="booting", previous="mounting", created_at=created
    )
    prov_metrics.job_moved(
        job_type="provision", vendor="dell", state="booting", previous="booting", created_at=created
    )
    assert prov_metrics.STAGE_SECONDS.labels("provision", "booting")._sum.get() == pytest.approx(
        count + 42, abs=5
    )
    failed = prov_metrics.FAILURES.labels("dell", "installing")._value.get()
    prov_metrics.job_moved(
        job_type="provision", vendor="dell", state="failed", previous="installing", created_at=created
    )
    assert prov_metrics.FAILURES.labels("dell", "installing")._value.get() == failed + 1
    rows = [("provision", "installing", "dell", 2), ("provision", "installing", "DELL", 1)]
    prov_metrics.set_job_counts(rows)
    text = generate_latest(reg).decode()
    assert 'karios_provision_jobs{job_type="provision",state="installing",vendor="dell"} 3.0' in text
    assert "karios_provision_transitions_total" in text and "karios_bmc_request_duration_seconds" in text


def test_bus_stats_exposes_the_last_snapshot() -> None:
    stats = BusStats(bus=None)
    reg = CollectorRegistry()
    stats.register(reg)
    assert "karios_bus_stream_messages" not in generate_latest(reg).decode()  # nothing read yet
    stats.snapshot = BusSnapshot(
        {"cmd": 3, "evt": 120, "dlq": 2}, [ConsumerStat("cmd", "provisioner", 3, 1, 1)], at=1.0e9
    )
    text = generate_latest(reg).decode()
    assert "karios_bus_dlq_messages 2.0" in text
    assert 'karios_bus_stream_messages{stream="evt"} 120.0' in text
    assert 'karios_bus_consumer_pending{consumer="provisioner",stream="cmd"} 3.0' in text
    assert 'karios_bus_consumer_redelivered{consumer="provisioner",stream="cmd"} 1.0' in text
    assert "karios_bus_stats_read_failures 0.0" in text


def test_fabric_step_series_exist_before_any_apply_and_gauges_follow_verify() -> None:
    reg = CollectorRegistry()
    fabric_metrics.install(reg)
    text = generate_latest(reg).decode()
    for step in fabric_metrics.STEPS:
        for outcome in fabric_metrics.OUTCOMES:
            assert f'karios_fabric_node_step_seconds_count{{outcome="{outcome}",step="{step}"}}' in text
    fabric_metrics.evpn_seen("198.18.0.99", None)
    fabric_metrics.node_applied("198.18.0.99", False, 3.0)
    text = generate_latest(reg).decode()
    assert 'karios_fabric_node_evpn_sessions_established{node="198.18.0.99"} 0.0' in text
    assert 'karios_fabric_node_last_apply_ok{node="198.18.0.99"} 0.0' in text


def test_timed_step_counts_failures_but_not_cancellations() -> None:
    def count(outcome: str) -> float:
        return sum(
            s.value
            for m in fabric_metrics.NODE_STEP_SECONDS.collect()
            for s in m.samples
            if s.name.endswith("_count") and s.labels == {"step": "verify", "outcome": outcome}
        )

    ok, failed = count("ok"), count("failed")
    with fabric_metrics.timed("verify", ValueError):
        pass
    with pytest.raises(ValueError), fabric_metrics.timed("verify", ValueError):
        raise ValueError("not established")
    with pytest.raises(KeyError), fabric_metrics.timed("verify", ValueError):
        raise KeyError("cancelled")
    assert (count("ok"), count("failed")) == (ok + 1, failed + 1)
