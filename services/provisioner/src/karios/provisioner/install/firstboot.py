"""The installed system's first boot report, shared by the methods that install an OS.

``firstboot.sh`` (``templates/firstboot.sh.j2``) reports the node's IP once to the callback URL
with the job token, then removes itself; ``firstboot.service`` (``templates/firstboot.service.j2``)
is the systemd unit that runs it. Pure: rendering only.
"""

from __future__ import annotations

from karios.provisioner.install import HostContext
from karios.provisioner.templating import package_templates

_ENV = package_templates("karios.provisioner.install")


def firstboot_script(ctx: HostContext) -> str:
    """``firstboot.sh``: report this node's IP to ``ctx.callback_base`` once."""
    return _ENV.get_template("firstboot.sh.j2").render(h=ctx)


def firstboot_unit(ctx: HostContext) -> str:
    """``firstboot.service``: the systemd oneshot unit that runs the script."""
    return _ENV.get_template("firstboot.service.j2").render(h=ctx)
