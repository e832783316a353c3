"""Thin bus handlers: each takes its typed contract and calls one use case of the job service."""

from __future__ import annotations

from typing import Any, Protocol

from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import (
    Admission,
    AdmissionQuery,
    CallbackRequestV2,
    CancelJob,
    ImageInfo,
    ImageQuery,
    JobRequestQuery,
    JobRequestView,
    JobView,
    QueueEntry,
    QueueQuery,
    StartProvision,
)


class UseCases(Protocol):
    async def handle_start(self, cmd: StartProvision) -> None: ...
    async def step(self, req: CallbackRequestV2) -> JobView: ...
    async def complete(self, req: CallbackRequestV2) -> JobView: ...
    async def firstboot(self, req: CallbackRequestV2) -> JobView: ...
    async def cancel(self, req: CancelJob) -> JobView: ...
    async def queue(self) -> list[QueueEntry]: ...
    async def admission(self) -> Admission: ...
    async def image_info(self, q: ImageQuery) -> ImageInfo: ...
    async def job_request(self, q: JobRequestQuery) -> JobRequestView: ...


def wire(bus: Bus, svc: UseCases) -> None:
    subjects = bus.subjects

    async def on_start(cmd: StartProvision, _ctx: Any) -> None:
        await svc.handle_start(cmd)

    async def on_queue(q: QueueQuery) -> list[QueueEntry]:
        entries = await svc.queue()
        return entries[q.offset : q.offset + q.limit] if q.limit else entries[q.offset :]

    async def on_admission(_q: AdmissionQuery) -> Admission:
        return await svc.admission()

    async def on_image(q: ImageQuery) -> ImageInfo:
        return await svc.image_info(q)

    async def on_job_request(q: JobRequestQuery) -> JobRequestView:
        return await svc.job_request(q)

    bus.command_handler("provision", StartProvision, on_start, verb="start", concurrency=32)
    bus.query_responder(subjects.request("provision", "step"), CallbackRequestV2, svc.step)
    bus.query_responder(subjects.request("provision", "complete"), CallbackRequestV2, svc.complete)
    bus.query_responder(subjects.request("provision", "firstboot"), CallbackRequestV2, svc.firstboot)
    bus.query_responder(subjects.request("provision", "cancel"), CancelJob, svc.cancel)
    bus.query_responder(subjects.query("provision", "queue"), QueueQuery, on_queue)
    bus.query_responder(subjects.query("provision", "admission"), AdmissionQuery, on_admission)
    bus.query_responder(subjects.query("provision", "image"), ImageQuery, on_image)
    bus.query_responder(subjects.query("provision", "job_request"), JobRequestQuery, on_job_request)
