"""The wipe: the live environment erases every disk (or the ones named) and powers off.

``wipe.sh`` (``templates/wipe.sh.j2``) stops md arrays, clears signatures on partitions and
disks (``wipefs``), discards where the device supports it, zeroes the first and last MiB with
direct I/O, reads both ends back to check, and reports one ``wipe:<disk>`` step per disk with
its result before ``wiped`` and ``complete``.
"""

from __future__ import annotations

from karios.common.errors import PermanentFailure
from karios.provisioner.install import WIPE_STAGES, HostContext, Medium
from karios.provisioner.install.image import LIVE_KERNEL_ARGS, stage_percents
from karios.provisioner.install.live import (
    LiveMethod,
    dev_paths,
    net_env,
    script_environment,
)

_SCRIPTS = script_environment("karios.provisioner.install.wipe")


class WipeMethod(LiveMethod):
    """:class:`~karios.provisioner.install.InstallMethod` ``wipe``."""

    name = "wipe"
    stages = WIPE_STAGES

    def prepare(self, major: str, suite: str) -> None:
        self.images.build(suite, with_root=False)

    def render_wipe_script(self, ctx: HostContext) -> str:
        """``wipe.sh`` for one host (pure)."""
        data = {**vars(ctx), "disks": dev_paths(ctx.disks)}
        return _SCRIPTS.get_template("wipe.sh.j2").render(**data, stages=stage_percents(self.stages))

    def medium(self, ctx: HostContext) -> Medium:
        art = self.images.artifacts(ctx.suite)
        if not (art.kernel.exists() and art.initrd.exists()):
            raise PermanentFailure(
                f"wipe: live environment for {ctx.suite} not built under {art.kernel.parent}"
            )
        return Medium(
            kernel=art.kernel,
            initrd=art.initrd,
            overlay={
                "karios/run.sh": self.render_wipe_script(ctx),
                "karios/net.env": net_env(ctx.nic_mac, ctx.static, ctx.nameservers),
            },
            kernel_args=list(LIVE_KERNEL_ARGS),
            label="Karios wipe",
        )
