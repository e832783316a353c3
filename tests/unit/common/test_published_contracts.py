"""The published OpenAPI/AsyncAPI documents must match the code (regenerate: see each message)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from karios.common.settings import KariosSettings

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("module", "path", "cmd"),
    [
        (
            "karios.api_gateway.app",
            "docs/openapi/gateway.json",
            "uv run karios openapi api-gateway > docs/openapi/gateway.json",
        ),
    ],
)
def test_published_openapi_is_current(module, path, cmd):
    create_app = __import__(module, fromlist=["create_app"]).create_app
    current = create_app(KariosSettings(dev_mode=True)).openapi()
    published = json.loads((ROOT / path).read_text())
    assert published == json.loads(json.dumps(current)), f"{path} is stale: run `{cmd}`"


def test_published_asyncapi_is_current():
    from karios.common.contracts.asyncapi import build_document

    current = json.loads(json.dumps(build_document()))
    published = json.loads((ROOT / "docs/asyncapi.json").read_text())
    assert published == current, (
        "docs/asyncapi.json is stale: run `uv run karios asyncapi > docs/asyncapi.json`"
    )
    assert len(current["components"]["messages"]) >= 30


def test_every_event_has_a_channel_senders_receivers_and_a_valid_example():
    """A new Event contract must say where it is published (asyncapi_catalog.EVENT_ROUTES)."""
    from karios.common.bus.envelope import Envelope
    from karios.common.contracts.asyncapi import CONTRACT_MODULES, INTEGRATOR, build_document, message_id
    from karios.common.contracts.asyncapi_catalog import COMMAND_ROUTES, EVENT_ROUTES
    from karios.common.contracts.base import CONTRACTS

    doc = build_document()
    routed = {m for r in (*EVENT_ROUTES, *COMMAND_ROUTES) for m in r.messages}
    events = {m for m in CONTRACTS.values() if m.KIND == "event" and m.__module__ in CONTRACT_MODULES}
    assert events <= routed, f"events without a route: {sorted(m.TYPE for m in events - routed)}"
    for route in (*EVENT_ROUTES, *COMMAND_ROUTES):
        channel = doc["channels"][route.channel]
        assert set(re.findall(r"{(\w+)}", channel["address"])) == set(channel.get("parameters", {}))
        assert route.senders and route.receivers, route.channel
        for model in route.messages:
            message = doc["components"]["messages"][message_id(model)]
            (example,) = message["examples"]
            env = Envelope[model].model_validate(example["payload"])
            assert env.type == model.TYPE and example["headers"]["Nats-Msg-Id"] == env.id
    ops = doc["operations"]
    assert {op["action"] for op in ops.values()} == {"send", "receive"}
    assert all(f"{INTEGRATOR}_receive_{r.channel}" in ops for r in EVENT_ROUTES)


def test_event_channel_addresses_are_the_subjects_services_publish_on():
    from karios.common.bus.subjects import Subjects
    from karios.common.contracts.asyncapi import build_document

    channels = build_document()["channels"]
    sub = Subjects()

    def matches(channel: str, subject: str) -> bool:
        pattern = re.escape(channels[channel]["address"])
        return re.fullmatch(re.sub(r"\\{\w+\\}", r"[^.]+", pattern), subject) is not None

    assert matches("provisionJob", sub.evt("provision", "job.booting", "0192f6a4-5b1e"))
    assert matches("fabric", sub.evt("fabric", "node_ready", "10.0.0.1"))
    assert matches("inventoryNodeRegistered", sub.evt("inventory", "node.registered", "10.9.0.1"))
    assert matches("commandFailed", sub.evt("provision", "command_failed", "j1"))
    assert matches("deadLetters", sub.dlq(sub.cmd("provision", "start")))
    assert matches("provisionStart", sub.cmd("provision", "start"))
    assert not matches("provisionJob", sub.evt("fabric", "node_ready", "10.0.0.1"))


def test_configuration_doc_is_current():
    from karios.cli.configdoc import render

    published = (ROOT / "docs/configuration.md").read_text()
    assert published == render(), (
        "docs/configuration.md is stale: run `uv run karios config-doc > docs/configuration.md`"
    )
