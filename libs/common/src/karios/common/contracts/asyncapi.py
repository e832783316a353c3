"""The AsyncAPI 3.0 document of the bus, generated from the contract models (never written by hand).

``karios asyncapi > docs/asyncapi.json``; a test fails when the published file is stale, and the
reference parser (``@asyncapi/parser``, tests/lab/asyncapi) validates it. Channels, their subject
parameters and the send/receive operations come from
:mod:`karios.common.contracts.asyncapi_catalog`; payload schemas from the pydantic models.
"""

from __future__ import annotations

import importlib
import pkgutil
from datetime import UTC, datetime
from typing import Any

import karios.common.contracts as contracts_pkg
from karios.common.bus.deadletter import (
    HEADER_DLQ_CODE,
    HEADER_DLQ_DELIVERIES,
    HEADER_DLQ_REASON,
    HEADER_DLQ_SUBJECT,
)
from karios.common.bus.envelope import HEADER_MSG_ID, HEADER_TRACEPARENT, HEADER_TYPE, Envelope
from karios.common.contracts.asyncapi_catalog import (
    COMMAND_ROUTES,
    EVENT_ROUTES,
    EXAMPLES,
    SUBJECTS,
    Route,
    address,
    param,
)
from karios.common.contracts.base import CONTRACTS, Contract

# Importing these registers every contract (they register themselves on class creation):
# every module of this package, and the bus's own (CommandFailed).
CONTRACT_MODULES = (
    *(
        f"{contracts_pkg.__name__}.{m.name}"
        for m in pkgutil.iter_modules(contracts_pkg.__path__)
        if not m.name.startswith("asyncapi")
    ),
    "karios.common.bus.runtime",
    "karios.common.bus.deadletter",
)

INTEGRATOR = "integrator"  # any other system subscribing to events (docs/integrations.md)

_DESCRIPTION = """\
Commands, events and queries between the Karios services, on NATS with JetStream.

- Every subject starts with the bus prefix (`KARIOS_BUS_PREFIX`, `karios` here); the streams are
  named after it (`KARIOS_EVT`, `KARIOS_CMD`, `KARIOS_DLQ`). Entity tokens that contain dots (IP
  addresses) carry underscores instead (`10.0.0.1` → `10_0_0_1`).
- Events (`<prefix>.evt.>`) are stored 7 days in `KARIOS_EVT`: other systems subscribe with a
  durable pull consumer, replay from a stream sequence or a time, and de-duplicate by the
  envelope `id` (delivery is at least once). Recipe: docs/integrations.md.
- Every message is a CloudEvents-style JSON envelope; the contract is its `data`, named by `type`
  (`karios.<domain>.<name>.v<N>`; a breaking change is a new version, a new message).
- Operations: `send` = the service publishes it, `receive` = the service consumes it;
  `integrator_receive_*` are the subscriptions offered to other systems.
"""

_ENVELOPE_FIELDS = {
    "specversion": {"type": "string", "const": "1.0"},
    "id": {
        "type": "string",
        "description": "unique per message; also the Nats-Msg-Id header: a UUIDv7 for an event, "
        "a command's dedupe id for a command (e.g. its job id, a UUIDv4). "
        "De-duplicate on it: delivery is at least once",
    },
    "source": {"type": "string", "description": "the emitting service"},
    "time": {"type": "string", "format": "date-time"},
    "subject": {"type": "string", "description": "the entity: job id, node IP, BMC IP"},
    "correlationid": {
        "type": "string",
        "description": "one user action across every service: the X-Correlation-Id of the API request "
        "that started it (the caller's, or one the gateway made; every response names it), carried "
        "by every command and event that action causes, in every service",
    },
    "causationid": {"type": ["string", "null"], "description": "the id of the message that caused this one"},
    "traceparent": {"type": ["string", "null"], "description": "W3C trace context"},
    "datacontenttype": {"type": "string", "const": "application/json"},
}

_HEADERS = {
    HEADER_MSG_ID: "the envelope id: JetStream drops a re-publish within the duplicate window (120 s)",
    HEADER_TYPE: "the envelope type (route without parsing the body)",
    HEADER_TRACEPARENT: "W3C trace context of the publishing span (when tracing is on)",
}
_DLQ_HEADERS = {
    HEADER_DLQ_REASON: "why the command was given up on (no secrets)",
    HEADER_DLQ_CODE: "the error code (KariosError.code)",
    HEADER_DLQ_DELIVERIES: "how many times it was delivered",
    HEADER_DLQ_SUBJECT: "the command's original subject",
}


def message_id(model: type[Contract]) -> str:
    return model.TYPE.removeprefix("karios.").replace(".", "_")


def _headers(extra: dict[str, str] | None = None) -> dict[str, Any]:
    fields = {**_HEADERS, **(extra or {})}
    return {
        "type": "object",
        "required": [HEADER_MSG_ID, HEADER_TYPE],
        "properties": {name: {"type": "string", "description": d} for name, d in fields.items()},
    }


def _example(model: type[Contract], route: Route) -> dict[str, Any]:
    data = EXAMPLES[model]
    env = Envelope[model](  # type: ignore[valid-type]
        id="0192f6a4-6000-7000-8000-000000000001",
        type=model.TYPE,
        source=next(s for s, sent in route.senders.items() if model in sent),
        time=datetime(2026, 1, 1, 12, 0, tzinfo=UTC),
        subject=getattr(data, "job_id", "") or getattr(data, "node_ip", ""),
        correlationid="0192f6a4-6000-7000-8000-000000000000",
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        data=data,
    )
    return {
        "name": f"{route.channel}_{message_id(model)}",
        "summary": f"{model.__name__} on {route.channel}",
        "headers": {k: str(v) for k, v in env.headers().items()},
        "payload": env.model_dump(mode="json"),
    }


def _message(model: type[Contract], schemas: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for def_name, def_schema in schema.pop("$defs", {}).items():
        schemas[def_name] = def_schema
    schemas[model.__name__] = schema
    doc = (model.__doc__ or "").strip()
    message: dict[str, Any] = {
        "name": model.TYPE,
        "title": model.__name__,
        "summary": doc.splitlines()[0] if doc else "",
        "contentType": "application/json",
        "correlationId": {"location": "$message.payload#/correlationid"},
        "payload": {
            "type": "object",
            "required": ["id", "type", "source", "time", "data"],
            "properties": {
                **_ENVELOPE_FIELDS,
                "type": {"type": "string", "const": model.TYPE},
                "data": {"$ref": f"#/components/schemas/{model.__name__}"},
            },
        },
    }
    if model.KIND in ("event", "command"):
        message["headers"] = _headers()
    return message


def _channel(route: Route) -> dict[str, Any]:
    channel: dict[str, Any] = {
        "address": address(route.subject),
        "description": route.description
        + (f" Stored in JetStream `{route.stream}`." if route.stream else ""),
        "messages": {
            message_id(m): {"$ref": f"#/components/messages/{message_id(m)}"} for m in route.messages
        },
    }
    if route.parameters:
        channel["parameters"] = {
            name: {
                "description": p.description,
                **({"examples": list(p.examples)} if p.examples else {}),
                **({"enum": list(p.enum)} if p.enum else {}),
            }
            for name, p in route.parameters.items()
        }
    return channel


def _op_id(service: str, action: str, channel: str) -> str:
    return f"{service.replace('-', '')}_{action}_{channel}"


def _operations(route: Route, *, offered: bool) -> dict[str, Any]:
    ch = {"$ref": f"#/channels/{route.channel}"}

    def refs(models: tuple[type[Contract], ...]) -> list[dict[str, str]]:
        return [{"$ref": f"#/channels/{route.channel}/messages/{message_id(m)}"} for m in models]

    ops: dict[str, Any] = {}
    for service, models in route.senders.items():
        ops[_op_id(service, "send", route.channel)] = {
            "action": "send",
            "channel": ch,
            "messages": refs(models),
            "summary": f"{service} publishes {', '.join(m.__name__ for m in models)}",
            "tags": [{"name": service}],
        }
    receivers = dict(route.receivers)
    if offered:
        receivers[INTEGRATOR] = (
            f"a durable pull consumer of `{route.stream}` filtered on this subject "
            "(wildcards for the parameters); replay by sequence or time; de-duplicate by `id`"
        )
    for service, how in receivers.items():
        ops[_op_id(service, "receive", route.channel)] = {
            "action": "receive",
            "channel": ch,
            "messages": refs(route.messages),
            "summary": f"{service} receives {', '.join(m.__name__ for m in route.messages)}",
            "description": how,
            "tags": [{"name": service}],
        }
    return ops


def build_document() -> dict[str, Any]:
    for module in CONTRACT_MODULES:
        importlib.import_module(module)
    contracts = [
        CONTRACTS[t] for t in sorted(CONTRACTS) if CONTRACTS[t].__module__ in CONTRACT_MODULES
    ]  # contracts a test or benchmark defines for itself stay out
    schemas: dict[str, Any] = {}
    messages = {message_id(m): _message(m, schemas) for m in contracts}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for route in (*EVENT_ROUTES, *COMMAND_ROUTES):
        channels[route.channel] = _channel(route)
        operations.update(_operations(route, offered=route in EVENT_ROUTES))
        for model in route.messages:
            messages[message_id(model)]["examples"] = [_example(model, route)]
    commands = tuple(m for r in COMMAND_ROUTES for m in r.messages)
    consumers = sorted({s for r in COMMAND_ROUTES for s in r.receivers})
    dead_letters = Route(
        "deadLetters",
        SUBJECTS.dlq(SUBJECTS.cmd(param("domain"), param("verb"))),
        "Commands given up on (permanent error or retries exhausted), with the reason in headers; "
        "kept 30 days. The command consumer that gave up publishes it.",
        commands,
        {s: tuple(m for r in COMMAND_ROUTES if s in r.receivers for m in r.messages) for s in consumers},
        {},
        stream="KARIOS_DLQ",
    )
    channels["deadLetters"] = _channel(dead_letters)
    for mid in map(message_id, commands):
        channels["deadLetters"]["messages"][mid] = {"$ref": f"#/components/messages/{mid}_dead_letter"}
        messages[f"{mid}_dead_letter"] = {
            **{k: v for k, v in messages[mid].items() if k != "examples"},
            "headers": _headers(_DLQ_HEADERS),
        }
    operations.update(_operations(dead_letters, offered=False))
    routed = {m for r in (*EVENT_ROUTES, *COMMAND_ROUTES) for m in r.messages}
    channels["requests"] = {
        "address": f"{SUBJECTS.prefix}.{{family}}.{{domain}}.{{name}}",
        "description": "Internal request/reply between services (core NATS, not stored): queries "
        "(`q`) and idempotent synchronous commands (`req`). Not a subscription point for other systems.",
        "parameters": {
            "family": {"enum": ["q", "req"], "description": "`q` query, `req` synchronous command"},
            "domain": {"enum": ["fabric", "inventory", "provision"]},
            "name": {"description": "what is asked, e.g. `node_access`, `request_apply`"},
        },
        "messages": {
            message_id(m): {"$ref": f"#/components/messages/{message_id(m)}"}
            for m in contracts
            if m not in routed
        },
    }
    return {
        "asyncapi": "3.0.0",
        "info": {"title": "Karios bus", "version": "1", "description": _DESCRIPTION},
        "defaultContentType": "application/json",
        "servers": {
            "nats": {
                "host": "127.0.0.1:4222",
                "protocol": "nats",
                "description": "The control node's NATS with JetStream (KARIOS_NATS_URL)",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }
