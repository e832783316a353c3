"""The wipe: the live environment erases every disk (or the ones named) and powers off.

``wipe.sh`` (``templates/wipe.sh.j2``), per disk: what is built on it (md arrays, mappings)
erased through itself and stopped; ``wipefs -a`` on every partition, then on the disk; a discard
where the device takes one, checked by reading back the regions that held data (a discard may be
accepted and change nothing); then every known signature location of the disk and of each former
partition (both ends, btrfs mirrors at 64 MiB/256 GiB, ext2/3/4 backup superblocks, md/LVM/ZFS
labels, GPT backup) overwritten with zeros and read back with direct I/O, and ``blkid`` asked.
One ``wipe:<disk>`` step per disk says which method erased what and how it was verified; a
region that does not read back as zeros fails the job.

Policy (``wipe_policy`` of the provisioner config, per deployment): ``fast`` is the above;
``secure`` runs the secure-erase ladder first, per disk the strongest erase the device supports —
NVMe sanitize (crypto, block erase), NVMe format with secure erase (crypto, user data), ATA
security erase (enhanced, normal; only when supported, not frozen, no password set), SCSI sanitize
(crypto, block, overwrite) — verified by markers written before it at sampled offsets that must be
gone afterwards; a rung that is not supported or fails (or is not verified) is named in the step
and the next one tried, the last being zeros over the first and last GiB read back whole. Then
the fast steps.
"""

from __future__ import annotations

from typing import Any

from karios.common.errors import PermanentFailure
from karios.provisioner.install import WIPE_STAGES, HostContext, Medium, ca_overlay
from karios.provisioner.install.image import LIVE_KERNEL_ARGS, stage_percents
from karios.provisioner.install.live import (
    ImageSettings,
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
    POLICIES = ("fast", "secure")

    def __init__(self, cfg: Any, settings: ImageSettings | None = None) -> None:
        super().__init__(cfg, settings)
        self.policy = str(getattr(cfg, "wipe_policy", None) or "fast")
        if self.policy not in self.POLICIES:
            raise PermanentFailure(f"wipe_policy {self.policy!r}: use one of {', '.join(self.POLICIES)}")

    def prepare(self, major: str, suite: str) -> None:
        self.images.build(suite, with_root=False)

    def render_wipe_script(self, ctx: HostContext) -> str:
        """``wipe.sh`` for one host (pure)."""
        data = {**vars(ctx), "disks": dev_paths(ctx.disks), "wipe_policy": self.policy}
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
                **ca_overlay(ctx.ca_bundle),
            },
            kernel_args=list(LIVE_KERNEL_ARGS),
            label="Karios wipe",
        )
