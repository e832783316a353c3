"""A fabric apply on the FRR lab (real sshd + FRR in namespaces) is one trace: the job's span,
one span per node, and per node its SSH steps — load, diff, commit, verify — and the rollback.

node3 can never reach the route reflector, so with ``strict`` its verify fails and every node is
rolled back: the trace shows the failed verify and three rollbacks. The spans are collected in
memory from the process's tracer provider (the OTLP path is tests/integration/test_traces.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from karios.common import telemetry_tracing
from karios.fabric_worker.rollout import ApplyJob, FabricIntent, NodeTarget, RolloutOptions, allocate_vteps
from karios.fabric_worker.rollout.jobs import JobRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
import fabric_lab

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.fabric_lab]
CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module")
def lab():
    fabric_lab.require_lab()
    with fabric_lab.FabricLab(n_nodes=3, prefix="kt") as lab:
        yield lab


@pytest.fixture
def spans():
    telemetry_tracing.setup_tracing("fabric-worker")
    exporter = InMemorySpanExporter()
    assert telemetry_tracing._tracer_provider is not None
    telemetry_tracing._tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the processor stays registered, but exports nothing more


async def test_a_fabric_apply_is_one_trace_with_a_span_per_node_and_its_ssh_steps(lab, spans) -> None:
    intent = FabricIntent(
        asn=65000,
        peer_ip=fabric_lab.FABRIC_IP,
        router_id_base="198.19.1.1",
        router_id_prefix_len=24,
        underlay_cidr="198.18.0.0/24",
        vxlan_mtu=9000,
        vnis=[100],
        frr_log_file="/run/frr/frr.log",
    )
    key = Path(lab.client_key_path).read_text()
    ts = [
        NodeTarget(node_ip=n.underlay_ip, fqdn=n.name, private_key=key, known_host_key=n.host_public_key)
        for n in lab.nodes
    ]
    lab.node_exec(3, "ip route add blackhole 198.18.0.1/32")  # node3 never reaches the RR
    opts = RolloutOptions(connect_timeout=5, verify_timeout=6, verify_interval=0.3)
    job = ApplyJob(intent, ts, allocate_vteps(intent, [t.node_ip for t in ts]), strict=True, options=opts)
    tracer = trace.get_tracer("test")
    try:
        with tracer.start_as_current_span("POST /controlnode/fabric/apply") as request:
            summary = await JobRegistry().start(job)
    finally:
        lab.node_exec(3, "ip route del blackhole 198.18.0.1/32")
    assert summary.job_status == "failed"

    got = [s for s in spans.get_finished_spans() if s.context.trace_id == request.get_span_context().trace_id]
    by_id = {s.context.span_id: s for s in got}

    def parent(s):  # type: ignore[no-untyped-def]
        return by_id.get(s.parent.span_id) if s.parent else None

    run = [s for s in got if s.name == "fabric.apply.run"]
    assert len(run) == 1 and run[0].attributes["karios.job_id"] == job.job_id
    assert parent(run[0]).name == "POST /controlnode/fabric/apply"
    nodes = {s.attributes["karios.node"]: s for s in got if s.name == "fabric.node.apply"}
    assert set(nodes) == {t.node_ip for t in ts}
    assert all(parent(s) is run[0] for s in nodes.values())
    for ip, node in nodes.items():
        steps = [s.name for s in sorted(got, key=lambda s: s.start_time) if parent(s) is node]
        # The post-deploy overlay checks follow a verify that passed (node3's fails: none), then
        # the DF probe's outcome — unless node3's failure aborted the strict job first.
        checks = [] if ip == ts[2].node_ip else ["fabric.node.overlay_checks"]
        base = ["fabric.node.load", "fabric.node.diff", "fabric.node.commit", "fabric.node.verify", *checks]
        assert steps[: len(base)] == base, (ip, steps)
        assert steps[len(base) :] in ([], ["fabric.node.probe"] if checks else []), (ip, steps)
    node3 = nodes[ts[2].node_ip]
    verify3 = next(s for s in got if s.name == "fabric.node.verify" and parent(s) is node3)
    assert verify3.status.status_code == trace.StatusCode.ERROR
    assert node3.status.status_code == trace.StatusCode.ERROR
    rollbacks = [s for s in got if s.name == "fabric.node.rollback"]
    assert {s.attributes["karios.node"] for s in rollbacks} == set(nodes)
    assert all(s.attributes["karios.outcome"] == "ok" and parent(s) is run[0] for s in rollbacks)
