"""The install methods this provisioner has: ``{"preseed": …, "image": …, "wipe": …}``.

"image" and the live-environment "wipe" are registered when their packages are installed;
until then "wipe" is the Debian-installer wipe of the preseed method.
"""

from __future__ import annotations

import importlib
from typing import Any

from karios.common.telemetry import get_logger
from karios.provisioner.install import InstallMethod
from karios.provisioner.install.preseed import PreseedMethod, PreseedWipeMethod

log = get_logger(__name__)


def _optional(module: str, cls: str, cfg: Any) -> InstallMethod | None:
    try:
        return getattr(importlib.import_module(module), cls)(cfg)  # type: ignore[no-any-return]
    except Exception as exc:  # not installed, or cannot start with this configuration
        log.info("install method not available", module=module, error=str(exc)[:200])
        return None


def install_methods(cfg: Any) -> dict[str, InstallMethod]:
    methods: dict[str, InstallMethod] = {"preseed": PreseedMethod(cfg), "wipe": PreseedWipeMethod(cfg)}
    image = _optional("karios.provisioner.install.image", "ImageMethod", cfg)
    if image is not None:
        methods["image"] = image
    wipe = _optional("karios.provisioner.install.wipe", "WipeMethod", cfg)
    if wipe is not None:
        methods["wipe"] = wipe
    return methods


def method_for(methods: dict[str, InstallMethod], job_type: str, requested: str | None, default: str) -> str:
    """The method name a job uses: unprovision always wipes; else the request's, or the default.

    A default that is not installed (the image method before its package exists) falls back to
    "preseed"; a requested method that is not installed is the job's failure, named.
    """
    if job_type == "unprovision":
        return "wipe"
    if requested:
        return requested
    return default if default in methods else "preseed"
