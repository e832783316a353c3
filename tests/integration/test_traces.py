"""One provision on the Redfish emulator is one trace across the services, exported over OTLP/HTTP.

``karios up`` runs every service as its own process with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing
at a receiver in this test (tests/fixtures/otlp.py). The test's request carries a
``traceparent``: the gateway continues it, so the trace id is known up front.
"""

from __future__ import annotations

import pytest

from tests.fixtures.chaos import KariosUp, state_dir
from tests.fixtures.otlp import OtlpReceiver, Span, ancestors, env_for, render_tree
from tests.fixtures.wait import wait_until_sync
from tests.fixtures.workload import BMCS, new_traceparent, provision_env, provision_once, running_emulator

pytestmark = [pytest.mark.integration, pytest.mark.lab]

GATEWAY, PROVISIONER, INVENTORY = "karios-api-gateway", "karios-provisioner", "karios-inventory"
CORRELATION = "traces-test-action-1"


@pytest.fixture(scope="module")
def emulator():
    with running_emulator() as emu:
        yield emu


def _redfish(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.kind == "CLIENT" and "karios.bmc.vendor" in s.attributes]


def test_a_provision_is_one_trace_from_the_gateway_to_the_redfish_calls(emulator):
    with OtlpReceiver() as rx, state_dir("karios-traces-") as state:
        up = KariosUp(state, env={**provision_env(emulator, state), **env_for(rx.endpoint)})
        try:
            up.wait_started()
            trace_id, traceparent = new_traceparent()
            job = provision_once(up, state / "media", BMCS[0], traceparent, correlationid=CORRELATION)

            def received() -> list[Span] | None:
                # Spans arrive in batches as each ends: wait for the last ones of each trace (the
                # gateway's server spans end after the replies they wait for).
                spans = rx.snapshot()
                callbacks = [s for s in spans if s.name.startswith("provision.installer.")]
                reset = [s for s in _redfish(spans) if s.attributes.get("url.path", "").endswith(".Reset")]
                servers = {s.trace_id for s in spans if s.kind == "SERVER" and s.service == GATEWAY}
                done = len(callbacks) >= 2 and all(cb.trace_id in servers for cb in callbacks)
                return (
                    spans
                    if done and trace_id in {s.trace_id for s in reset} and trace_id in servers
                    else None
                )

            spans = wait_until_sync(received, timeout=60, interval=0.3, what="the provision's spans")
        finally:
            up.stop()

    assert spans is not None
    tree = [s for s in spans if s.trace_id == trace_id]
    by_id = {s.span_id: s for s in tree}
    print(f"\ntrace {trace_id} ({len(tree)} spans):\n{render_tree(tree)}")

    # The gateway continued the caller's trace: its server span is the request.
    root = [s for s in tree if s.kind == "SERVER" and s.service == GATEWAY]
    assert root and root[0].parent_id == traceparent.split("-")[2], root
    assert root[0].attributes["http.request.method"] == "POST"
    assert root[0].attributes["http.route"] == "/controlnode/provision/dell"
    assert root[0].attributes["http.response.status_code"] == 202

    # Every Redfish call of the job is in that trace, with method, path, status and vendor ...
    redfish = _redfish(tree)
    paths = {(s.attributes["http.request.method"], s.attributes["url.path"]) for s in redfish}
    assert any(m == "POST" and p.endswith("VirtualMedia.InsertMedia") for m, p in paths), paths
    assert any(m == "POST" and p.endswith("ComputerSystem.Reset") for m, p in paths), paths
    for s in redfish:
        assert s.service == PROVISIONER and s.attributes["karios.bmc.vendor"] == "dell"
        assert isinstance(s.attributes.get("http.response.status_code"), int), s
        assert "authorization" not in str(s.attributes).lower() and emulator.password not in str(s.attributes)

    # ... and descends from the gateway request through the bus and the provisioner's job.
    reset = next(s for s in redfish if s.attributes["url.path"].endswith(".Reset"))
    chain = ancestors(reset, by_id)
    names = [(s.service, s.kind, s.name) for s in chain]
    assert chain[-1] is root[0], names
    job_run = [s for s in chain if s.name == "provision.job.run"]
    assert job_run and job_run[0].attributes["karios.job_id"] == job.job_id, names
    consumer = [s for s in chain if s.kind == "CONSUMER" and s.service == PROVISIONER]
    producer = [s for s in chain if s.kind == "PRODUCER" and s.service == GATEWAY]
    assert consumer and consumer[0].attributes["messaging.system"] == "nats", names
    assert producer and producer[0].attributes["messaging.destination.name"].endswith("cmd.provision.start")
    assert producer[0].attributes["messaging.message.id"] == job.job_id

    # The media build, the inventory's answers and the job's events are part of it too.
    assert any(
        s.name == "provision.media.build" and s.attributes.get("karios.media.bytes", 0) > 0 for s in tree
    )
    services = {s.service for s in tree}
    assert {GATEWAY, PROVISIONER, INVENTORY} <= services, services
    cross = {(by_id[s.parent_id].service, s.service) for s in tree if s.parent_id in by_id}
    cross = {edge for edge in cross if edge[0] != edge[1]}
    assert (GATEWAY, PROVISIONER) in cross and any(child == INVENTORY for _, child in cross), cross
    events = [
        s
        for s in tree
        if s.kind == "PRODUCER" and ".evt.provision." in s.attributes.get("messaging.destination.name", "")
    ]
    assert events and all(s.service == PROVISIONER for s in events)
    # The gateway's read model (a durable pull consumer) projects those events in the same trace.
    projected = [
        s for s in tree if s.kind == "CONSUMER" and s.service == GATEWAY and by_id.get(s.parent_id) in events
    ]
    assert projected, "the read model's consumption of the job's events is not in the trace"
    relayed = [s for s in tree if s.name.startswith("deliver ") and by_id.get(s.parent_id) in events]
    assert relayed and all(s.service == GATEWAY for s in relayed)  # the SSE relay's ordered subscription

    # The installer's callbacks come later, in their own requests' traces, linked to the job's.
    callbacks = [s for s in spans if s.name.startswith("provision.installer.")]
    assert {s.name for s in callbacks} >= {"provision.installer.step", "provision.installer.complete"}
    for cb in callbacks:
        assert cb.trace_id != trace_id and cb.attributes["karios.job_id"] == job.job_id
        assert any(t == trace_id for t, _ in cb.links), cb.links
        own = {s.span_id: s for s in spans if s.trace_id == cb.trace_id}
        up_chain = ancestors(cb, own)
        assert up_chain and up_chain[-1].service == GATEWAY and up_chain[-1].kind == "SERVER", up_chain

    # Names stay bounded (OpenTelemetry conventions): Redfish calls by route template, no reply
    # inbox in any name; one CONSUMER span per delivery; a healthy provision has no error span.
    assert not [s.name for s in spans if "_INBOX" in s.name]
    system = [s for s in redfish if s.attributes["url.path"].startswith("/redfish/v1/Systems/")]
    assert system and all(
        s.name == f"{s.attributes['http.request.method']} {s.attributes['url.template']}" for s in redfish
    )
    assert all("{id}" in s.name for s in system), [s.name for s in system]
    deliveries: dict[tuple[str, str], int] = {}
    for s in tree:
        mid = s.attributes.get("messaging.message.id")
        if s.kind == "CONSUMER" and mid and not s.name.startswith("deliver "):
            deliveries[(s.service, str(mid))] = deliveries.get((s.service, str(mid)), 0) + 1
    assert deliveries and max(deliveries.values()) == 1, deliveries
    assert not [(s.service, s.name) for s in tree if s.status == "ERROR"]

    # correlationid: the user's action (its X-Correlation-Id) is on every message it caused.
    sent = [s for s in tree if s.kind == "PRODUCER" and s.name.startswith("send ")]
    assert {"karios.cmd.provision.start"} <= {s.attributes["messaging.destination.name"] for s in sent}
    assert {s.attributes.get("messaging.message.conversation_id") for s in sent} == {CORRELATION}, [
        (s.name, s.attributes.get("messaging.message.conversation_id")) for s in sent
    ]
