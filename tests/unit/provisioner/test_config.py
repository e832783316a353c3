"""Provisioner settings from the environment (``KARIOS_PROVISIONER_*``)."""

from __future__ import annotations

from karios.common.settings import KariosSettings
from karios.provisioner.config import ProvisionerConfig


def test_lease_and_claim_knobs_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KARIOS_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("KARIOS_DEV_MODE", "1")
    defaults = ProvisionerConfig.from_env(KariosSettings())
    assert (defaults.lease_seconds, defaults.claim_interval) == (30.0, 5.0)
    assert (defaults.claim_batch, defaults.max_attempts) == (16, 5)
    for name, value in {
        "LEASE_SECONDS": "12.5",
        "CLAIM_INTERVAL": "2",
        "CLAIM_BATCH": "4",
        "MAX_ATTEMPTS": "3",
        "STAGE_DEADLINE": "60",
        "BUILD_CONCURRENCY": "1",
    }.items():
        monkeypatch.setenv(f"KARIOS_PROVISIONER_{name}", value)
    cfg = ProvisionerConfig.from_env(KariosSettings())
    assert (cfg.lease_seconds, cfg.claim_interval, cfg.claim_batch, cfg.max_attempts) == (12.5, 2.0, 4, 3)
    assert (cfg.stage_deadline, cfg.build_concurrency) == (60.0, 1)
