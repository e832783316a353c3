"""A job whose worker meets a stalled database stays claimable (the lease sweep resumes it); any
other unexpected error fails it with a message that names no exception class."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from karios.provisioner.jobs import worker


class FakeService:
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.failed: list[tuple[str, str]] = []
        self.tasks: dict[str, asyncio.Task] = {}

    async def check(self, job_id: str):
        raise self.error

    async def fail(self, job_id: str, message: str) -> None:
        self.failed.append((job_id, message))


async def test_a_database_timeout_leaves_the_job_for_the_lease_sweep():
    for err in (TimeoutError(), sa.exc.TimeoutError("pool timeout"), ConnectionRefusedError()):
        svc = FakeService(err)
        await worker.run(svc, "job-1")  # type: ignore[arg-type]
        assert svc.failed == [], err


async def test_another_error_fails_the_job_without_internals():
    svc = FakeService(ValueError("SELECT secret FROM x"))
    await worker.run(svc, "job-2")  # type: ignore[arg-type]
    assert svc.failed == [("job-2", "internal error (see the provisioner log)")]
