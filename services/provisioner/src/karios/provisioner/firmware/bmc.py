"""The Redfish side of a firmware update (the adapter): UpdateService, versions, push, task polls.

Errors of the driver (``KariosError``) pass through; the multipart push, which the JSON driver
cannot send, goes through the driver's authenticated client and translates its errors here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from karios.common.errors import KariosError, UpstreamError
from karios.provisioner.drivers.redfish import ROOT, RedfishDriver
from karios.provisioner.firmware.core import Doc, UpdatePlan, VersionSeen
from karios.provisioner.inspect import parse


async def update_service(drv: RedfishDriver) -> Doc:
    root = await drv.service_root()
    return await drv.get(parse.link(root, "UpdateService") or f"{ROOT}/UpdateService")


async def read_versions(drv: RedfishDriver, service: Doc, targets: list[str]) -> dict[str, VersionSeen]:
    """Every FirmwareInventory component (keyed by URI), plus each target that is not one of them:
    a System's ``BiosVersion``, a Manager's ``FirmwareVersion`` (what a BMC without an inventory,
    such as sushy-tools, reports). A target that cannot be read is left out (the result says so)."""
    seen: dict[str, VersionSeen] = {}
    inv_uri = parse.link(service, "FirmwareInventory")
    if inv_uri:
        try:
            members = parse.links(await drv.get(inv_uri), "Members")
        except KariosError:
            members = []  # an UpdateService whose inventory does not answer (sushy-tools: 404)
        for uri in members:
            try:
                comp = parse.firmware(await drv.get(uri), drv.quirks)
            except KariosError:
                continue
            if comp is not None:
                key = (comp.uri or uri).rstrip("/")
                seen[key] = VersionSeen(comp.id, comp.name, comp.kind, key, comp.version)
    for target in targets:
        key = target.rstrip("/")
        if key in seen:
            continue
        try:
            doc = await drv.get(target)
        except KariosError:
            continue
        ident = parse.text(doc.get("Id")) or parse.last_segment(key)
        if doc.get("BiosVersion") is not None:
            seen[key] = VersionSeen(f"{ident}/BIOS", "BIOS", "bios", key, parse.text(doc.get("BiosVersion")))
        elif doc.get("FirmwareVersion") is not None:
            seen[key] = VersionSeen(
                ident, parse.text(doc.get("Name")), "bmc", key, parse.text(doc["FirmwareVersion"])
            )
        elif doc.get("Version") is not None:
            name = parse.text(doc.get("Name"))
            seen[key] = VersionSeen(
                ident, name, parse.firmware_kind(ident, name), key, parse.text(doc["Version"])
            )
    return seen


async def send(drv: RedfishDriver, plan: UpdatePlan, image: Path | None) -> tuple[int, str, Doc]:
    """Start the update: (HTTP status, the task monitor / Task URI or '', the answer's body)."""
    if plan.method == "simple_update":
        body = await drv.request("POST", plan.target, plan.body)
        return drv.last_status, drv.last_location or _task_link(body), body
    assert image is not None, "a multipart push needs the image on disk"
    await drv.service_root()  # logged in (session or basic auth) before the client is used bare
    try:
        with image.open("rb") as fh:
            files: Any = {
                "UpdateParameters": (None, json.dumps(plan.body), "application/json"),
                "UpdateFile": (image.name, fh, "application/octet-stream"),
            }
            r = await drv.client.post(
                plan.target, files=files, timeout=httpx.Timeout(600.0, connect=drv.ep.timeout)
            )
    except httpx.HTTPError as exc:
        raise UpstreamError(
            f"BMC {drv.ep.bmc_ip}: multipart push to {plan.target} failed: {type(exc).__name__}"
        ) from None
    if r.status_code >= 400:
        raise UpstreamError(
            f"BMC {drv.ep.bmc_ip}: multipart push answered HTTP {r.status_code} {r.text[:200]}"
        )
    try:
        doc = r.json() if r.content else {}
    except ValueError:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    return r.status_code, r.headers.get("Location", "") or _task_link(doc), doc


def _task_link(body: Doc) -> str:
    """A BMC that answers the action with the Task itself (no Location header)."""
    if "TaskState" in body or str(body.get("@odata.type", "")).startswith("#Task."):
        return parse.text(body.get("@odata.id"))
    return ""


async def poll(drv: RedfishDriver, uri: str) -> tuple[int, Doc]:
    """One read of the task monitor / Task: (status, body). A monitor that answers 404 after the
    task ended (DSP0266 lets it go) is read as 410, handled by the caller."""
    try:
        body = await drv.get(uri)
    except KariosError as exc:
        if getattr(exc, "status", 0) == 404:
            return 410, {}
        raise
    return drv.last_status, body
