"""The one template convention of the provisioner: a package that renders text keeps its Jinja2
templates in ``templates/`` beside its code and loads them with :func:`package_templates`.

Every template renders text (boot menus, preseed answers, shell scripts, systemd units), never
HTML: undefined names are errors, trailing newlines are kept, nothing is escaped.
"""

from __future__ import annotations

from jinja2 import BaseLoader, ChoiceLoader, Environment, PackageLoader, StrictUndefined


def package_templates(package: str, *fallbacks: BaseLoader) -> Environment:
    """Jinja2 over ``<package>/templates/``; ``fallbacks``: loaders asked for names it lacks."""
    own = PackageLoader(package, "templates")
    return Environment(
        loader=ChoiceLoader([own, *fallbacks]) if fallbacks else own,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - text, never HTML
    )
