"""Every line every service writes is one JSON object (KARIOS_LOG_JSON defaults to true).

A user's workload on ``karios up`` — registrations, a provision on the Redfish emulator played to
the end, a fabric plan, a bad request — then every service log is read line by line: each line
parses as JSON with ``timestamp``, ``level``, ``event`` and the file's ``service``; the job's
lines carry ``job_id``, ``bmc_ip`` and a ``trace_id``; no secret of the workload appears.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from tests.fixtures.chaos import PORT_VARS, KariosUp, http_post, state_dir
from tests.fixtures.workload import (
    BMCS,
    fabric_plan,
    provision_env,
    provision_once,
    register_nodes,
    running_emulator,
)

pytestmark = [pytest.mark.integration, pytest.mark.lab]

SECRETS = ("os-s3cret-pw", "bmc-s3cret-pw")


@pytest.fixture(scope="module")
def emulator():
    with running_emulator() as emu:
        yield emu


def test_every_service_log_line_is_json(emulator):
    with state_dir("karios-logs-") as state:
        up = KariosUp(state, env=provision_env(emulator, state))
        try:
            up.wait_started()
            register_nodes(up)
            job = provision_once(up, state / "media", BMCS[0])
            fabric_plan(up)
            bad = http_post(f"{up.url()}/controlnode/register", {"bmc_ip": "not-an-ip"}, up.token)
            assert bad[0] == 422
        finally:
            up.stop()
        logs = {name: (state / "logs" / f"{name}.log").read_text() for name in PORT_VARS}

    total = 0
    for name, text in logs.items():
        lines = text.splitlines()
        assert lines, f"{name}.log is empty"
        for n, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                pytest.fail(f"{name}.log line {n} is not JSON: {line[:300]}")
            assert isinstance(rec, dict), (name, n, line)
            missing = {"timestamp", "level", "event", "service"} - rec.keys()
            assert not missing, f"{name}.log line {n} lacks {missing}: {line[:300]}"
            assert rec["service"] == name, (name, n, line)
            for secret in (*SECRETS, emulator.password):
                assert secret not in line, f"{name}.log line {n} shows a secret"
        total += len(lines)
    print(
        f"\n{total} log lines, all JSON: " + ", ".join(f"{k}={len(v.splitlines())}" for k, v in logs.items())
    )

    # Third-party loggers went through the same pipeline (alembic migrated at start-up).
    loggers = Counter(
        json.loads(line).get("logger", "structlog") for t in logs.values() for line in t.splitlines()
    )
    print("lines by logger:", dict(loggers.most_common()))
    assert any(lg.startswith("alembic") for lg in loggers), loggers

    # The job's lines say which job and BMC, and which trace to look at.
    job_lines = [json.loads(line) for line in logs["provisioner"].splitlines() if job.job_id in line]
    assert job_lines, "no provisioner line names the job"
    bound = [r for r in job_lines if r.get("job_id") == job.job_id and r.get("bmc_ip") == job.bmc_ip]
    assert bound and all(re.fullmatch(r"[0-9a-f]{32}", r.get("trace_id", "")) for r in bound), job_lines
