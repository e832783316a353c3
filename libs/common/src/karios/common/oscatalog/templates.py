"""A template set: the catalog plus every Jinja2 template, parsed up front and immutable."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from karios.common.oscatalog.catalog import Catalog, load_catalog

#: Templates every set must provide (bootapi's boot script and its two fallbacks).
REQUIRED_TEMPLATES = ("ipxe/boot.ipxe.j2", "ipxe/fallback-local.ipxe.j2", "ipxe/fallback-shell.ipxe.j2")


class TemplateSetError(ValueError):
    """A template set that cannot be used (bad YAML, template syntax, missing template)."""


class TemplateRenderError(ValueError):
    """A template failed while rendering (undefined variable, error raised by the template)."""


def default_set_dir() -> Path:
    """The embedded default set (shipped as package data)."""
    return Path(__file__).parent / "data"


def _environment(sources: dict[str, str]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.DictLoader(sources),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # noqa: S701 - shell/iPXE/kickstart text, never HTML
    )
    env.filters["shell_quote"] = lambda v: shlex.quote(str(v))
    return env


@dataclass(frozen=True)
class TemplateSet:
    catalog: Catalog
    sources: dict[str, str]
    origin: str = "embedded"
    revision: str = ""
    _env: jinja2.Environment = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        env = _environment(self.sources)
        for name in sorted(self.sources):
            try:
                env.get_template(name)
            except jinja2.TemplateSyntaxError as exc:
                raise TemplateSetError(f"templates/{name}:{exc.lineno}: {exc.message}") from None
        missing = [t for t in REQUIRED_TEMPLATES if t not in self.sources]
        for entry in self.catalog.entries:
            if entry.template not in self.sources:
                missing.append(f"{entry.template} (catalog entry {entry.name})")
        if missing:
            raise TemplateSetError("missing templates: " + ", ".join(missing))
        object.__setattr__(self, "_env", env)

    def render(self, name: str, **context: Any) -> str:
        try:
            return self._env.get_template(name).render(**context)
        except jinja2.TemplateNotFound:
            raise TemplateRenderError(f"templates/{name}: not found") from None
        except jinja2.UndefinedError as exc:
            raise TemplateRenderError(f"templates/{name}: {exc.message}") from None
        except jinja2.TemplateError as exc:
            raise TemplateRenderError(f"templates/{name}: {exc}") from None


def load_template_set(directory: Path, *, origin: str | None = None, revision: str = "") -> TemplateSet:
    """Load ``catalog/`` and ``templates/`` from ``directory``; any defect raises TemplateSetError."""
    directory = Path(directory)
    tdir = directory / "templates"
    if not (directory / "catalog").is_dir() or not tdir.is_dir():
        raise TemplateSetError(f"{directory}: needs catalog/ and templates/ directories")
    try:
        catalog = load_catalog(directory / "catalog")
    except ValueError as exc:
        raise TemplateSetError(f"catalog/{exc}") from None
    sources: dict[str, str] = {}
    for f in sorted(tdir.rglob("*.j2")):
        try:
            sources[f.relative_to(tdir).as_posix()] = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateSetError(f"templates/{f.relative_to(tdir)}: {exc}") from None
    return TemplateSet(catalog=catalog, sources=sources, origin=origin or str(directory), revision=revision)
