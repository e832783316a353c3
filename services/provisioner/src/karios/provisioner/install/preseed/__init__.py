"""The "preseed" install method: the Debian installer (netboot kernel + initrd) with a preseeded initrd.

Wraps :mod:`.render` (rendering, owned there; its templates in ``templates/``) behind
:class:`InstallMethod`.
``PreseedWipeMethod`` is the installer-based wipe, used for unprovision until the live-environment
wipe method is installed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from karios.common.errors import PermanentFailure
from karios.provisioner.install import INSTALL_STAGES, WIPE_STAGES, HostContext, Medium, Stage
from karios.provisioner.install.preseed import render
from karios.provisioner.media import NETBOOT_ROOT, netboot_dir

ARGS = ["auto=true", "priority=critical"]


def preseed_context(ctx: HostContext) -> Any:
    """The context :mod:`.render` renders from (its own class until it adopts the interface's)."""
    cls = render.HostContext
    if cls is HostContext:
        return ctx
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dataclasses.asdict(ctx).items() if k in names})


class PreseedMethod:
    name = "preseed"
    stages: tuple[Stage, ...] = INSTALL_STAGES
    job_type = "provision"

    def __init__(self, cfg: Any = None, netboot_root: Path = NETBOOT_ROOT) -> None:
        self.cfg = cfg
        self.netboot_root = Path(netboot_root)

    def _netboot(self, major: str) -> Path:
        return netboot_dir(major, "amd64", self.netboot_root)

    def tools_missing(self) -> list[str]:
        return [] if self.netboot_root.is_dir() else [str(self.netboot_root)]

    def prepare(self, major: str, suite: str) -> None:
        src = self._netboot(major)
        if not (src / "linux").exists():
            raise PermanentFailure(
                f"debian_version: installer for Debian {major} not found at {src} "
                f"(apt-get install debian-installer-{major}-netboot-amd64)"
            )

    def medium(self, ctx: HostContext) -> Medium:
        src = self._netboot(ctx.major)
        pctx = preseed_context(dataclasses.replace(ctx, job_type=self.job_type))
        return Medium(
            kernel=src / "linux",
            initrd=src / "initrd.gz",
            overlay=render.render_media_files(pctx),
            kernel_args=[*ARGS, "---"],
            label=f"Karios {self.job_type}",
        )


class PreseedWipeMethod(PreseedMethod):
    name = "wipe"
    stages = WIPE_STAGES
    job_type = "unprovision"
