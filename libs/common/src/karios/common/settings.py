"""Settings shared by every service (pydantic-settings, ``KARIOS_`` prefix).

Build settings in the app factory (``KariosSettings()``), never at import time.
"""

from __future__ import annotations

import base64
import os
from functools import cached_property
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Well-known development key: refused outside dev mode.
DEV_SECRET_KEY = base64.b64encode(b"karios-dev-only-key-do-not-use!!").decode()


def default_state_dir() -> Path:
    """/var/lib/karios as root, else $XDG_STATE_HOME/karios (~/.local/state/karios)."""
    if os.geteuid() == 0:
        return Path("/var/lib/karios")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "karios"


class KariosSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KARIOS_", extra="ignore")

    dev_mode: bool = Field(False, description="Allow unsafe defaults (development key, generated tokens).")
    nats_url: str = Field("nats://127.0.0.1:4222", description="NATS server URL(s), comma-separated.")
    database_url: str = Field(
        "postgresql+asyncpg://postgres@127.0.0.1:5432/karios", description="PostgreSQL URL (asyncpg)."
    )
    bus_replicas: int = Field(
        1,
        ge=1,
        le=5,
        description="Servers each JetStream stream is stored on: 1, or 3 on a 3-node NATS cluster "
        "(applied at start: an existing stream is scaled to it).",
    )
    bus_prefix: str = Field("karios", description="Subject prefix; stream names derive from it.")
    secret_key: SecretStr = Field(
        SecretStr(DEV_SECRET_KEY), description="Base64 32-byte AES-256-GCM key for secrets at rest."
    )
    secret_key_id: str = Field("k1", description="Id stored beside each ciphertext.")
    old_secret_keys: dict[str, SecretStr] = Field(
        default_factory=dict, description="Retired keys by id (JSON), still accepted for decryption."
    )
    host: str = Field("127.0.0.1", description="Address every HTTP listener binds.")
    gateway_port: int = Field(8080, description="api-gateway HTTP port")
    bootapi_port: int = Field(8081, description="bootapi plain-HTTP port (unless BOOTAPI_LISTEN_ADDR is set)")
    provisioner_port: int = Field(8082, description="provisioner HTTP port (boot media for BMCs)")
    inventory_port: int = Field(8083, description="inventory HTTP port (health, metrics, NetBox webhook)")
    fabric_worker_port: int = Field(8084, description="fabric-worker HTTP port (health, metrics)")
    public_url: str = Field("", description="URL installers and BMCs use to reach the gateway.")
    bootstrap_admin_token: SecretStr | None = Field(
        None, description="If set, ensured as a fabric_admin API token at gateway start."
    )
    request_timeout: float = Field(5.0, description="Seconds to wait for a bus request/reply.")
    db_connect_timeout: float = Field(
        3.0, gt=0, description="Seconds to open a database connection before answering 503."
    )
    db_command_timeout: float = Field(
        5.0, gt=0, description="Seconds any one database statement may take before answering 503."
    )
    token_cache_ttl: float = Field(
        30.0,
        ge=0,
        description=(
            "Seconds the gateway trusts a verified API token without the database "
            "(revocation reaches every replica at once by a broadcast; 0 = no cache)."
        ),
    )
    max_request_body: int = Field(
        1024 * 1024,
        gt=0,
        description="Largest request body (bytes) any HTTP service accepts; larger ones get 413.",
    )
    job_lost_after: float = Field(
        240.0,
        gt=0,
        description="Seconds a job the gateway holds as live may go without an update before the reconcile "
        "asks the provisioners and fails it if none knows it ('never reached a provisioner').",
    )
    job_reconcile_interval: float = Field(
        30.0, gt=0, description="Seconds between two gateway job reconciles."
    )
    max_deliver: int = Field(5, description="Deliveries before a command is dead-lettered.")
    retry_delay: float = Field(2.0, description="Seconds before a retryable failure is redelivered.")
    state_dir: Path = Field(
        default_factory=default_state_dir,
        description=(
            "Data of `karios up` and the provisioner (/var/lib/karios as root, else ~/.local/state/karios)"
        ),
    )
    inventory_file: Path | None = Field(None, description="YAML inventory used when no NetBox is configured.")
    netbox_url: str = Field("", description="NetBox base URL; unset = the file-backed inventory")
    netbox_token: SecretStr | None = Field(None, description="NetBox API token (write scope for pxe_enabled)")
    log_level: str = Field("INFO", description="Log level")
    log_json: bool = Field(True, description="JSON logs (false: console format)")
    sse_queue_size: int = Field(1000, description="Events buffered per SSE client before it must reconnect.")
    sse_keepalive: float = Field(15.0, description="Seconds between SSE keep-alive comments.")

    @field_validator("secret_key")
    @classmethod
    def _key_is_32_bytes(cls, v: SecretStr) -> SecretStr:
        try:
            raw = base64.b64decode(v.get_secret_value(), validate=True)
        except Exception as exc:
            raise ValueError("KARIOS_SECRET_KEY must be base64") from exc
        if len(raw) != 32:
            raise ValueError("KARIOS_SECRET_KEY must decode to 32 bytes (AES-256)")
        return v

    @model_validator(mode="after")
    def _refuse_unsafe_defaults(self) -> KariosSettings:
        if not self.dev_mode and self.secret_key.get_secret_value() == DEV_SECRET_KEY:
            raise ValueError(
                "KARIOS_SECRET_KEY is the development key; set a real key "
                "(python -c 'import os,base64;print(base64.b64encode(os.urandom(32)).decode())') "
                "or KARIOS_DEV_MODE=1"
            )
        return self

    @cached_property
    def keyring(self) -> dict[str, bytes]:
        keys = {kid: base64.b64decode(k.get_secret_value()) for kid, k in self.old_secret_keys.items()}
        keys[self.secret_key_id] = base64.b64decode(self.secret_key.get_secret_value())
        return keys
