from __future__ import annotations

import uuid

import pytest

from karios.common.bus.envelope import Envelope, RawEnvelope, wrap
from karios.common.bus.subjects import Subjects, token
from karios.common.contracts.inventory import NodeRegistered, RegisterNode


def test_wrap_sets_cloudevents_fields_and_uuid7_id():
    env = wrap(NodeRegistered(bmc_ip="10.0.0.1", created=True), source="inventory", subject="10.0.0.1")
    assert env.type == "karios.inventory.node_registered.v1"
    assert env.source == "inventory" and env.subject == "10.0.0.1"
    assert uuid.UUID(env.id).version == 7
    assert env.correlationid == env.id and env.causationid is None
    assert env.headers()["Nats-Msg-Id"] == env.id


def test_caused_envelope_inherits_correlation_and_names_its_cause():
    cmd = wrap(RegisterNode(bmc_ip="10.0.0.1"), source="api-gateway")
    evt = wrap(NodeRegistered(bmc_ip="10.0.0.1", created=True), source="inventory", cause=cmd)
    assert evt.correlationid == cmd.correlationid
    assert evt.causationid == cmd.id
    assert evt.id != cmd.id


def test_envelope_round_trips_typed_and_raw():
    env = wrap(NodeRegistered(bmc_ip="10.0.0.1", created=False, hostname="n1"), source="inventory")
    raw = RawEnvelope.model_validate_json(env.model_dump_json())
    assert raw.data["hostname"] == "n1"
    typed = Envelope[NodeRegistered].model_validate_json(env.model_dump_json())
    assert typed.data == env.data


def test_wrap_refuses_a_non_contract():
    from pydantic import BaseModel

    class NotAContract(BaseModel):
        x: int = 1

    with pytest.raises(TypeError):
        wrap(NotAContract(), source="x")


def test_subject_builders_and_entity_encoding():
    s = Subjects("karios")
    assert s.cmd("provision", "start") == "karios.cmd.provision.start"
    assert (
        s.evt("inventory", "node.registered", "10.0.0.5") == "karios.evt.inventory.node.registered.10_0_0_5"
    )
    assert s.query("inventory", "host") == "karios.q.inventory.host"
    assert s.dlq("karios.cmd.provision.start") == "karios.dlq.cmd.provision.start"
    assert s.cmd_stream == "KARIOS_CMD" and s.evt_stream == "KARIOS_EVT" and s.dlq_stream == "KARIOS_DLQ"
    assert s.parse_event("karios.evt.fabric.node.applied.10_0_0_5") == ("fabric", "node.applied", "10_0_0_5")
    with pytest.raises(ValueError):
        s.parse_event("karios.cmd.fabric.apply")


@pytest.mark.parametrize("raw", ["a.b", "a b", "a*b", "a>b", ""])
def test_token_never_yields_separators_or_wildcards(raw):
    t = token(raw)
    assert t and not any(c in t for c in ".*> ")


def test_prefix_isolates_streams():
    assert Subjects("t1").cmd_stream == "T1_CMD"
    assert Subjects("t1").all_events == "t1.evt.>"
