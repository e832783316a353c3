"""A replica whose own apply only looked stale (its heartbeat could not be written while the
database was paused) renews the lease instead of reaping — and failing — its own running job."""

from __future__ import annotations

from types import SimpleNamespace

from karios.fabric_worker.rollout import recovery


class Repo:
    def __init__(self) -> None:
        self.beats: list[str] = []
        self.looked_up: list[str] = []

    async def heartbeat(self, job_id, summary=None):
        self.beats.append(job_id)
        return False

    async def get_row(self, job_id):
        self.looked_up.append(job_id)
        return None

    async def claim(self, job_id, lease):
        return None  # held by a live replica


def _svc(running_id: str | None) -> SimpleNamespace:
    live = SimpleNamespace(job_id=running_id, summary=None) if running_id else None
    return SimpleNamespace(
        registry=SimpleNamespace(running_job=lambda: live), repo=Repo(), settings=SimpleNamespace(lease=3)
    )


async def test_own_running_apply_is_renewed_not_taken_over():
    svc = _svc("job-1")
    await recovery.take_over(svc, "job-1")  # type: ignore[arg-type]
    assert svc.repo.beats == ["job-1"] and svc.repo.looked_up == []


async def test_another_replicas_job_goes_through_the_claim():
    svc = _svc("job-1")
    await recovery.take_over(svc, "job-2")  # type: ignore[arg-type]
    assert svc.repo.beats == [] and svc.repo.looked_up == ["job-2"]
