"""The AsyncAPI document of the bus, generated from the contract models (never written by hand).

``karios asyncapi > docs/asyncapi.json``; a test fails when the published file is stale.
"""

from __future__ import annotations

import importlib
from typing import Any

from karios.common.contracts.base import CONTRACTS

# Importing these registers every contract (they register themselves on class creation).
CONTRACT_MODULES = (
    "karios.common.contracts.inventory",
    "karios.common.contracts.fabric",
    "karios.common.contracts.fabric_rollout",
    "karios.common.contracts.provision",
    "karios.common.bus.runtime",
)

_CHANNELS = {
    "command": (
        "commands",
        "karios.cmd.{domain}.{verb}",
        "JetStream KARIOS_CMD (work queue; one replica each)",
    ),
    "event": (
        "events",
        "karios.evt.{domain}.{fact}.{entity}",
        "JetStream KARIOS_EVT (replayable; SSE source)",
    ),
    "query": ("requests", "karios.q.{domain}.{what} / karios.req.{domain}.{verb}", "core NATS request/reply"),
}

_ENVELOPE_FIELDS = {
    "specversion": {"type": "string", "const": "1.0"},
    "id": {"type": "string", "description": "UUIDv7; also the Nats-Msg-Id header"},
    "type": {"type": "string"},
    "source": {"type": "string", "description": "emitting service"},
    "time": {"type": "string", "format": "date-time"},
    "subject": {"type": "string", "description": "entity: job id, node IP, BMC IP"},
    "correlationid": {"type": "string"},
    "causationid": {"type": ["string", "null"]},
    "traceparent": {"type": ["string", "null"], "description": "W3C trace context"},
    "datacontenttype": {"type": "string", "const": "application/json"},
}


def build_document() -> dict[str, Any]:
    for module in CONTRACT_MODULES:
        importlib.import_module(module)
    messages: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    by_kind: dict[str, list[str]] = {}
    for type_name in sorted(CONTRACTS):
        model = CONTRACTS[type_name]
        if model.__module__ not in CONTRACT_MODULES:
            continue  # e.g. contracts a test or benchmark defines for itself
        name = type_name.removeprefix("karios.").replace(".", "_")
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for def_name, def_schema in schema.pop("$defs", {}).items():
            schemas[def_name] = def_schema
        schemas[model.__name__] = schema
        messages[name] = {
            "name": type_name,
            "title": model.__name__,
            "summary": (model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else "",
            "contentType": "application/json",
            "payload": {
                "type": "object",
                "required": ["id", "type", "source", "time", "data"],
                "properties": {
                    **_ENVELOPE_FIELDS,
                    "data": {"$ref": f"#/components/schemas/{model.__name__}"},
                },
            },
        }
        by_kind.setdefault(model.KIND or "event", []).append(name)
    channels = {
        key: {
            "address": address,
            "description": description,
            "messages": {m: {"$ref": f"#/components/messages/{m}"} for m in by_kind.get(kind, [])},
        }
        for kind, (key, address, description) in _CHANNELS.items()
    }
    channels["dead_letters"] = {
        "address": "karios.dlq.{original subject without prefix}",
        "description": (
            "JetStream KARIOS_DLQ: commands given up on (headers Karios-Dlq-Reason/-Code/-Deliveries)"
        ),
        "messages": {m: {"$ref": f"#/components/messages/{m}"} for m in by_kind.get("command", [])},
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Karios bus",
            "version": "1",
            "description": "Commands, events and queries between services",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "components": {"messages": messages, "schemas": schemas},
    }
