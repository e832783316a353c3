"""The busy rule's answer (issue 23 item 5): a write during a fabric job is a 409 that names the
job, its kind and — for an apply — how to cancel it; it crosses the bus intact."""

from __future__ import annotations

from karios.common.contracts.base import ErrorBody
from karios.common.contracts.fabric_busy import FabricJobRunning, job_kind
from karios.common.contracts.fabric_rollout import JobType
from karios.common.errors import Conflict, error_from_dict, http_status_for

JOB = "1f0c2b9e-0000-4000-8000-000000000001"


def test_an_apply_is_named_with_its_cancel() -> None:
    err = FabricJobRunning.of(JOB, JobType.APPLY)
    assert err.message == (
        f"fabric job {JOB} (apply) is running: wait for it to end or cancel it "
        f"(POST /controlnode/fabric-config/apply/{JOB}/cancel)"
    )
    assert err.details == {
        "job_id": JOB,
        "job_type": "fabric_apply",
        "kind": "apply",
        "cancel": f"/controlnode/fabric-config/apply/{JOB}/cancel",
    }
    assert (err.code, http_status_for(err), err.retryable) == ("FABRIC_JOB_RUNNING", 409, False)
    assert isinstance(err, Conflict)  # every `except Conflict` still catches it


def test_a_teardown_cannot_be_cancelled() -> None:
    err = FabricJobRunning.of(JOB, "fabric_teardown")
    assert (
        err.message
        == f"fabric job {JOB} (teardown) is running: wait for it to end (a teardown cannot be cancelled)"
    )
    assert "cancel" not in err.details and err.details["kind"] == "teardown"


def test_kinds() -> None:
    assert [job_kind(t) for t in JobType] == ["apply", "teardown"]
    assert job_kind("something_new") == "something_new"


def test_it_crosses_the_bus_as_itself() -> None:
    """Worker → inventory → gateway: the code, status, message and details survive each hop."""
    body = ErrorBody.of(FabricJobRunning.of(JOB, JobType.APPLY)).model_dump()
    assert body["http_status"] == 409 and body["code"] == "FABRIC_JOB_RUNNING"
    again = error_from_dict(body)
    assert type(again) is FabricJobRunning and http_status_for(again) == 409
    assert JOB in again.message and again.details["job_id"] == JOB
    relayed = error_from_dict(ErrorBody.of(again).model_dump())
    assert relayed.to_dict() == again.to_dict()
