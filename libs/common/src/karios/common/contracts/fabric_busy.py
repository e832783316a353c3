"""The fabric's one busy rule (issue 23, item 5): while a fabric job (apply or teardown) runs —
or is queued — nothing it rolls out may change under it. The configuration (``POST`` /
``DELETE /controlnode/fabric-config``) and the node set (adopting or removing a compute node)
are refused with :class:`FabricJobRunning`, a 409 naming the job, and nothing is written: the
stored configuration and its ``rollout_status`` keep saying what the nodes carry.

Raised by the fabric worker (it owns the job table); the inventory relays it unchanged (it asks
the worker before it adopts or removes a node). Pure: no I/O.
"""

from __future__ import annotations

from karios.common.errors import Conflict, register_error

#: ``fabric.fabric_jobs.job_type`` → the kind a person reads (``JobType`` in fabric_rollout).
JOB_KINDS = {"fabric_apply": "apply", "fabric_teardown": "teardown"}
CANCEL_PATH = "/controlnode/fabric-config/apply/{job_id}/cancel"


def job_kind(job_type: str) -> str:
    """``apply`` / ``teardown`` (an unknown type is shown as stored)."""
    return JOB_KINDS.get(str(job_type), str(job_type))


@register_error
class FabricJobRunning(Conflict):
    """A fabric job is running: a write that would change what it rolls out is refused (409).
    ``details``: ``job_id``, ``job_type``, ``kind`` and, for an apply, ``cancel`` (the path that
    cancels it). A teardown cannot be cancelled: wait for it to end."""

    code = "FABRIC_JOB_RUNNING"
    http_status = 409

    @classmethod
    def of(cls, job_id: str, job_type: str) -> FabricJobRunning:
        kind = job_kind(job_type)
        details: dict[str, str] = {"job_id": job_id, "job_type": str(job_type), "kind": kind}
        if kind == "apply":
            details["cancel"] = CANCEL_PATH.format(job_id=job_id)
            how = f"wait for it to end or cancel it (POST {details['cancel']})"
        else:
            how = "wait for it to end (a teardown cannot be cancelled)"
        return cls(f"fabric job {job_id} ({kind}) is running: {how}", details=details)
