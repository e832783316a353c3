"""The service layer (matchbox's ``Server``): host lookup + the pure rules of :mod:`core`.

Handlers call these methods and turn results into HTTP; nothing here knows about HTTP
except the error classes, which map to statuses in one place (``karios.common.http``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from karios.bootapi import core
from karios.bootapi.core import FallbackReason
from karios.bootapi.hosts import CachedHostSource, HostSource
from karios.bootapi.metrics import BootapiMetrics
from karios.bootapi.templatesync import TemplateStore
from karios.common.contracts.inventory import Host
from karios.common.discovery_token import DEFAULT_TTL, DiscoveryTokens
from karios.common.errors import (
    InternalError,
    KariosError,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
    UpstreamError,
)
from karios.common.oscatalog import NoCatalogEntry, TemplateSet, default_set_dir, load_template_set
from karios.common.oscatalog.templates import TemplateRenderError
from karios.common.telemetry import get_logger

log = get_logger(__name__)


@lru_cache(maxsize=1)
def embedded_templates() -> TemplateSet:
    """The embedded default set: its discovery script serves a template set that has none."""
    return load_template_set(default_set_dir(), origin="embedded")


@dataclass
class BootServer:
    hosts: HostSource
    templates: TemplateStore
    metrics: BootapiMetrics
    base_url: str
    fallback: str = "local"
    provision_token: str | None = None
    # Discovery of unknown servers (BOOTAPI_DISCOVERY_ENABLED): how an unknown MAC boots, and the
    # tokens it gets; None = off (the fallback script).
    discovery: core.DiscoveryBoot | None = None
    discovery_tokens: DiscoveryTokens | None = None
    discovery_ttl: float = DEFAULT_TTL
    clock: Callable[[], float] = time.time
    max_memo: int = 100_000
    # Rendered iPXE scripts, reused while the template generation and the cached Host object are the
    # same ones (a cache refresh or invalidation yields a new Host object, so no stale script survives).
    _memo: dict[tuple[str, str], tuple[object, str]] = field(default_factory=dict, repr=False)
    _memo_generation: int = -1

    def _memoized(self, key: tuple[str, str], owner: object, render: Callable[[], str]) -> str:
        if self._memo_generation != self.templates.generation:
            self._memo.clear()
            self._memo_generation = self.templates.generation
        hit = self._memo.get(key)
        if hit is not None and hit[0] is owner:
            return hit[1]
        text = render()
        if len(self._memo) >= self.max_memo:
            self._memo.clear()
        self._memo[key] = (owner, text)
        return text

    # -- /ipxe -------------------------------------------------------------------
    def _fallback(self, reason: FallbackReason, mac: str | None) -> str:
        self.metrics.ipxe_fallback.labels(reason.value).inc()
        if reason is FallbackReason.GATED:
            self.metrics.ipxe_gated.inc()
        templates = self.templates.get()
        script = self._memoized(
            ("fallback", mac or ""),
            templates,
            lambda: core.render_fallback_script(templates, self.fallback, mac),
        )
        self.metrics.child(self.metrics.render, "ipxe", "ok").inc()
        return script

    def _discovery(self, mac: str) -> str:
        """The live environment in discovery mode for an unknown MAC, with a new token (never
        memoized: each answer carries its own expiry); the fallback if its template fails."""
        assert self.discovery is not None and self.discovery_tokens is not None
        templates = self.templates.get()
        if core.DISCOVERY_TEMPLATE not in templates.sources:  # a template set older than discovery
            templates = embedded_templates()
        token = self.discovery_tokens.issue(mac, now=self.clock(), ttl=self.discovery_ttl)
        try:
            script = core.render_discovery_script(templates, self.discovery, mac, token)
        except TemplateRenderError as exc:
            self.metrics.render.labels("ipxe", "error").inc()
            log.error("discovery template failed; serving fallback", mac=mac, error=str(exc))
            return self._fallback(FallbackReason.RENDER, mac)
        self.metrics.ipxe_discovery.inc()
        self.metrics.child(self.metrics.render, "ipxe", "ok").inc()
        log.info("unknown MAC booted into discovery", mac=mac)
        return script

    async def ipxe_script(self, raw_mac: str | None) -> str:
        """Always a valid iPXE script: the installer for a known, enabled host, else the fallback."""
        mac = core.parse_ipxe_mac(raw_mac)
        if mac is None:
            return self._fallback(FallbackReason.BAD_MAC, None)
        try:
            host = await self.hosts.by_mac(mac)
        except KariosError as exc:
            log.warning("inventory lookup failed; serving fallback", mac=mac, error=exc.message)
            return self._fallback(FallbackReason.ERROR, mac)
        templates = self.templates.get()
        decision = core.decide_boot(host, templates)
        if decision.entry is None or host is None:
            assert decision.reason is not None
            if decision.reason is FallbackReason.UNKNOWN and self.discovery is not None:
                return self._discovery(mac)
            return self._fallback(decision.reason, mac)
        try:
            entry = decision.entry
            script = self._memoized(
                ("ipxe", mac),
                host,
                lambda: core.render_ipxe_script(templates, host, mac, entry, self.base_url),
            )
        except TemplateRenderError as exc:
            self.metrics.render.labels("ipxe", "error").inc()
            log.error("iPXE template failed; serving fallback", host=host.name, error=str(exc))
            return self._fallback(FallbackReason.RENDER, mac)
        self.metrics.child(self.metrics.render, "ipxe", "ok").inc()
        return script

    # -- /ks ---------------------------------------------------------------------
    async def _find(self, ident: core.Ident) -> Host | None:
        host = await self.hosts.by_mac(ident.mac) if ident.mac else None
        if host is None and ident.name:
            host = await self.hosts.by_name(ident.name)
        return host

    async def install_config(self, raw_ident: str) -> str:
        """The kickstart/preseed: 404 unknown host, 502 inventory failure."""
        ident = core.parse_ident(raw_ident)
        if ident is None:
            raise NotFound(f"no host {raw_ident!r}")
        try:
            host = await self._find(ident)
        except KariosError as exc:
            raise UpstreamError(f"inventory lookup failed: {exc.message}") from None
        if host is None:
            raise NotFound(f"no host {ident.text!r}")
        templates = self.templates.get()
        try:
            entry = templates.catalog.select(host.platform, host.role)
        except NoCatalogEntry as exc:
            raise NotFound(f"host {host.name!r}: {exc.message}") from None
        kind = core.config_kind(entry)
        mac = (
            ident.mac
            if ident.mac and host.name.lower() != (ident.name or "").lower()
            else core.boot_mac(host)
        )
        try:
            text = core.render_install_config(
                templates,
                host,
                entry,
                mac=mac,
                base_url=self.base_url,
                provision_token=self.provision_token or "",
            )
        except TemplateRenderError as exc:
            self.metrics.render.labels(kind, "error").inc()
            log.error("install config template failed", host=host.name, error=str(exc))
            raise InternalError(f"template for {entry.name} failed: {exc}") from None
        self.metrics.render.labels(kind, "ok").inc()
        return text

    # -- /provisioned --------------------------------------------------------------
    async def provisioned(self, raw_ident: str, headers: Mapping[str, str]) -> None:
        """Clear ``pxe_enabled``: 503 no token configured, 401 bad token, 404 unknown, 502 write failed."""
        result = "error"
        try:
            if not self.provision_token:
                result = "disabled"
                raise ServiceUnavailable(
                    "the provisioned callback is disabled: no BOOTAPI_PROVISION_TOKEN set"
                )
            if not core.token_matches(core.bearer_token(headers), self.provision_token):
                result = "unauthorized"
                raise Unauthorized("missing or wrong provision token")
            ident = core.parse_ident(raw_ident)
            if ident is None:
                result = "notfound"
                raise NotFound(f"no host {raw_ident!r}")
            target = ident.mac or ident.name or ""
            try:
                await self.hosts.set_pxe_enabled(target, False)
            except NotFound:
                if not (ident.mac and ident.name):
                    result = "notfound"
                    raise
                await self.hosts.set_pxe_enabled(ident.name, False)
            result = "ok"
        except NotFound:
            result = "notfound"
            raise
        except KariosError as exc:
            if result == "error":
                raise UpstreamError(f"could not clear pxe_enabled: {exc.message}") from None
            raise
        finally:
            self.metrics.provisioned.labels(result).inc()
            log.info("provisioned callback", ident=raw_ident, result=result)
        if isinstance(self.hosts, CachedHostSource):
            self.hosts.invalidate(name=ident.name or "", macs=[ident.mac] if ident.mac else [])
