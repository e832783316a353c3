"""Fabric rollout over SSH: preflight, apply (load → diff → commit → verify → rollback),
cancel, teardown and the post-deploy checklist. Independent of how the fabric config is
stored: callers build a :class:`FabricIntent` and :class:`NodeTarget` list."""

from karios.fabric_worker.rollout.intent import (
    FabricIntent,
    NodeOverride,
    NodeTarget,
    OspfAuthType,
    UnderlayProtocol,
    allocate_vteps,
)
from karios.fabric_worker.rollout.jobs import ApplyJob, JobRegistry, RolloutEvent, run_teardown_job
from karios.fabric_worker.rollout.node import (
    NodeResult,
    NodeRollout,
    RolloutOptions,
)
from karios.fabric_worker.rollout.node_ops import postdeploy_node, teardown_node
from karios.fabric_worker.rollout.preflight import PreflightResult, preflight
from karios.fabric_worker.rollout.summary import JobSummary

__all__ = [
    "ApplyJob",
    "FabricIntent",
    "JobRegistry",
    "JobSummary",
    "NodeOverride",
    "NodeResult",
    "NodeRollout",
    "NodeTarget",
    "OspfAuthType",
    "PreflightResult",
    "RolloutEvent",
    "RolloutOptions",
    "UnderlayProtocol",
    "allocate_vteps",
    "postdeploy_node",
    "preflight",
    "run_teardown_job",
    "teardown_node",
]
