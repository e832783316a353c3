"""The cloud-init NoCloud seed of a whole-disk image install (pure: rendering only).

The live environment writes these three files to a small vfat partition labelled ``CIDATA`` after
the image's last partition (``templates/install_disk.sh.j2``); cloud-init's NoCloud datasource
finds it by that label on the first boot of any image with cloud-init (Debian, Ubuntu, RHEL-like
cloud images):

- ``user-data``: hostname, the request's user with its password hash and SSH keys (sudo), the
  root password hash when asked, the deployment's CA, and ``phone_home`` — the first-boot report,
  posted by cloud-init to ``POST /controlnode/job/{id}/phone-home?token=…`` once it has run;
- ``meta-data``: ``instance-id`` (``karios-<job id>``: a new install is a new instance) and the
  hostname;
- ``network-config`` (v2): the NIC by its MAC — the request's ``selected_nic_mac``, else the MAC of
  the NIC the live environment installed through (:data:`LIVE_NIC_MAC`, filled in by the script: a
  name pattern is not a match every renderer honours — cloud-init 22.4's networkd renderer writes
  the config's id as the name), DHCP or the inventory's static address, gateway and name servers.

Every value is rendered as a JSON string, which YAML reads as is: a key, hash or name cannot break
the document. No secret in clear: the passwords are hashes, the job token dies with its job.
"""

from __future__ import annotations

import ipaddress

from karios.common.contracts.images import SEED_MIB
from karios.provisioner.install import HostContext
from karios.provisioner.install.live import as_list
from karios.provisioner.templating import package_templates

_ENV = package_templates("karios.provisioner.install.image")
SEED_FILES = ("user-data", "meta-data", "network-config")
__all__ = ["LIVE_NIC_MAC", "SEED_MIB", "phone_home_url", "seed_files"]
#: Stands for the MAC of the NIC the live environment used; ``install_disk.sh`` replaces it.
LIVE_NIC_MAC = "00:00:5e:00:53:ff"  # an RFC 7042 documentation MAC: never a real NIC's


def phone_home_url(ctx: HostContext) -> str:
    """Where cloud-init's phone_home posts: the job's callback, its token in the query (cloud-init
    cannot send a header)."""
    return f"{ctx.callback_base.rstrip('/')}/job/{ctx.job_id}/phone-home?token={ctx.token}"


def network_config(ctx: HostContext) -> str:
    st = ctx.static or {}
    match = {"macaddress": (ctx.nic_mac or LIVE_NIC_MAC).lower()}
    address = ""
    if st.get("address"):
        mask = st.get("netmask") or st.get("prefix") or 24
        address = ipaddress.ip_interface(f"{st['address']}/{mask}").with_prefixlen
    return _ENV.get_template("network-config.j2").render(
        match=match,
        address=address,
        gateway=st.get("gateway") or "" if address else "",
        nameservers=ctx.nameservers or as_list(st.get("nameservers")),
    )


def seed_files(ctx: HostContext) -> dict[str, str]:
    """``user-data``, ``meta-data`` and ``network-config`` for ``ctx``."""
    return {
        "user-data": _ENV.get_template("user-data.j2").render(h=ctx, phone_home_url=phone_home_url(ctx)),
        "meta-data": _ENV.get_template("meta-data.j2").render(h=ctx),
        "network-config": network_config(ctx),
    }
