"""Provisioner-only settings (pydantic-settings, ``KARIOS_PROVISIONER_*``).

Build with :meth:`ProvisionerConfig.from_env` in the app factory: URLs and directories left
unset are derived from the shared :class:`KariosSettings`. Tests build their own and may edit them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from karios.common.errors import PermanentFailure
from karios.common.settings import KariosSettings


class ProvisionerConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KARIOS_PROVISIONER_", extra="ignore", populate_by_name=True)

    media_url: str = Field(
        "",
        description="Base URL BMCs fetch media from (default: this service's own listener, https "
        "with KARIOS_PROVISIONER_TLS)",
    )
    callback_url: str = Field(
        "", description="Gateway base URL the installer calls (default: KARIOS_PUBLIC_URL or the gateway)"
    )
    cache_dir: Path | None = Field(
        None, description="Cached base artifacts (default: <state dir>/provisioner/cache)"
    )
    media_dir: Path | None = Field(
        None, description="Built per-host media (default: <state dir>/provisioner/media)"
    )
    build_concurrency: int = Field(2, ge=1, description="Media builds at once (CPU/disk bound)")
    bmc_concurrency: int = Field(16, ge=1, description="BMC operations at once, all BMCs")
    bmc_per_subnet: int = Field(4, ge=1, description="BMC operations at once per /24 of BMC addresses")
    # Admission control (all replicas, counted in the database): jobs past ``queued`` and not yet
    # booting (probe, medium, insert, reset) at once, overall and per BMC vendor.
    admission_overall: int = Field(64, ge=1, description="Jobs doing BMC/media work at once, all vendors")
    admission_per_vendor: int = Field(32, ge=1, description="Jobs doing BMC/media work at once per vendor")
    admission_vendors: dict[str, int] = Field(
        default_factory=dict, description='Per-vendor override of admission_per_vendor, JSON: {"dell": 8}'
    )
    admission_interval: float = Field(
        0.5, gt=0, description="Seconds between admission checks while jobs wait (a local slot frees at once)"
    )
    stage_deadline: float = Field(1800.0, gt=0, description="Seconds without a step before a job is stuck")
    firstboot_window: float = Field(
        3600.0,
        gt=0,
        description="Seconds after the installer's /complete during which the job token is good for one "
        "/firstboot (then never again)",
    )
    stuck_check_interval: float = Field(10.0, gt=0)
    # Worker lease (resume after a crash, share work between replicas): a replica renews the
    # lease of the jobs it works every lease_seconds/3; every claim_interval it claims up to
    # claim_batch worker-phase jobs whose lease expired; a job taken more than max_attempts
    # times fails instead of crash-looping.
    lease_seconds: float = Field(
        30.0, gt=0, description="Job lease; an expired lease lets another replica resume"
    )
    claim_interval: float = Field(5.0, gt=0, description="Seconds between sweeps for expired leases")
    claim_batch: int = Field(16, ge=1, description="Jobs claimed per sweep")
    max_attempts: int = Field(5, ge=1, description="Takeovers before a job fails instead of crash-looping")
    bmc_scheme: str = "https"
    bmc_ca_bundle: str = Field(
        "",
        description="PEM file of the CAs that sign BMC certificates: every BMC is verified against it "
        "(address included). Empty: trust on first use, each BMC's certificate fingerprint pinned on "
        'first contact and a changed one refused. Per-BMC opt-out: bmc_endpoints {"tls": "insecure"}',
    )
    # An alias replaces the env prefix: spell the variables out (populate_by_name keeps the field name).
    bmc_default_user: str = Field(
        "",
        validation_alias=AliasChoices("KARIOS_PROVISIONER_BMC_USER", "KARIOS_PROVISIONER_BMC_DEFAULT_USER"),
    )
    bmc_default_password: str = Field(
        "",
        validation_alias=AliasChoices(
            "KARIOS_PROVISIONER_BMC_PASSWORD", "KARIOS_PROVISIONER_BMC_DEFAULT_PASSWORD"
        ),
        repr=False,
    )
    bmc_timeout: float = Field(10.0, gt=0)
    bmc_retries: int = Field(3, ge=0)
    bmc_backoff: float = Field(0.5, ge=0)
    power_deadline: float = Field(120.0, gt=0)
    # per-BMC overrides (JSON): {"10.0.0.5": {"url": "https://…", "system_id": "…",
    #   "tls": "ca" | "tofu" | "insecure" (older "verify_tls": true/false = ca/insecure),
    #   "username": "…", "password": "…"}}
    bmc_endpoints: dict[str, dict[str, Any]] = Field(default_factory=dict, repr=False)
    bmc_endpoints_file: Path | None = Field(
        None,
        description="JSON file of per-BMC overrides, the shape of bmc_endpoints (a fleet's worth does "
        "not fit in one environment variable: 128 KiB); bmc_endpoints' own entries win",
    )
    mirror_host: str = Field("deb.debian.org", description="Debian archive host[:port] installers use")
    mirror_dir: str = Field("/debian", description="Directory of the Debian archive on mirror_host")
    mirror_proxy: str = Field(
        "", description="HTTP proxy for installer downloads, e.g. http://10.0.0.1:3142 (empty: none)"
    )
    security_host: str = Field("", description="Security repository host (empty: off)")
    security_dir: str = Field("/debian-security", description="Directory of the security repository")
    updates: bool = Field(False, description="Configure the <suite>-updates repository")
    nameservers: list[str] = Field(
        default_factory=list, description="Name servers for installed hosts (DHCP too); JSON list"
    )
    serial_console: str = Field(
        "ttyS0,115200n8",
        description="Serial console of installer, live environment and installed system (empty: "
        "none); per-vendor override in serial_consoles",
    )
    serial_consoles: dict[str, str] = Field(
        default_factory=dict, description='Serial console per vendor, JSON: {"dell": "ttyS1,115200n8"}'
    )
    install_method: Literal["image", "preseed"] = Field(
        "image", description="How a provision installs the OS when the request names no install_method"
    )
    wipe_policy: Literal["fast", "secure"] = Field(
        "fast",
        description="How an unprovision erases each disk. fast: signatures (both ends, backup copies), "
        "a checked discard and zeroed signature regions. secure: first the strongest erase the device "
        "supports (NVMe sanitize or format with secure erase, ATA security erase, SCSI sanitize; else "
        "zeros over the first and last GiB), verified, then the fast steps (docs/installs.md)",
    )
    image_mirror: str = Field(
        "", description="Debian mirror URL image builds (mmdebstrap) use (default: mirror_host/mirror_dir)"
    )
    image_proxy: str = Field("", description="HTTP proxy for image builds (default: mirror_proxy)")
    image_url: str = Field(
        "",
        description="Base URL install targets fetch /images/ from, when they reach the provisioner "
        "at another address than BMCs do (default: media_url)",
    )
    ca_bundle: Path | None = Field(
        None,
        description="PEM file of CA certificates the image and wipe media carry: their live "
        "environment adds them to its trust store, so curl verifies the provisioner's /images and "
        "the gateway's callbacks over HTTPS, and the image install adds them to the installed "
        "system's (its first-boot report). Default: KARIOS_TLS_CA_BUNDLE; unset: the live "
        "environment's own trust store (Debian's ca-certificates)",
    )
    images_dir: Path | None = Field(
        None,
        description="Prepared base artifacts of the install methods, served at /images/ "
        "(default: <state dir>/provisioner/images)",
    )
    bmc_probe_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds the probe before a build waits for a connection to the BMC (one retry); "
        "a BMC that accepts it and answers slowly gets bmc_timeout and bmc_retries",
    )
    power_sync_interval: float = Field(
        0.0,
        ge=0,
        description="Seconds between two reads of every known BMC's power state (registry, inspected "
        "and configured BMCs); a change outside a job is an event. 0 = off",
    )
    power_sync_rate: float = Field(
        2.0, gt=0, description="BMC power reads started per second at most during a power sync"
    )

    @field_validator("bmc_endpoints")
    @classmethod
    def _known_tls_modes(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        _check_tls_modes(value, "bmc_endpoints")
        return value

    @field_validator("bmc_endpoints_file", mode="before")
    @classmethod
    def _empty_file_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @model_validator(mode="after")
    def _endpoints_from_file(self) -> ProvisionerConfig:
        """Merge bmc_endpoints_file under bmc_endpoints (a start-up error names the file)."""
        if self.bmc_endpoints_file is None:
            return self
        path = self.bmc_endpoints_file
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ValueError(f"bmc_endpoints_file {path}: cannot be read ({exc.strerror})") from None
        except ValueError as exc:
            raise ValueError(f"bmc_endpoints_file {path}: not JSON ({exc})") from None
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise ValueError(
                f'bmc_endpoints_file {path}: not an object of BMC address → {{"url": …}} objects'
            )
        _check_tls_modes(data, f"bmc_endpoints_file {path}")
        self.bmc_endpoints = {**data, **self.bmc_endpoints}
        return self

    @field_validator("ca_bundle", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    def ca_pem(self) -> str:
        """The CA certificates the install media carry (PEM text; "" when none is configured)."""
        if self.ca_bundle is None:
            return ""
        try:
            text = Path(self.ca_bundle).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PermanentFailure(
                f"KARIOS_PROVISIONER_CA_BUNDLE {self.ca_bundle}: not readable ({exc})"
            ) from exc
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise PermanentFailure(f"KARIOS_PROVISIONER_CA_BUNDLE {self.ca_bundle}: no PEM certificate in it")
        return text

    @classmethod
    def from_env(cls, settings: KariosSettings) -> ProvisionerConfig:
        cfg = cls()
        base = settings.state_dir / "provisioner"
        scheme = settings.provisioner_scheme  # https with KARIOS_PROVISIONER_TLS
        cfg.media_url = cfg.media_url or f"{scheme}://{settings.host}:{settings.provisioner_port}"
        if scheme == "https":
            for name in ("media_url", "image_url"):
                if getattr(cfg, name).startswith("http://"):
                    raise ValueError(
                        f"KARIOS_PROVISIONER_{name.upper()} is http:// but the provisioner serves HTTPS "
                        "only (KARIOS_PROVISIONER_TLS): use https://"
                    )
        cfg.ca_bundle = cfg.ca_bundle or settings.tls_ca_bundle
        cfg.callback_url = (
            cfg.callback_url
            or settings.public_url
            or f"{settings.gateway_scheme}://{settings.host}:{settings.gateway_port}"
        )
        cfg.cache_dir = cfg.cache_dir or base / "cache"
        cfg.media_dir = cfg.media_dir or base / "media"
        cfg.images_dir = cfg.images_dir or base / "images"
        return cfg


def _check_tls_modes(endpoints: dict[str, dict[str, Any]], where: str) -> None:
    for ip, over in endpoints.items():
        if "tls" in over and str(over["tls"]).lower() not in ("ca", "tofu", "insecure"):
            raise ValueError(f"{where}[{ip}].tls: {over['tls']!r} is not one of ca, tofu, insecure")
