"""Job summary state (pure): what `GET /fabric-config/latest` shows and how a job ends."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum

from pydantic import BaseModel, Field


class JobType(StrEnum):
    APPLY = "fabric_apply"
    TEARDOWN = "fabric_teardown"


class JobStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    PARTIAL = "partial"
    CANCELLED = "cancelled"


class RolloutStatus(StrEnum):
    PENDING = "pending"
    ROLLING_OUT = "rolling_out"
    READY = "ready"
    FAILED = "failed"
    DEGRADED = "degraded"


class JobNode(BaseModel):
    node_ip: str
    fqdn: str = ""
    ok: bool = False
    reachable: bool = True
    error: str = ""
    changed: bool = False
    rolled_back: bool = False
    vtep_ip: str = ""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


class JobSummary(BaseModel):
    job_id: str
    job_type: JobType
    job_status: JobStatus = JobStatus.RUNNING
    rollout_status: RolloutStatus = RolloutStatus.ROLLING_OUT
    state: str = ""
    progress: int = 0
    strict: bool = False
    total_nodes: int = 0
    completed_nodes: int = 0
    failed_nodes: int = 0
    first_fail_node: str = ""
    first_fail_error: str = ""
    error: str = ""
    nodes: list[JobNode] = Field(default_factory=list)
    created_at: str = Field(default_factory=_now)
    updated_at: str = Field(default_factory=_now)


def record_node(summary: JobSummary, node: JobNode) -> JobSummary:
    """Add a finished node; the first failure is kept verbatim for the headline."""
    nodes = [n for n in summary.nodes if n.node_ip != node.node_ip] + [node]
    completed = sum(1 for n in nodes if n.ok)
    failed = sum(1 for n in nodes if not n.ok)
    update = {
        "nodes": nodes,
        "completed_nodes": completed,
        "failed_nodes": failed,
        "progress": int(100 * len(nodes) / summary.total_nodes) if summary.total_nodes else 100,
        "updated_at": _now(),
    }
    if not node.ok and not summary.first_fail_node:
        update |= {"first_fail_node": node.node_ip, "first_fail_error": node.error}
    return summary.model_copy(update=update)


def finalize(summary: JobSummary, *, cancelled: bool, aborted_by_strict: bool) -> JobSummary:
    """Terminal job and rollout status from the node outcomes."""
    if cancelled:
        status, rollout, error = JobStatus.CANCELLED, RolloutStatus.FAILED, "cancelled; nodes rolled back"
    elif aborted_by_strict:
        status, rollout = JobStatus.FAILED, RolloutStatus.FAILED
        error = f"strict mode: {summary.first_fail_node} failed, every touched node rolled back"
    elif summary.failed_nodes == 0:
        status, rollout, error = JobStatus.COMPLETED, RolloutStatus.READY, ""
    elif summary.completed_nodes > 0:
        status, rollout = JobStatus.PARTIAL, RolloutStatus.DEGRADED
        error = f"{summary.failed_nodes} of {summary.total_nodes} nodes failed"
    else:
        status, rollout, error = JobStatus.FAILED, RolloutStatus.FAILED, "every node failed"
    if summary.job_type is JobType.TEARDOWN and status is JobStatus.COMPLETED:
        rollout = RolloutStatus.PENDING
    return summary.model_copy(
        update={
            "job_status": status,
            "rollout_status": rollout,
            "error": error,
            "progress": 100,
            "updated_at": _now(),
        }
    )
