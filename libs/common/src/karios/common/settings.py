"""Settings shared by every service (pydantic-settings, ``KARIOS_`` prefix).

Build settings in the app factory (``KariosSettings()``), never at import time.
"""

from __future__ import annotations

import base64
import os
from functools import cached_property
from pathlib import Path

from pydantic import ByteSize, Field, SecretStr, field_validator, model_validator
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
    # hide_input_in_errors: a model check's error would echo every value read (passwords, keys).
    model_config = SettingsConfigDict(env_prefix="KARIOS_", extra="ignore", hide_input_in_errors=True)

    dev_mode: bool = Field(False, description="Allow unsafe defaults (development key, generated tokens).")
    nats_url: str = Field("nats://127.0.0.1:4222", description="NATS server URL(s), comma-separated.")
    nats_user: str = Field(
        "",
        description="NATS user the services connect as (with nats_password; a user in the URL works "
        "too). `karios up` sets it for its embedded NATS.",
    )
    nats_password: SecretStr | None = Field(
        None,
        description="Password of nats_user (never logged). `karios up` generates one per state "
        "directory for its embedded NATS, kept in `<state>/nats-credentials.json` (0600).",
    )
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
    bus_events_max_bytes: ByteSize = Field(
        ByteSize(1 << 30),
        gt=0,
        description="Size limit of the event stream (bytes, or e.g. `256MiB`): the oldest events go "
        "first. JetStream reserves it on each server storing the stream (at most 75 % of the free "
        "space of its store; `karios up` checks its state directory at start).",
    )
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
    tls_certfile: Path | None = Field(
        None,
        description="PEM certificate (chain) the api-gateway serves HTTPS with, instead of plain HTTP "
        "(with tls_keyfile; `karios up` and the CLI then use https URLs).",
    )
    tls_keyfile: Path | None = Field(None, description="PEM private key of tls_certfile.")
    tls_ca_bundle: Path | None = Field(
        None,
        description="PEM file of the CAs the CLI verifies the gateway's certificate with (e.g. a "
        "self-signed one); unset: the system's trust store. The install media carry it too "
        "(KARIOS_PROVISIONER_CA_BUNDLE).",
    )
    provisioner_tls: bool = Field(
        False,
        description="The provisioner serves HTTPS only on provisioner_port with tls_certfile/tls_keyfile "
        "(needs both): boot media (/media, the BMC's signed URL is then https), install images "
        "(/images), /readyz and /metrics. The certificate must name the address BMCs and installers "
        "use (KARIOS_PROVISIONER_MEDIA_URL); bodies are streamed, not sent by sendfile.",
    )
    adopt_allow_loopback: bool = Field(
        False,
        description="Let POST /controlnode/nodes adopt a node at a loopback address (a lab on one "
        "machine); unspecified, broadcast, multicast and link-local addresses are always refused.",
    )
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

    @field_validator("tls_certfile", "tls_keyfile", "tls_ca_bundle", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("nats_password", mode="before")
    @classmethod
    def _empty_password_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v else v

    @model_validator(mode="after")
    def _nats_user_pair(self) -> KariosSettings:
        if bool(self.nats_user) != (self.nats_password is not None):
            raise ValueError("KARIOS_NATS_USER and KARIOS_NATS_PASSWORD: set both or neither")
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> KariosSettings:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("KARIOS_TLS_CERTFILE and KARIOS_TLS_KEYFILE: set both (HTTPS) or neither")
        if self.provisioner_tls and self.tls_certfile is None:
            raise ValueError(
                "KARIOS_PROVISIONER_TLS needs the certificate: set KARIOS_TLS_CERTFILE and KARIOS_TLS_KEYFILE"
            )
        return self

    @property
    def gateway_scheme(self) -> str:
        """``https`` when the gateway serves TLS (tls_certfile), else ``http``."""
        return "https" if self.tls_certfile else "http"

    @property
    def provisioner_scheme(self) -> str:
        """``https`` when the provisioner serves TLS (provisioner_tls), else ``http``."""
        return "https" if self.provisioner_tls else "http"

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
