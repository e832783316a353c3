"""Issue 26: every job end is one log line — ``job ended`` with the job id, the BMC, the outcome
and the reason — at INFO for completed/cancelled, ERROR for failed, WARNING for stuck (a real
provisioner on the real database and bus; the stuck sweep and the cancel use case are the real
ones)."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

import pytest

from karios.common.contracts.provision import CancelJob
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.jobs.admitter import limits_of
from karios.provisioner.jobs.repository import now
from karios.provisioner.statemachine import State
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.integration


def _ended(caplog: pytest.LogCaptureFixture) -> dict[str, tuple[str, dict]]:
    """job id → (level, event dict) of each "job ended" record."""
    found = {}
    for rec in caplog.records:
        event = rec.msg if isinstance(rec.msg, dict) else {}
        if event.get("event") == "job ended":
            found[event["job_id"]] = (rec.levelname, event)
    return found


async def test_every_job_end_is_one_line_at_its_level(settings, serve, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cfg = ProvisionerConfig(
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        images_dir=tmp_path / "images",
        stuck_check_interval=0.2,
        bmc_retries=0,
        bmc_timeout=2,
    )
    app = provisioner_app(settings, cfg)
    await serve(app)
    svc = app.state.jobs

    async def job(job_id: str, bmc: str, state: str, **extra: object) -> str:
        row = {"id": job_id, "bmc_ip": bmc, "state": state, "owner": "", "spec": {}}
        await svc.repo.insert({**row, "created_at": now(), "updated_at": now(), **extra})
        return job_id

    done = await job("end-completed", "10.96.0.1", "first_boot")
    await svc.move(done, State.completed, "first boot from 10.96.1.1")
    failed = await job("end-failed", "10.96.0.2", "installing")
    await svc.move(failed, State.failed, "installer: no disk sda")
    cancelled = await job("end-cancelled", "10.96.0.3", "booting")
    await svc.cancel(CancelJob(job_id=cancelled))
    stuck = await job("end-stuck", "10.96.0.4", "booting", stage_deadline=now() - timedelta(seconds=1))
    await wait_until(lambda: stuck in _ended(caplog), timeout=20, what="the stuck sweep's line")

    ended = _ended(caplog)
    want = {
        done: ("INFO", "completed", "10.96.0.1", "first boot from 10.96.1.1"),
        failed: ("ERROR", "failed", "10.96.0.2", "installer: no disk sda"),
        cancelled: ("INFO", "cancelled", "10.96.0.3", "cancelled by operator"),
        stuck: ("WARNING", "stuck", "10.96.0.4", "no installer report before the stage deadline"),
    }
    for job_id, (level, outcome, bmc, reason) in want.items():
        got_level, ev = ended[job_id]
        assert (got_level, ev["outcome"], ev["bmc_ip"], ev["reason"]) == (level, outcome, bmc, reason)
    lines = [r for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "job ended"]
    assert sorted(r.msg["job_id"] for r in lines) == sorted(want)  # one line per end, nothing else

    # a repeated cancel ends nothing: no second line
    await svc.cancel(CancelJob(job_id=cancelled))
    assert (
        sum(
            1
            for r in caplog.records
            if isinstance(r.msg, dict)
            and r.msg.get("job_id") == cancelled
            and r.msg.get("event") == "job ended"
        )
        == 1
    )


async def test_an_admission_whose_commit_answer_was_lost_still_releases_its_waiter(settings, serve, tmp_path):
    """Chaos table, PostgreSQL SIGSTOP (CI 2026-12-05): the admission's COMMIT reached the
    database, its answer did not (the client timed out while the database was paused). The row
    says admitted, the waiting worker was never told: it waited for ever (its lease renewed by
    the heartbeat), the job stayed ``queued``. The next admission run now returns it."""
    dirs = {
        "cache_dir": tmp_path / "cache",
        "media_dir": tmp_path / "media",
        "images_dir": tmp_path / "images",
    }
    app = provisioner_app(settings, ProvisionerConfig(**dirs))
    await serve(app)
    svc = app.state.jobs
    row = {
        "id": "adm-lost-answer",
        "bmc_ip": "10.96.9.1",
        "state": "queued",
        "owner": svc.replica,
        "spec": {},
    }
    await svc.repo.insert({**row, "created_at": now(), "updated_at": now(), "admitted_at": now()})
    try:
        assert await svc.repo.admit(limits_of(svc), ["adm-lost-answer"]) == ["adm-lost-answer"]
        other = {**row, "id": "adm-other-replica", "owner": "another-replica"}
        await svc.repo.insert({**other, "created_at": now(), "updated_at": now(), "admitted_at": now()})
        assert await svc.repo.admit(limits_of(svc), ["adm-other-replica"]) == []  # not ours
    finally:  # ended: the session database is shared, and admitted jobs hold admission slots
        for job_id in ("adm-lost-answer", "adm-other-replica"):
            with contextlib.suppress(Exception):
                await svc.move(job_id, State.failed, "test over")
