"""The fabric worker's bus handlers on FastStream's in-memory ``TestNatsBroker`` (no NATS, no
database, no inventory): every handler takes its typed model, a bad request is a 422 naming
the field before anything is looked up, the plan is answered, and a cancel broadcast reaches
the replica's job registry."""

from __future__ import annotations

import json

from faststream.nats import TestNatsBroker

from karios.common.bus.envelope import wrap
from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Contract, Reply
from karios.common.contracts.fabric import FabricPlanRequest
from karios.common.contracts.fabric_rollout import (
    CancelFabricApply,
    FabricPreflightRequest,
    PostdeployQuery,
    PreflightOverride,
    RequestFabricApply,
    TeardownFabricNode,
)
from karios.common.settings import KariosSettings
from karios.fabric_worker.app import create_app
from karios.fabric_worker.rollout.service import RolloutService

SETTINGS = KariosSettings(
    _env_file=None,  # type: ignore[call-arg]
    dev_mode=True,
    nats_url="nats://127.0.0.1:1",
    bus_prefix="unit",
    log_json=False,
)


def _app() -> tuple[Bus, RolloutService]:
    """The worker app as wired (its lifespan, NATS and the database unused)."""
    app = create_app(SETTINGS)
    return app.state.runtime.bus, app.state.rollout


def _wire(payload: Contract) -> str:
    return wrap(payload, source="test").model_dump_json()


async def _ask(br: TestNatsBroker, subject: str, payload: Contract | dict) -> Reply:
    body = _wire(payload) if isinstance(payload, Contract) else json.dumps({"data": payload})
    return Reply.model_validate_json((await br.request(body, subject)).body)


def _field(reply: Reply) -> tuple[str, str | None]:
    assert not reply.ok and reply.error is not None, reply
    return reply.error.code, reply.error.field


async def test_bad_requests_are_422_naming_the_field_before_any_lookup() -> None:
    bus, _svc = _app()
    sub = bus.subjects
    bad_override = PreflightOverride(node_ip="10.0.0.5", underlay_iface_hint="eth1", underlay_ip="nope")
    async with TestNatsBroker(bus.broker) as br:
        apply = await _ask(
            br, sub.request("fabric", "request_apply"), RequestFabricApply(node_ip="not-an-ip")
        )
        untyped = await _ask(br, sub.request("fabric", "request_apply"), {"node_ip": ["x"]})
        cidr = await _ask(
            br, sub.request("fabric", "preflight"), FabricPreflightRequest(underlay_cidr="10/33")
        )
        override = await _ask(
            br,
            sub.request("fabric", "preflight"),
            FabricPreflightRequest(underlay_cidr="10.60.200.0/24", node_overrides=[bad_override]),
        )
        node = await _ask(br, sub.request("fabric", "teardown_node"), TeardownFabricNode(node_ip="srv-1"))
        post = await _ask(br, sub.query("fabric", "postdeploy"), PostdeployQuery(node_ip="1.2.3"))
    assert _field(apply) == ("VALIDATION_FAILED", "node_ip")
    assert _field(untyped) == ("VALIDATION_FAILED", "node_ip")
    assert _field(cidr) == ("VALIDATION_FAILED", "underlay_cidr")
    assert _field(override) == ("VALIDATION_FAILED", "node_overrides.0.underlay_ip")
    assert _field(node) == ("VALIDATION_FAILED", "node_ip")
    assert _field(post) == ("VALIDATION_FAILED", "node_ip")


async def test_plan_is_answered_by_the_pure_planner() -> None:
    bus, _svc = _app()
    subject = bus.subjects.query("fabric", "plan")
    req = FabricPlanRequest(
        management_cidr="192.168.111.0/24",
        fabric_switch_nos="eos",
        vxlan_mtu=9216,
        expected_nodes=300,
        public_mtu=1500,
    )
    async with TestNatsBroker(bus.broker) as br:
        ok = await _ask(br, subject, req)
        missing = await _ask(br, subject, req.model_copy(update={"management_cidr": ""}))
    assert ok.ok and ok.result["config"]["router_id_prefix_len"] == 23, ok
    assert ok.result["vtep_capacity"] >= 300 and ok.result["switch_config"]
    assert _field(missing) == ("VALIDATION_FAILED", "management_cidr")


async def test_cancel_broadcast_reaches_the_registry_and_a_malformed_one_is_dropped() -> None:
    bus, svc = _app()
    seen: list[str] = []
    svc.registry.cancel_local = lambda job_id: seen.append(job_id) or True  # type: ignore[method-assign]
    async with TestNatsBroker(bus.broker) as br:
        await br.publish(_wire(CancelFabricApply(job_id="job-1")), svc.cancel_subject)
        await br.publish(json.dumps({"type": CancelFabricApply.TYPE, "data": {}}), svc.cancel_subject)
        await br.publish(_wire(RequestFabricApply(node_ip="10.0.0.1")), svc.cancel_subject)
    assert seen == ["job-1"]
