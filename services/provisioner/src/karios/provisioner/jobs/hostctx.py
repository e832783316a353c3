"""One host's :class:`HostContext` from the (already validated) request, the settings and the job token.

Secrets are decrypted here, just before the medium is rendered, and hashed at once.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from karios.common.bus.runtime import Bus
from karios.common.contracts.images import ImageView
from karios.common.contracts.inventory import AllocateIp, Host, HostQuery, IpAllocation
from karios.common.contracts.provision import POOL_TYPES, StartProvision
from karios.common.crypto import SecretBox
from karios.common.errors import NotFound, PermanentFailure, ValidationFailed
from karios.common.provisioning import ZFS_VDEVS, gpu_kernel_args, resolve_pool_backend
from karios.provisioner.bmc import serial_console_for
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.install import HostContext, InstallMethod
from karios.provisioner.install.preseed.render import hash_password
from karios.provisioner.media import debian_release

DEFAULT_OS_PASSWORD = "adminadmin"  # noqa: S105 - the seed's default when the request names none


async def device_nameservers(bus: Bus, name: str) -> list[str]:
    """The name servers the inventory gives device ``name`` (NetBox config context
    ``karios.network.nameservers``, a file inventory's ``nameservers``); [] when it names none."""
    try:
        host = await bus.request(bus.subjects.query("inventory", "host"), HostQuery(name=name), reply=Host)
    except NotFound:
        return []
    return list(host.nameservers)


async def static_address(bus: Bus, cmd: StartProvision) -> dict[str, Any] | None:
    """With ``prefix_id``: a static address from the inventory (NetBox prefix or the file pool),
    with the device's own name servers from the inventory (else the pool's gateway)."""
    spec = cmd.spec
    if spec.prefix_id is None:
        return None
    alloc = await bus.request(
        bus.subjects.request("inventory", "allocate_ip"),
        AllocateIp(name=spec.hostname, prefix_id=spec.prefix_id),
        reply=IpAllocation,
    )
    iface = ipaddress.ip_interface(alloc.address)
    servers = await device_nameservers(bus, spec.hostname)
    return {
        "address": str(iface.ip),
        "netmask": str(iface.netmask),
        "gateway": alloc.gateway,
        "nameservers": servers or ([alloc.gateway] if alloc.gateway else []),
    }


def _mirror(cfg: ProvisionerConfig, override: str) -> tuple[str, str]:
    if not override:
        return cfg.mirror_host, cfg.mirror_dir
    host, _, path = override.partition("/")
    return host, "/" + path.strip("/")


def _callback_base(cfg: ProvisionerConfig, cmd: StartProvision) -> str:
    base = cfg.callback_url.rstrip("/")
    if cmd.spec.controlnode_host:
        base = f"http://{cmd.spec.controlnode_host}:{cmd.spec.controlnode_port or 8080}"
    return f"{base}/controlnode"


def _served_at(cfg: ProvisionerConfig, path: str) -> str:
    """Where targets fetch ``/images/<path>`` (the image URL setting, else the media URL)."""
    return f"{(cfg.image_url or cfg.media_url).rstrip('/')}/images/{path}"


def _image_url(cfg: ProvisionerConfig, method: InstallMethod, suite: str) -> str:
    path = getattr(method, "image_path", None)
    return _served_at(cfg, path(suite)) if path else ""


def _catalog_image(cfg: ProvisionerConfig, image: ImageView | None) -> dict[str, Any]:
    """The HostContext fields of a catalog image (none: Karios's own image of the suite)."""
    if image is None:
        return {}
    return {
        "image_name": image.name,
        "image_path": image.path,
        "image_url": _served_at(cfg, image.path),
        "image_format": image.served_format,
        "image_sha256": image.served_sha256,
        "image_disk_bytes": image.disk_bytes,
    }


async def host_context(
    bus: Bus,
    box: SecretBox,
    cfg: ProvisionerConfig,
    cmd: StartProvision,
    token: str,
    method: InstallMethod,
    image: ImageView | None = None,
) -> HostContext:
    """``image``: the catalog image the request names (ready), None for Karios's own."""
    spec = cmd.spec
    major, suite = debian_release(spec.debian_version)
    ip = spec.bmc_ip
    password = box.decrypt(spec.os_password_enc, context=f"os:{ip}") if spec.os_password_enc else ""
    root = box.decrypt(spec.root_pass_enc, context=f"os:{ip}") if spec.root_pass_enc else ""
    mirror_host, mirror_dir = _mirror(cfg, spec.mirror)
    level = POOL_TYPES.get(spec.pool_type, (None, 0, None))[0]
    try:  # the method is known here (the request may have left it to the deployment's default)
        backend = resolve_pool_backend(
            spec.pool_backend,
            spec.pool_type,
            getattr(method, "name", None),
            catalog_archive=image is not None and not image.whole_disk,
        )
    except ValidationFailed as exc:
        raise PermanentFailure(exc.message) from None
    return HostContext(
        job_id=cmd.job_id,
        token=token,
        callback_base=_callback_base(cfg, cmd),
        hostname=spec.hostname or "node",
        bmc_ip=ip,
        os_username=spec.os_username or "debian",
        password_hash=hash_password(password or DEFAULT_OS_PASSWORD),
        root_password_hash=hash_password(root) if root else "",
        disks=list(spec.selected_disks),
        md_level=level,
        pool_backend=backend,
        zfs_vdev=ZFS_VDEVS.get(spec.pool_type, ""),
        nic=spec.selected_nic or "auto",
        nic_mac=spec.selected_nic_mac,
        static=await static_address(bus, cmd),
        nameservers=list(cfg.nameservers),
        kernel_args=gpu_kernel_args(spec.gpu_passthrough),
        ssh_authorized_keys=list(spec.ssh_authorized_keys),
        serial_console=serial_console_for(cfg, spec.vendor),
        suite=suite,
        major=major,
        mirror_host=mirror_host,
        mirror_dir=mirror_dir,
        mirror_proxy=spec.http_proxy or cfg.mirror_proxy,
        security_host=cfg.security_host,
        security_dir=cfg.security_dir,
        updates=cfg.updates,
        job_type=cmd.job_type,
        ca_bundle=cfg.ca_pem(),
        **({"image_url": _image_url(cfg, method, suite)} | _catalog_image(cfg, image)),
    )
