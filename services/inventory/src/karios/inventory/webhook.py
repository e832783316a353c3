"""NetBox webhooks: signature check and payload → :class:`DeviceChanged`. Pure.

NetBox signs the exact request body: ``X-Hook-Signature = hex(HMAC-SHA512(secret, body))``
(netbox 4.7.3 ``extras/webhooks.py``: ``generate_signature``). The body (default template)
is ``{"event": "created|updated|deleted", "object_type": "dcim.device", "data": {...},
"snapshots": {"prechange": ..., "postchange": ...}, ...}``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from karios.common.contracts.inventory import DeviceChanged
from karios.common.netaddr import mac_or_none

SIGNATURE_HEADER = "X-Hook-Signature"

# Objects whose change can change what a host lookup or the hardware list answers: one device's
# children, and objects any device's answer may depend on (a change drops every cache entry).
DEVICE_CHILDREN = frozenset(
    {"dcim.interface", "dcim.inventoryitem", "dcim.module", "dcim.consoleport", "dcim.frontport"}
)
EVERY_DEVICE = frozenset(
    {"extras.configcontext", "dcim.moduletype", "dcim.platform", "dcim.devicerole", "dcim.site", "dcim.rack"}
)


def sign(body: bytes, secret: str) -> str:
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha512).hexdigest()


def signature_valid(body: bytes, signature: str | None, secret: str) -> bool:
    if not signature or not secret:
        return False
    return hmac.compare_digest(sign(body, secret).lower(), signature.strip().lower())


def _device_ref(obj: Any) -> tuple[int | None, str]:
    if isinstance(obj, Mapping):
        dev_id = obj.get("id")
        return (int(dev_id) if isinstance(dev_id, int) else None), str(obj.get("name") or "")
    if isinstance(obj, int):  # snapshots serialise foreign keys as bare ids
        return obj, ""
    return None, ""


def _macs(*objs: Any) -> list[str]:
    out: list[str] = []
    for obj in objs:
        if not isinstance(obj, Mapping):
            continue
        candidates = [obj.get("mac_address")]
        candidates += [
            m.get("mac_address") if isinstance(m, Mapping) else m for m in obj.get("mac_addresses") or []
        ]
        primary = obj.get("primary_mac_address")
        if isinstance(primary, Mapping):
            candidates.append(primary.get("mac_address"))
        for c in candidates:
            mac = mac_or_none(c)
            if mac is not None and mac not in out:
                out.append(mac)
    return out


def device_changed_from_webhook(payload: Mapping[str, Any]) -> DeviceChanged | None:
    """The device a NetBox change concerns, or ``None`` for objects no inventory answer depends on."""
    object_type = str(payload.get("object_type") or "")
    data = payload.get("data") if isinstance(payload.get("data"), Mapping) else {}
    snapshots = payload.get("snapshots") if isinstance(payload.get("snapshots"), Mapping) else {}
    pre = snapshots.get("prechange") if isinstance(snapshots.get("prechange"), Mapping) else {}
    assert isinstance(data, Mapping)
    if object_type == "dcim.device":
        dev_id, name = _device_ref(data)
        return DeviceChanged(device_id=dev_id, name=name)
    if object_type in EVERY_DEVICE:
        return DeviceChanged()  # no device named: every cache drops everything
    if object_type in DEVICE_CHILDREN:
        dev_id, name = _device_ref(data.get("device"))
        if dev_id is None and pre:
            dev_id, name = _device_ref(pre.get("device"))
        macs = _macs(data, pre)
        if dev_id is None and not macs:
            return None
        return DeviceChanged(device_id=dev_id, name=name, macs=macs)
    if object_type in ("dcim.macaddress", "ipam.ipaddress"):
        assigned = data.get("assigned_object")
        dev_id, name = _device_ref(assigned.get("device") if isinstance(assigned, Mapping) else None)
        macs = _macs(data, pre)
        if dev_id is None and not macs:
            return None
        return DeviceChanged(device_id=dev_id, name=name, macs=macs)
    return None
