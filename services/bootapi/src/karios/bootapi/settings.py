"""bootapi's own settings: the seed's ``BOOTAPI_*`` environment names (the bus comes from KariosSettings)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``180``, ``"90s"``, ``"3m"``, ``"1h30m"`` (Go-style durations, as the seed uses)."""
    if isinstance(value, int | float):
        return float(value)
    text = value.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {value!r} (use e.g. 90s, 3m, 1h)")
    return total


class BootapiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BOOTAPI_", extra="ignore")

    listen_addr: str = Field(
        "", description="host:port of the plain-HTTP listener (default: KARIOS host:bootapi_port)."
    )
    tls_listen_addr: str = Field("", description="host:port of the optional parallel HTTPS listener.")
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    base_url: str = Field(
        "", description="http:// URL installers use to reach bootapi (default from listen_addr)."
    )
    unknown_mac_fallback: Literal["local", "shell"] = Field(
        "local",
        description="Script for unknown/gated MACs and inventory errors: sanboot the disk, or iPXE shell.",
    )
    provision_token: SecretStr | None = Field(None, description="Shared token for POST /provisioned/{ident}.")
    discovery_enabled: bool = Field(
        False,
        description="Opt-in: answer a MAC no host owns with the live environment in discovery mode "
        "(in-band hardware report to the gateway, then power off; GET /controlnode/discovered) instead of "
        "the fallback script. Gated hosts, bad MACs and inventory errors still get the fallback.",
    )
    discovery_images_url: str = Field(
        "",
        description="Provisioner base URL as PXE targets reach it: the live kernel and initrd "
        "(/images/<suite>/) and the discovery overlay (/discovery/); default http://<KARIOS_HOST>:"
        "<KARIOS_PROVISIONER_PORT> (set it when that address is not the targets').",
    )
    discovery_suite: str = Field(
        "bookworm",
        pattern=r"^[a-z0-9][a-z0-9._-]{0,31}$",
        description="Debian release of the live environment.",
    )
    discovery_kernel_args: str = Field(
        "console=tty0 console=ttyS0,115200n8",
        description="Kernel arguments of a discovery boot after rdinit=/init panic=30 (consoles).",
    )
    discovery_token_ttl: float = Field(
        1800.0,
        gt=0,
        description="Lifetime of the discovery token of a boot (Go-style duration, default 30m).",
    )
    template_git_url: str = Field(
        "", description="Templates repo (catalog/ + templates/); empty = embedded set."
    )
    template_git_ref: str = Field("", description="Branch to follow (default: the remote's HEAD).")
    template_git_interval: float = Field(180.0, description="Re-pull period (Go-style duration, default 3m).")
    template_dir: Path | None = Field(None, description="A local template set directory instead of git.")
    cache_ttl: float = Field(
        300.0, description="Seconds a found host stays cached (device.changed drops it early)."
    )
    cache_negative_ttl: float = Field(15.0, description="Seconds an unknown MAC/name stays cached.")
    cache_size: int = Field(100_000, description="Most hosts kept in memory.")
    server: Literal["granian", "uvicorn"] = Field(
        "granian",
        description="HTTP server of both listeners, in one process: granian (Rust HTTP layer in the "
        "service's event loop; ~1.9x uvicorn's requests/s on the cached /ipxe route) or uvicorn.",
    )
    server_threads: int = Field(
        2, ge=1, le=16, description="granian's Rust I/O threads of the plain listener (Python runs on one)."
    )

    @field_validator(
        "template_git_interval", "cache_ttl", "cache_negative_ttl", "discovery_token_ttl", mode="before"
    )
    @classmethod
    def _duration(cls, v: object) -> float:
        if isinstance(v, str | int | float):
            return parse_duration(v)
        raise ValueError("not a duration")

    @field_validator("provision_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, v: object) -> object:
        return None if v in ("", None) else v

    def resolved_discovery_images_url(
        self, default_host: str, provisioner_port: int, scheme: str = "http"
    ) -> str:
        """``discovery_images_url``, else the provisioner's own listener (``https`` with
        KARIOS_PROVISIONER_TLS: an iPXE that fetches it must trust the deployment's CA)."""
        if self.discovery_images_url:
            return self.discovery_images_url.rstrip("/")
        host = "127.0.0.1" if default_host in ("", "0.0.0.0", "::") else default_host
        return f"{scheme}://{host}:{provisioner_port}"

    def resolved_listen_addr(self, default_host: str, default_port: int) -> tuple[str, int]:
        return split_addr(self.listen_addr or f"{default_host}:{default_port}")

    def resolved_base_url(self, default_host: str, default_port: int) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        host, port = self.resolved_listen_addr(default_host, default_port)
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"http://{host}:{port}"


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` → (host, port)."""
    host, _, port = addr.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"listen address needs a port: {addr!r}")
    return host.strip("[]") or "0.0.0.0", int(port)
