"""Job summary state (pure): what `GET /fabric-config/latest` shows and how a job ends."""

from __future__ import annotations

import datetime as dt

from karios.common.contracts.fabric_rollout import (
    FabricJobNodeView,
    FabricJobView,
    JobStatus,
    JobType,
    RolloutStatus,
)

# The contract models are the worker's own job summary: no mirror to keep in step.
JobSummary = FabricJobView
JobNode = FabricJobNodeView

__all__ = ["JobNode", "JobStatus", "JobSummary", "JobType", "RolloutStatus", "finalize", "record_node"]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


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
        rollout = RolloutStatus.REMOVED  # not "pending": there is no configuration left to apply
    return summary.model_copy(
        update={
            "job_status": status,
            "rollout_status": rollout,
            "error": error,
            "progress": 100,
            "updated_at": _now(),
        }
    )


def finalize_interrupted(
    summary: JobSummary, *, previous: str, back: list[str], stuck: list[str], cancelled: bool
) -> JobSummary:
    """Terminal status of a job whose replica died, once its touched nodes were rolled back
    (`back`: node IPs; `stuck`: "ip: why" of those that could not be)."""
    error = (
        f"interrupted: the worker running this apply stopped ({previous or 'unknown'}); "
        f"{len(back)} touched node(s) rolled back to baseline"
    )
    if stuck:
        error += f", {len(stuck)} could not be: {'; '.join(stuck)}"
    return summary.model_copy(
        update={
            "completed_nodes": sum(1 for n in summary.nodes if n.ok),
            "failed_nodes": sum(1 for n in summary.nodes if not n.ok),
            "job_status": JobStatus.CANCELLED if cancelled else JobStatus.FAILED,
            "rollout_status": RolloutStatus.DEGRADED if stuck else RolloutStatus.FAILED,
            "progress": 100,
            "error": error,
            "updated_at": _now(),
        }
    )
