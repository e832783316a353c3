"""Bus wiring of the rollout: each handler takes its typed contract model and calls one use case.

- ``req.fabric.request_apply``    :func:`apply.request_apply`: check, write the job, queue it (202)
- ``cmd.fabric.apply``            :func:`apply.run_apply` (durable; in_progress kept)
- ``cmd.fabric.teardown``         :func:`teardown.run_teardown`: whole-fabric teardown (durable)
- ``req.fabric.cancel_apply``     cancel the in-flight apply, whichever replica runs it (404 otherwise)
- ``bcast.fabric.cancel_apply``   fan-out of a cancel to every replica (no queue group)
- ``req.fabric.preflight``        read-only SSH fan-out; stores HMAC probe + MTU consensus on the config
- ``req.fabric.teardown_node``    remove the fabric from one node
- ``q.fabric.latest``             the latest job summary
- ``q.fabric.postdeploy``         one node's post-deploy checklist
- ``q.fabric.drift``              :func:`drift_watch.drift`: the last drift round (all nodes or one)
- ``q.fabric.diff``               :func:`preview.diff`: what an apply would change per node (read-only)
"""

from __future__ import annotations

from functools import partial

from karios.common.contracts.fabric_diff import FabricDiffQuery
from karios.common.contracts.fabric_rollout import (
    CancelFabricApply,
    FabricDriftQuery,
    FabricLatestQuery,
    FabricPreflightRequest,
    PostdeployQuery,
    RequestFabricApply,
    StartFabricApply,
    StartFabricTeardown,
    TeardownFabricNode,
)
from karios.common.crypto import SecretBox
from karios.common.service import ServiceRuntime
from karios.fabric_worker.rollout import apply, checks, drift_watch, nodes, preview, teardown
from karios.fabric_worker.rollout.service import RolloutService
from karios.fabric_worker.settings import FabricWorkerSettings


def register_rollout(rt: ServiceRuntime, box: SecretBox, settings: FabricWorkerSettings) -> RolloutService:
    """Wire the rollout's handlers on ``rt.bus``; returns the service for app.py's few hooks."""
    svc = RolloutService(rt, box, settings)
    bus, sub = rt.bus, rt.bus.subjects
    bus.ack_wait = settings.ack_wait
    bus.command_handler(
        "fabric", StartFabricApply, partial(apply.run_apply, svc), verb="apply", concurrency=1
    )
    bus.command_handler(
        "fabric", StartFabricTeardown, partial(teardown.run_teardown, svc), verb="teardown", concurrency=1
    )
    bus.broadcast_handler(svc.cancel_subject, CancelFabricApply, partial(apply.on_cancel_broadcast, svc))
    bus.query_responder(
        sub.request("fabric", "request_apply"), RequestFabricApply, partial(apply.request_apply, svc)
    )
    bus.query_responder(sub.request("fabric", "cancel_apply"), CancelFabricApply, partial(apply.cancel, svc))
    bus.query_responder(
        sub.request("fabric", "preflight"), FabricPreflightRequest, partial(checks.preflight, svc)
    )
    bus.query_responder(
        sub.request("fabric", "teardown_node"), TeardownFabricNode, partial(teardown.teardown_node, svc)
    )
    bus.query_responder(sub.query("fabric", "latest"), FabricLatestQuery, partial(apply.latest, svc))
    bus.query_responder(sub.query("fabric", "postdeploy"), PostdeployQuery, partial(checks.postdeploy, svc))
    bus.query_responder(sub.query("fabric", "drift"), FabricDriftQuery, partial(drift_watch.drift, svc))
    bus.query_responder(sub.query("fabric", "diff"), FabricDiffQuery, partial(preview.diff, svc))
    nodes.register_nodes(svc)  # req.fabric.pin_host_key / release_node (node adoption, removal)
    return svc
