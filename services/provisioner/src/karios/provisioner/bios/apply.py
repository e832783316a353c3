"""BIOS over Redfish (the adapter): read ``Bios``, PATCH its settings object, read back.

Links are followed (the System's ``Bios``, the Bios's ``@Redfish.Settings.SettingsObject``: Dell
``Bios/Settings``, Lenovo ``Bios/Pending``, Supermicro ``Bios/SD``, HPE ``bios/settings/``); the
apply time is sent only when the BMC lists it (``SupportedApplyTimes`` with ``OnReset``), else the
firmware's default applies — every captured one applies pending settings at the next reset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from karios.provisioner.drivers.redfish import RedfishDriver

Doc = dict[str, Any]


@dataclass(frozen=True)
class BiosResource:
    uri: str
    settings_uri: str
    apply_time: str  # "OnReset" when the BMC lists it; "" = the firmware's default
    attributes: dict[str, Any]


def _link(doc: Doc, key: str) -> str:
    value = doc.get(key)
    return str(value.get("@odata.id") or "") if isinstance(value, dict) else ""


def parse_bios(doc: Doc, uri: str) -> BiosResource:
    """A ``Bios`` document → where its settings go and with which apply time (pure)."""
    settings = doc.get("@Redfish.Settings") if isinstance(doc.get("@Redfish.Settings"), dict) else {}
    target = _link(settings or {}, "SettingsObject") or f"{uri.rstrip('/')}/Settings"
    times = (settings or {}).get("SupportedApplyTimes") or []
    attrs = doc.get("Attributes") if isinstance(doc.get("Attributes"), dict) else {}
    return BiosResource(uri, target, "OnReset" if "OnReset" in times else "", dict(attrs or {}))


def patch_body(attributes: dict[str, Any], apply_time: str) -> Doc:
    body: Doc = {"Attributes": attributes}
    if apply_time:
        body["@Redfish.SettingsApplyTime"] = {"ApplyTime": apply_time}
    return body


async def bios_uri(drv: RedfishDriver) -> str:
    """The System's ``Bios`` link ('' when the BMC offers none)."""
    system = await drv.system(await drv.system_uri())
    return _link(system, "Bios")


async def read(drv: RedfishDriver, uri: str) -> BiosResource:
    return parse_bios(await drv.get(uri), uri)


async def write(drv: RedfishDriver, res: BiosResource, attributes: dict[str, Any]) -> None:
    await drv.request("PATCH", res.settings_uri, patch_body(attributes, res.apply_time))


async def pending(drv: RedfishDriver, res: BiosResource) -> dict[str, Any]:
    """The settings object's ``Attributes`` (what is still waiting for a reset); {} if unreadable."""
    try:
        doc = await drv.get(res.settings_uri)
    except Exception:  # only a hint in a report
        return {}
    attrs = doc.get("Attributes")
    return dict(attrs) if isinstance(attrs, dict) else {}
