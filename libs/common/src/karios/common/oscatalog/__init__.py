"""The distro catalog and its templates: NetBox platform/role → installer boot and config.

Shared by bootapi (PXE: iPXE script + kickstart/preseed) and the provisioner (boot media).
A *template set* is a directory laid out like the templates git repository::

    catalog/<name>.yaml      one OS per file (see :class:`CatalogEntry`)
    templates/ipxe/*.j2      iPXE scripts (boot + fallbacks)
    templates/**/*.j2        kickstarts / preseeds named by the catalog entries

The embedded default set ships inside this package (:func:`default_set_dir`). Loading
parses every YAML file and compiles every template up front, so a broken set is refused
as a whole (:class:`TemplateSetError`) and a caller can keep its last good one.
"""

from karios.common.oscatalog.catalog import (
    Catalog,
    CatalogEntry,
    NoCatalogEntry,
    load_catalog,
    parse_catalog_entry,
)
from karios.common.oscatalog.templates import (
    TemplateSet,
    TemplateSetError,
    default_set_dir,
    load_template_set,
)

__all__ = [
    "Catalog",
    "CatalogEntry",
    "NoCatalogEntry",
    "TemplateSet",
    "TemplateSetError",
    "default_set_dir",
    "load_catalog",
    "load_template_set",
    "parse_catalog_entry",
]
