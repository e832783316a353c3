"""Telemetry names and the user action (issue 26 item 6): span names stay bounded (a Redfish call
is ``GET /redfish/v1/Systems/{id}``, a reply inbox is ``(temporary)``), one CONSUMER span per
delivery, an expected auth fallback is no error, and ``correlationid`` follows one user action
from the request through every message it causes."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import httpx
import pytest
from opentelemetry import trace
from pydantic import BaseModel

from karios.common.bus.envelope import correlation_scope, current_correlation, wrap
from karios.common.bus.tracing import consumer_span, span_destination
from karios.common.service import ServiceRuntime, build_app, correlation_of
from karios.common.settings import KariosSettings
from karios.common.telemetry_http import expected_statuses, trace_http_client
from karios.provisioner.metrics import redfish_route_template


class Ping(BaseModel):
    TYPE: ClassVar[str] = "karios.test.ping.v1"
    n: int = 0


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/redfish/v1", "/redfish/v1"),
        ("/redfish/v1/", "/redfish/v1"),
        ("/redfish/v1/Systems/System.Embedded.1", "/redfish/v1/Systems/{id}"),
        (
            "/redfish/v1/Systems/3946e8d5-e7a3-4628-aa65-d1238981faee/VirtualMedia/Cd/Actions/"
            "VirtualMedia.InsertMedia",
            "/redfish/v1/Systems/{id}/VirtualMedia/{id}/Actions/VirtualMedia.InsertMedia",
        ),
        ("/redfish/v1/Managers/1/VirtualMedia/2", "/redfish/v1/Managers/{id}/VirtualMedia/{id}"),
        ("/redfish/v1/SessionService/Sessions", "/redfish/v1/SessionService/Sessions"),
        ("/redfish/v1/SessionService/Sessions/a1b2", "/redfish/v1/SessionService/Sessions/{id}"),
        ("/redfish/v1/Systems/1/Bios/Settings", "/redfish/v1/Systems/{id}/Bios/Settings"),
        (
            "/redfish/v1/Managers/iDRAC.Embedded.1/Oem/Dell/Jobs/JID_9",
            "/redfish/v1/Managers/{id}/Oem/Dell/Jobs/{id}",
        ),
        (
            "/redfish/v1/Systems/1/Storage/RAID.1/Drives/Disk.0",
            "/redfish/v1/Systems/{id}/Storage/{id}/Drives/{id}",
        ),
    ],
)
def test_a_redfish_path_has_a_bounded_route_template(path, template):
    assert redfish_route_template(path) == template


async def test_client_spans_are_named_by_route_template_and_an_expected_fallback_is_no_error(spans):
    def bmc(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/Sessions"):
            return httpx.Response(401, json={})
        return httpx.Response(404 if "missing" in request.url.path else 200, json={})

    client = httpx.AsyncClient(base_url="http://10.0.0.5:8000", transport=httpx.MockTransport(bmc))
    trace_http_client(client, template=redfish_route_template, **{"karios.bmc.vendor": "dell"})
    async with client:
        with expected_statuses(401):
            await client.post("/redfish/v1/SessionService/Sessions", json={})
        await client.post("/redfish/v1/SessionService/Sessions", json={})  # not expected here
        await client.get("/redfish/v1/Systems/System.Embedded.1")
        await client.get("/redfish/v1/Systems/missing-7")
    fallback, login, system, missing = spans.get_finished_spans()
    assert fallback.name == "POST /redfish/v1/SessionService/Sessions"
    assert fallback.attributes["http.response.status_code"] == 401
    assert fallback.status.status_code == trace.StatusCode.UNSET and "error.type" not in fallback.attributes
    assert login.status.status_code == trace.StatusCode.ERROR and login.attributes["error.type"] == "401"
    assert system.name == "GET /redfish/v1/Systems/{id}"
    assert system.attributes["url.template"] == "/redfish/v1/Systems/{id}"
    assert system.attributes["url.path"] == "/redfish/v1/Systems/System.Embedded.1"  # the full path stays
    assert missing.name == system.name and missing.status.status_code == trace.StatusCode.ERROR


def test_a_reply_inbox_never_names_a_span():
    assert span_destination("_INBOX.FHWslYdVs2GRLDVtSogHO2.FHWslYdVs2GRLDVtSogIXk4645") == "(temporary)"
    assert span_destination("karios.q.inventory.bmc_hardware") == "karios.q.inventory.bmc_hardware"


def test_one_consumer_span_per_delivery(spans):
    env = wrap(Ping(), source="t", subject="job-1")
    tracer = trace.get_tracer("faststream")
    # Under FastStream's own delivery span: that span is named and annotated, no child is made.
    with (
        tracer.start_as_current_span("karios.cmd.ping.job-1 process", kind=trace.SpanKind.CONSUMER) as outer,
        consumer_span("svc", env, "karios.cmd.ping.job-1", {}) as span,
    ):
        assert span is outer
    # Alone (a pull consumer of our own): its own CONSUMER span.
    with consumer_span("svc", env, "karios.cmd.ping.job-1", {}) as alone:
        pass
    done = spans.get_finished_spans()
    assert [s.name for s in done] == ["process karios.cmd.ping.{entity}"] * 2
    assert all(s.kind == trace.SpanKind.CONSUMER for s in done) and alone is not outer
    assert done[0].attributes["messaging.message.conversation_id"] == env.correlationid


async def test_correlation_follows_the_action_into_every_message_it_causes():
    first = wrap(Ping(), source="t")
    assert first.correlationid == first.id  # no action around it: a new one
    with correlation_scope("action-1"):
        assert current_correlation() == "action-1"
        inside = wrap(Ping(n=1), source="t")
        explicit = wrap(Ping(n=2), source="t", correlationid="other")
        caused = wrap(Ping(n=3), source="t", cause=first)

        async def later() -> str:
            await asyncio.sleep(0)
            return wrap(Ping(n=4), source="t").correlationid

        from_task = await asyncio.create_task(later())  # a task started in the action keeps it
        with correlation_scope(None):  # no id: the enclosing action stays
            kept = wrap(Ping(), source="t").correlationid
    assert (inside.correlationid, explicit.correlationid, from_task, kept) == (
        "action-1",
        "other",
        "action-1",
        "action-1",
    )
    assert caused.correlationid == first.id and caused.causationid == first.id
    assert current_correlation() is None and wrap(Ping(), source="t").correlationid != "action-1"


def test_a_consumer_continues_the_messages_action():
    env = wrap(Ping(), source="t", correlationid="action-7")
    with consumer_span("svc", env, "karios.cmd.ping", {}):
        assert wrap(Ping(), source="svc").correlationid == "action-7"
    assert current_correlation() is None


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        ("console-42", True),
        ("0192f6a4-6000-7000-8000-000000000000", True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("bad\nvalue", False),
        ("", False),
        (None, False),
        ("-leading", False),
    ],
)
def test_a_request_names_its_action(header, kept):
    got = correlation_of(header)
    assert (got == header) is kept and got


async def test_every_response_names_its_action_and_the_bus_messages_carry_it():
    rt = ServiceRuntime("corr-test", KariosSettings(dev_mode=True), use_bus=False)
    app = build_app(rt, title="t")

    @app.post("/act")
    async def act() -> dict[str, str]:
        return {"correlationid": wrap(Ping(), source="corr-test").correlationid}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as c:
        given = await c.post("/act", headers={"X-Correlation-Id": "ui-click-9"})
        fresh = await c.post("/act")
    assert given.headers["x-correlation-id"] == given.json()["correlationid"] == "ui-click-9"
    assert fresh.headers["x-correlation-id"] == fresh.json()["correlationid"] != "ui-click-9"
