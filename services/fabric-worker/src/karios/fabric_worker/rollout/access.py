"""From stored rows to the rollout's inputs: the config row → :class:`FabricIntent`, the
inventory's node access → :class:`NodeTarget`. Secrets (BGP password, OSPF key, OS passwords,
the SSH private key) are decrypted here, only when the caller is about to use them, and only
handed to the rollout core; events, replies and logs never carry them."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from karios.common.contracts.fabric import BGP_PASSWORD_CONTEXT, OSPF_AUTH_KEY_CONTEXT
from karios.common.contracts.inventory import NodeAccess
from karios.common.contracts.nodes import NodeCredentials, password_context, private_key_context
from karios.common.crypto import SecretBox
from karios.common.errors import Conflict, ValidationFailed
from karios.common.netaddr import ip_sort_key
from karios.fabric_worker.config import store
from karios.fabric_worker.config.sessions import evpn_sessions
from karios.fabric_worker.models import FabricConfigRow
from karios.fabric_worker.rollout.intent import FabricIntent, NodeTarget
from karios.fabric_worker.settings import FabricWorkerSettings


def check_ip(value: str, field: str = "node_ip") -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValidationFailed(f"{field}: {value!r} is not an IP address", field=field) from None


def baseline_context(job_id: str, node_ip: str) -> str:
    """SecretBox associated data: a stored baseline only decrypts as that job's, that node's."""
    return f"fabric:baseline:{job_id}:{node_ip}"


def _intent_fields(row: FabricConfigRow, settings: FabricWorkerSettings) -> dict[str, Any]:
    cfg = store.fields_of(row)
    underlay_cidr = row.underlay_cidr or cfg.management_cidr
    required = {
        "as": cfg.as_,
        "fabric_switch_peering_ip": cfg.fabric_switch_peering_ip,
        "router_id_base": cfg.router_id_base,
        "router_id_prefix_len": cfg.router_id_prefix_len,
        "management_cidr": underlay_cidr,
    }
    for name, value in required.items():
        if not value:
            raise Conflict(f"{name}: required before the fabric can be rolled out", field=name)
    auth = cfg.ospf_auth_type if cfg.ospf_auth_type not in ("", "none") else "none"
    sessions = evpn_sessions(cfg)  # the same model the switch configuration is rendered from
    return {
        "asn": sessions.node_asn,
        "peer_ip": sessions.hub_ip,
        "update_source": sessions.node_update_source,
        "peer_asn": cfg.fabric_switch_as or None,
        "router_id_base": cfg.router_id_base,
        "router_id_prefix_len": cfg.router_id_prefix_len,
        "underlay_cidr": underlay_cidr,
        "underlay": "ospf" if cfg.ospf_enabled else "bgp",
        "ospf_area": cfg.ospf_area or "0.0.0.0",
        "ospf_hello_interval": cfg.ospf_hello_interval or 10,
        "ospf_dead_interval": cfg.ospf_dead_interval or 40,
        "ospf_auto_ref_bw": cfg.ospf_auto_ref_bw or None,
        "ospf_auth_type": auth,
        "ospf_auth_key_id": cfg.ospf_auth_key_id or 1,
        "bfd_enabled": cfg.bfd_enabled,
        "vxlan_mtu": cfg.vxlan_mtu or 1500,
        "advertise_all_vni": cfg.advertise_all_vni,
        "vnis": settings.vni_list(),
        "frr_log_file": settings.frr_log_file,
    }


def intent_of(
    row: FabricConfigRow, settings: FabricWorkerSettings, box: SecretBox | None = None
) -> FabricIntent:
    """The stored config as the rollout's intent (409 naming the field when it cannot be rolled
    out). With `box` the secrets are decrypted into it; without, the intent is only a check."""
    kwargs = _intent_fields(row, settings)
    if box is not None and row.bgp_password_enc:
        kwargs["bgp_password"] = box.decrypt(row.bgp_password_enc, context=BGP_PASSWORD_CONTEXT)
    if row.ospf_auth_key_enc and kwargs["ospf_auth_type"] != "none":
        # Only checking: the stored key (its length and characters were checked when it was
        # written) is stood in for, so a config with OSPF authentication passes the check.
        kwargs["ospf_auth_key"] = (
            box.decrypt(row.ospf_auth_key_enc, context=OSPF_AUTH_KEY_CONTEXT) if box else "stored-key"
        )
    try:
        return FabricIntent(**kwargs)
    except ValidationError as exc:  # only loc + msg: never the (secret) input value
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "config"
        raise Conflict(f"the fabric configuration cannot be rolled out: {loc}: {first.get('msg')}") from None


def private_key(settings: FabricWorkerSettings) -> str | None:
    path = settings.ssh_key
    if path is None:
        return None
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise Conflict(f"KARIOS_FABRIC_SSH_KEY {path}: cannot read ({exc.strerror})") from None


def _node_secrets(
    a: NodeCredentials | NodeAccess, box: SecretBox, own: bool
) -> tuple[str | None, str | None]:
    """(password, private key) of a node, decrypted: compute nodes (`own`) under the node
    contexts, registry rows under ``os:<bmc_ip>`` (and no key of their own)."""
    if not own:
        assert isinstance(a, NodeAccess)
        pw = box.decrypt(a.os_password_enc, context=f"os:{a.bmc_ip}") if a.os_password_enc else None
        return pw, None
    pw = box.decrypt(a.os_password_enc, context=password_context(a.node_ip)) if a.os_password_enc else None
    key = (
        box.decrypt(a.ssh_private_key_enc, context=private_key_context(a.node_ip))
        if a.ssh_private_key_enc
        else None
    )
    return pw, key


def node_targets(
    access: list[NodeAccess], box: SecretBox, key: str | None, known: dict[str, str]
) -> list[NodeTarget]:
    """Registered nodes as SSH targets (OS passwords decrypted here), in address order;
    `known`: host keys first seen by an earlier job, used when the inventory has none.
    An adopted node logs in with its own credentials only (not the worker's `key`); a node
    registered at first boot with its password or the worker's key (the installer may have
    authorized it)."""
    out = []
    for a in access:
        own = a.source != "registry"
        password, own_key = _node_secrets(a, box, own)
        out.append(
            NodeTarget(
                node_ip=a.node_ip,
                fqdn=a.fqdn or a.hostname,
                ssh_port=a.ssh_port,
                username=a.os_username or "root",
                private_key=own_key or (None if a.source == "adopted" and password else key),
                password=password,
                known_host_key=a.ssh_host_key or known.get(a.node_ip),
            )
        )
    return sorted(out, key=lambda t: ip_sort_key(t.node_ip))


def adoption_target(creds: NodeCredentials, box: SecretBox, key: str | None, known: str | None) -> NodeTarget:
    """The one-shot target of a host-key pinning (labelled by address and port in errors)."""
    password, own_key = _node_secrets(creds, box, True)
    return NodeTarget(
        node_ip=creds.node_ip,
        fqdn=f"{creds.node_ip} port {creds.ssh_port}",
        ssh_port=creds.ssh_port,
        username=creds.os_username,
        private_key=own_key or (None if password else key),
        password=password,
        known_host_key=known,
    )
