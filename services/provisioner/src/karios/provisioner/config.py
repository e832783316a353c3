"""Provisioner-only settings (``KARIOS_PROVISIONER_*``); tests build their own and may edit them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from karios.common.settings import KariosSettings


@dataclass
class ProvisionerConfig:
    media_url: str = ""  # base URL BMCs fetch media from (this service's own HTTP)
    callback_url: str = ""  # gateway base URL the installer calls (…/controlnode is appended)
    cache_dir: Path = Path("provisioner-cache")
    media_dir: Path = Path("provisioner-media")
    build_concurrency: int = 2  # media builds at once (CPU/disk bound)
    bmc_concurrency: int = 16  # BMC operations at once, all BMCs
    bmc_per_subnet: int = 4  # BMC operations at once per /24 of BMC addresses
    stage_deadline: float = 1800.0  # seconds without a step before a job is stuck
    stuck_check_interval: float = 10.0
    # Worker lease (resume after a crash, share work between replicas): a replica renews the
    # lease of the jobs it works every lease_seconds/3; every claim_interval it claims up to
    # claim_batch worker-phase jobs whose lease expired; a job taken more than max_attempts
    # times fails instead of crash-looping.
    lease_seconds: float = 30.0
    claim_interval: float = 5.0
    claim_batch: int = 16
    max_attempts: int = 5
    bmc_scheme: str = "https"
    bmc_verify_tls: bool = False
    bmc_default_user: str = ""
    bmc_default_password: str = ""
    bmc_timeout: float = 10.0
    bmc_retries: int = 3
    bmc_backoff: float = 0.5
    power_deadline: float = 120.0
    # per-BMC overrides: {"10.0.0.5": {"url": "https://…", "system_id": "…", "verify_tls": true,
    #                                  "username": "…", "password": "…"}}
    bmc_endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    mirror_host: str = "deb.debian.org"
    mirror_dir: str = "/debian"

    @classmethod
    def from_env(cls, settings: KariosSettings) -> ProvisionerConfig:
        env = os.environ.get
        base = settings.state_dir / "provisioner"
        cfg = cls(
            media_url=env(
                "KARIOS_PROVISIONER_MEDIA_URL", f"http://{settings.host}:{settings.provisioner_port}"
            ),
            callback_url=env(
                "KARIOS_PROVISIONER_CALLBACK_URL",
                settings.public_url or f"http://{settings.host}:{settings.gateway_port}",
            ),
            cache_dir=Path(env("KARIOS_PROVISIONER_CACHE_DIR", str(base / "cache"))),
            media_dir=Path(env("KARIOS_PROVISIONER_MEDIA_DIR", str(base / "media"))),
            bmc_default_user=env("KARIOS_PROVISIONER_BMC_USER", ""),
            bmc_default_password=env("KARIOS_PROVISIONER_BMC_PASSWORD", ""),
        )
        for name in ("build_concurrency", "bmc_concurrency", "bmc_per_subnet", "claim_batch", "max_attempts"):
            if env(f"KARIOS_PROVISIONER_{name.upper()}"):
                setattr(cfg, name, int(env(f"KARIOS_PROVISIONER_{name.upper()}", "1")))
        for name in ("stage_deadline", "lease_seconds", "claim_interval"):
            if env(f"KARIOS_PROVISIONER_{name.upper()}"):
                setattr(cfg, name, float(env(f"KARIOS_PROVISIONER_{name.upper()}", "1")))
        if env("KARIOS_PROVISIONER_BMC_ENDPOINTS"):
            cfg.bmc_endpoints = json.loads(env("KARIOS_PROVISIONER_BMC_ENDPOINTS", "{}"))
        return cfg
