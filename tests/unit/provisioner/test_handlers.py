"""The provisioner's bus handlers on FastStream's in-memory ``TestNatsBroker`` (no NATS server):
each typed contract reaches its use case, a malformed request is an error reply naming the field.

The start command is a JetStream consumer (it reads the delivery count from JetStream metadata,
which the in-memory broker does not provide): it is covered by tests/integration/provisioner."""

from __future__ import annotations

import json

from faststream.nats import TestNatsBroker

from karios.common.bus.envelope import wrap
from karios.common.bus.runtime import Bus
from karios.common.bus.subjects import Subjects
from karios.common.contracts.base import Contract
from karios.common.contracts.provision import (
    CallbackRequestV2,
    CancelJob,
    JobRequestQuery,
    JobRequestView,
    JobView,
    QueueEntry,
    QueueQuery,
    StartProvision,
)
from karios.provisioner.handlers import wire


class Recorder:
    """Stands in for the job service: records what each use case received."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def _view(self, job_id: str, state: str) -> JobView:
        return JobView(job_id=job_id, bmc_ip="10.0.0.5", state=state, status="running", log_tail=["l1"])

    async def handle_start(self, cmd: StartProvision) -> None:
        self.calls.append(("start", cmd))

    async def step(self, req: CallbackRequestV2) -> JobView:
        self.calls.append(("step", req))
        return self._view(req.job_id, "installing")

    async def complete(self, req: CallbackRequestV2) -> JobView:
        self.calls.append(("complete", req))
        return self._view(req.job_id, "first_boot")

    async def firstboot(self, req: CallbackRequestV2) -> JobView:
        self.calls.append(("firstboot", req))
        return self._view(req.job_id, "completed")

    async def cancel(self, req: CancelJob) -> JobView:
        self.calls.append(("cancel", req))
        return self._view(req.job_id, "cancelled")

    queue_size = 1

    async def queue(self) -> list[QueueEntry]:
        self.calls.append(("queue", None))
        return [
            QueueEntry(
                job_id="j" if self.queue_size == 1 else f"j{i}",
                bmc_ip="10.0.0.5",
                job_type="provision",
                state="queued",
                position=i + 1,
                created_at="t",
            )
            for i in range(self.queue_size)
        ]

    async def job_request(self, q: JobRequestQuery) -> JobRequestView:
        self.calls.append(("job_request", q))
        return JobRequestView(
            job_id=q.job_id, bmc_ip="10.0.0.5", hostname="n1", debian_version="13", has_os_password=True
        )


def _bus() -> tuple[Bus, Recorder]:
    bus = Bus(service="provisioner", servers=["nats://127.0.0.1:1"], subjects=Subjects("unitprov"))
    rec = Recorder()
    wire(bus, rec)
    return bus, rec


def _wire(model: Contract) -> bytes:
    return wrap(model, source="test").model_dump_json().encode()


async def test_installer_step_reaches_the_use_case_typed_with_message_and_log():
    bus, rec = _bus()
    req = CallbackRequestV2(
        job_id="j1",
        token_sha256="ab" * 32,
        step="mirror",
        state="failed",
        message="Bad mirror",
        log=["a", "b"],
    )
    async with TestNatsBroker(bus.broker) as br:
        reply = await br.request(_wire(req), bus.subjects.request("provision", "step"))
    body = json.loads(reply.body)
    assert (
        body["ok"] is True
        and body["result"]["state"] == "installing"
        and body["result"]["log_tail"] == ["l1"]
    )
    assert rec.calls == [("step", req)]


async def test_each_request_subject_calls_its_own_use_case():
    bus, rec = _bus()
    async with TestNatsBroker(bus.broker) as br:
        for verb in ("complete", "firstboot"):
            await br.request(
                _wire(CallbackRequestV2(job_id=f"j-{verb}")), bus.subjects.request("provision", verb)
            )
        cancel = await br.request(_wire(CancelJob(job_id="j9")), bus.subjects.request("provision", "cancel"))
        queue = await br.request(_wire(QueueQuery()), bus.subjects.query("provision", "queue"))
    assert [c[0] for c in rec.calls] == ["complete", "firstboot", "cancel", "queue"]
    assert json.loads(cancel.body)["result"]["state"] == "cancelled"
    assert json.loads(queue.body)["result"][0]["position"] == 1


async def test_a_malformed_callback_is_an_error_reply_naming_the_field_and_reaches_nothing():
    bus, rec = _bus()
    bad = {"type": CallbackRequestV2.TYPE, "source": "x", "data": {"job_id": "j", "percent": "lots"}}
    async with TestNatsBroker(bus.broker) as br:
        reply = await br.request(json.dumps(bad), bus.subjects.request("provision", "step"))
    err = json.loads(reply.body)["error"]
    assert err["code"] == "VALIDATION_FAILED" and err["field"] == "percent", err
    assert rec.calls == []


async def test_a_jobs_request_is_answered_without_its_secrets():
    bus, rec = _bus()
    async with TestNatsBroker(bus.broker) as br:
        reply = await br.request(
            _wire(JobRequestQuery(job_id="j7")), bus.subjects.query("provision", "job_request")
        )
    result = json.loads(reply.body)["result"]
    assert rec.calls == [("job_request", JobRequestQuery(job_id="j7"))]
    assert (result["job_id"], result["debian_version"], result["has_os_password"]) == ("j7", "13", True)
    assert not any(k.endswith("_enc") or k in ("os_password", "root_pass") for k in result)


async def test_the_queue_is_answered_in_pages():
    """A reply is one NATS message (1 MB): the gateway asks for the queue a page at a time."""
    bus, rec = _bus()
    rec.queue_size = 5
    async with TestNatsBroker(bus.broker) as br:
        page = await br.request(
            _wire(QueueQuery(offset=2, limit=2)), bus.subjects.query("provision", "queue")
        )
        tail = await br.request(
            _wire(QueueQuery(offset=4, limit=2)), bus.subjects.query("provision", "queue")
        )
        whole = await br.request(_wire(QueueQuery()), bus.subjects.query("provision", "queue"))
    assert [e["job_id"] for e in json.loads(page.body)["result"]] == ["j2", "j3"]
    assert [e["job_id"] for e in json.loads(tail.body)["result"]] == ["j4"]
    assert len(json.loads(whole.body)["result"]) == 5
