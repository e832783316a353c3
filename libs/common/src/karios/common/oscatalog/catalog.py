"""Catalog entries: which installer a host gets, chosen from its NetBox platform and role (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urljoin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from karios.common.errors import NotFound


class NoCatalogEntry(NotFound):
    """A known host whose platform/role no catalog entry serves."""


class CatalogEntry(BaseModel):
    """One OS: boot images, installer arguments and the config template.

    ``kernel``/``initrd`` may be absolute URLs or paths relative to ``repo``.
    ``roles`` empty means any role; an entry naming the host's role wins over a generic one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    platforms: tuple[str, ...] = Field(min_length=1)
    roles: tuple[str, ...] = ()
    installer: Literal["kickstart", "preseed"]
    template: str
    repo: str = ""
    kernel: str
    initrd: tuple[str, ...] = Field(min_length=1)
    args: tuple[str, ...] = ()
    vars: dict[str, Any] = Field(default_factory=dict)

    @field_validator("platforms", "roles", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        return tuple(str(x).strip().lower() for x in v) if isinstance(v, list | tuple) else v

    def _url(self, path: str) -> str:
        if "://" in path or not self.repo:
            return path
        return urljoin(self.repo.rstrip("/") + "/", path.lstrip("/"))

    @property
    def kernel_url(self) -> str:
        return self._url(self.kernel)

    @property
    def initrd_urls(self) -> list[str]:
        return [self._url(p) for p in self.initrd]

    def serves(self, platform: str, role: str) -> bool:
        return platform.lower() in self.platforms and (not self.roles or role.lower() in self.roles)


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True)

    entries: tuple[CatalogEntry, ...] = ()

    def select(self, platform: str, role: str = "") -> CatalogEntry:
        """The entry for a host: role-specific before generic; ties are refused at load time."""
        matches = [e for e in self.entries if e.serves(platform or "", role or "")]
        if not matches:
            raise NoCatalogEntry(f"no catalog entry serves platform {platform!r} role {role!r}")
        matches.sort(key=lambda e: (not e.roles, e.name))
        return matches[0]

    def by_name(self, name: str) -> CatalogEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise NoCatalogEntry(f"no catalog entry named {name!r}")

    @classmethod
    def of(cls, entries: list[CatalogEntry]) -> Catalog:
        """Build a catalog, refusing duplicate names and ambiguous platform/role pairs."""
        names: set[str] = set()
        claims: dict[tuple[str, str], str] = {}
        for e in entries:
            if e.name in names:
                raise ValueError(f"duplicate catalog entry name {e.name!r}")
            names.add(e.name)
            for p in e.platforms:
                for r in e.roles or ("*",):
                    if (p, r) in claims:
                        raise ValueError(
                            f"catalog entries {claims[(p, r)]!r} and {e.name!r} both serve platform {p!r} "
                            f"role {r!r}"
                        )
                    claims[(p, r)] = e.name
        return cls(entries=tuple(sorted(entries, key=lambda e: e.name)))


def parse_catalog_entry(text: str, *, default_name: str) -> CatalogEntry:
    """Parse one ``catalog/<name>.yaml`` document (``name`` defaults to the file stem)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("a catalog file must be a mapping")
    data.setdefault("name", default_name)
    try:
        return CatalogEntry.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise ValueError(f"{loc}: {first.get('msg')}") from None


def load_catalog(directory: Path) -> Catalog:
    """Load every ``*.yaml``/``*.yml`` in ``directory``; errors name the file."""
    entries = []
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    for f in files:
        try:
            entries.append(parse_catalog_entry(f.read_text(encoding="utf-8"), default_name=f.stem))
        except (ValueError, OSError) as exc:
            raise ValueError(f"{f.name}: {exc}") from None
    return Catalog.of(entries)
