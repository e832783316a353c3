"""The telemetry core: when traces are exported, the one log pipeline, client spans, job spans."""

from __future__ import annotations

import io
import json
import logging
import sys
import warnings

import httpx
import pytest
import structlog
from opentelemetry import trace

from karios.common import telemetry_tracing
from karios.common.telemetry import _KariosHandler, get_logger, redact, setup_logging
from karios.common.telemetry_http import trace_http_client
from karios.common.telemetry_tracing import job_span, otlp_wanted


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),  # the exporter's default endpoint
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, False),
    ],
)
def test_traces_are_exported_only_when_configured(env, wanted):
    ok, why = otlp_wanted(env)
    assert ok is wanted and (ok or why)


@pytest.fixture
def lines():
    # pytest records warnings per test (its own showwarning); an earlier setup_logging already
    # captured them, so capturing again would be a no-op: re-capture inside this test.
    logging.captureWarnings(False)
    setup_logging("unit-svc", "INFO", json=True)
    handler = next(h for h in logging.getLogger().handlers if isinstance(h, _KariosHandler))
    buf = io.StringIO()
    handler.setStream(buf)
    yield lambda: [json.loads(line) for line in buf.getvalue().splitlines()]
    handler.setStream(sys.stderr)


def test_every_logger_writes_one_json_line_with_the_same_fields(lines):
    logging.getLogger("alembic.runtime.migration").info("Running upgrade %s -> %s", "a", "b")
    logging.getLogger("asyncssh").warning("[conn=0, chan=1] Command: set -e\nip link add vtep0\n")
    logging.getLogger("uvicorn.error").error("boom", exc_info=ValueError("bad\nvalue"))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a deprecated thing", UserWarning, stacklevel=1)
    get_logger("karios.x").info("bound", api_token="kt_secret", nested={"password": "pw"})
    out = lines()
    assert [r["event"] for r in out][:2] == [
        "Running upgrade a -> b",
        "[conn=0, chan=1] Command: set -e\nip link add vtep0\n",
    ]
    for r in out:
        assert {"timestamp", "level", "event", "service"} <= r.keys() and r["service"] == "unit-svc"
    assert out[2]["logger"] == "uvicorn.error" and "ValueError: bad" in out[2]["exception"]
    assert out[3]["logger"] == "py.warnings" and "a deprecated thing" in out[3]["event"]
    assert out[4]["api_token"] == "***" and out[4]["nested"] == {"password": "***"}
    assert (
        logging.getLogger("uvicorn").handlers == [] and logging.getLogger("asyncssh").level == logging.WARNING
    )


def test_url_passwords_are_masked_in_values_messages_and_exceptions(lines):
    url = "nats://karios:pw-in-url@127.0.0.1:4222,nats://karios:pw-2@127.0.0.1:4223"
    get_logger("karios.x").info("bus", servers=url, nested=[{"url": "postgresql://u:pg-pw@db/k"}])
    logging.getLogger("faststream").warning("cannot connect to %s", url)
    try:
        raise ConnectionError(f"connect {url} refused")
    except ConnectionError:
        get_logger("karios.x").exception("bus down")
        logging.getLogger("nats.aio.client").exception("nats: error")
    out = lines()
    text = json.dumps(out)
    assert "pw-in-url" not in text and "pw-2" not in text and "pg-pw" not in text, text
    assert out[0]["servers"] == "nats://karios:***@127.0.0.1:4222,nats://karios:***@127.0.0.1:4223"
    assert out[0]["nested"] == [{"url": "postgresql://u:***@db/k"}]
    assert out[1]["event"].startswith("cannot connect to nats://karios:***@127.0.0.1:4222")
    assert (
        "nats://karios:***@127.0.0.1:4222" in out[2]["exception"] and "ConnectionError" in out[3]["exception"]
    )
    # A URL without a password (the embedded PostgreSQL's socket URL) is left as it is.
    assert (
        redact("postgresql+asyncpg://postgres@/karios?host=/tmp/x")
        == "postgresql+asyncpg://postgres@/karios?host=/tmp/x"
    )


def test_lines_carry_the_span_and_the_bound_job(lines, spans):
    with (
        trace.get_tracer("t").start_as_current_span("work") as span,
        structlog.contextvars.bound_contextvars(job_id="j-1", bmc_ip="10.0.0.5"),
    ):
        logging.getLogger("faststream").info("from the standard library")
        get_logger().info("from structlog")
    ctx = span.get_span_context()
    for r in lines():
        assert r["trace_id"] == format(ctx.trace_id, "032x") and r["span_id"] == format(ctx.span_id, "016x")
        assert (r["job_id"], r["bmc_ip"]) == ("j-1", "10.0.0.5")


async def test_redfish_calls_are_client_spans_with_status_vendor_and_resends(spans):
    answers = iter([503, 200])

    def bmc(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/gone"):
            raise httpx.ConnectError("refused")
        return httpx.Response(next(answers), json={})

    client = httpx.AsyncClient(base_url="http://10.0.0.5:8000", transport=httpx.MockTransport(bmc))
    trace_http_client(client, **{"karios.bmc.vendor": "dell"})
    trace_http_client(client, **{"karios.bmc.vendor": "dell"})  # idempotent: one span per try
    async with client:
        await client.post("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", headers={"X-Auth-Token": "t"})
        await client.post("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", headers={"X-Auth-Token": "t"})
        with pytest.raises(httpx.ConnectError):
            await client.get("/redfish/v1/gone")
    first, second, gone = spans.get_finished_spans()
    assert first.kind == trace.SpanKind.CLIENT and first.name == "POST"
    assert first.attributes["http.response.status_code"] == 503 and first.attributes["error.type"] == "503"
    assert "http.request.resend_count" not in first.attributes
    assert second.attributes["http.request.resend_count"] == 1 and "error.type" not in second.attributes
    assert second.attributes["url.path"] == "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
    assert (
        second.attributes["server.address"] == "10.0.0.5" and second.attributes["karios.bmc.vendor"] == "dell"
    )
    assert (
        gone.attributes["error.type"] == "ConnectError" and gone.status.status_code == trace.StatusCode.ERROR
    )
    assert "t" not in [str(v) for s in (first, second) for v in s.attributes.values()]


def test_job_spans_continue_the_jobs_trace_or_link_to_it(spans):
    with trace.get_tracer("t").start_as_current_span("request") as request:
        stored = telemetry_tracing.current_traceparent()
        with job_span("t", "run", stored, bind={"job_id": "j"}):
            pass
    with job_span("t", "resumed", stored, bind={"job_id": "j"}):  # another replica, no span active
        pass
    with (
        trace.get_tracer("t").start_as_current_span("callback request"),
        job_span("t", "cb", stored, link=True),
    ):
        pass
    got = {s.name: s for s in spans.get_finished_spans()}
    req = request.get_span_context()
    assert got["run"].parent.span_id == req.span_id and not got["run"].links
    assert got["resumed"].context.trace_id == req.trace_id and got["resumed"].parent.span_id == req.span_id
    assert got["cb"].context.trace_id != req.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in got["cb"].links] == [
        (req.trace_id, req.span_id)
    ]
    assert got["run"].attributes["karios.job_id"] == "j"
