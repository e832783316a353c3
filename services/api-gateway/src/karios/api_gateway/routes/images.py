"""The OS image catalog (issue 25 item 2: registration).

- ``POST /controlnode/images`` (fabric_admin): 202 with the image (state ``registering``); the
  provisioner downloads it, checks its sha256/sha512, converts a qcow2 or raw once to raw.zst,
  checks a compressed source end to end, then ``ready`` (or ``failed`` with the reason in
  ``message``). 409 ``IMAGE_EXISTS`` when the name is taken.
- ``GET /controlnode/images`` / ``GET /controlnode/images/{name}`` (viewer).
- ``DELETE /controlnode/images/{name}`` (fabric_admin): the record and the served file.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, Field

from karios.api_gateway.auth import Principal, Role, require
from karios.common.contracts.images import (
    IMAGE_NAME_PATTERN,
    BootMode,
    CatalogImageQuery,
    CatalogListQuery,
    ChecksumAlgo,
    DeleteImage,
    ImageFormat,
    ImageList,
    ImageView,
    OsFamily,
    RegisterImage,
)
from karios.common.errors import ValidationFailed
from karios.common.telemetry import get_logger

log = get_logger(__name__)

router = APIRouter(prefix="/controlnode/images", tags=["images"])
_HEX = {"sha256": re.compile(r"^[0-9a-fA-F]{64}$"), "sha512": re.compile(r"^[0-9a-fA-F]{128}$")}
_NAME = re.compile(IMAGE_NAME_PATTERN)
_ERRORS = {
    401: {"description": "Missing or invalid token"},
    403: {"description": "Role too low"},
    422: {"description": "A field is invalid (`field` names it)"},
    503: {"description": "Provisioner unavailable, or no answer in time (`details.outcome`)"},
}
ImageName = Annotated[str, Path(max_length=64, description="The image's name")]


class RegisterImageBody(BaseModel):
    name: str = Field(
        max_length=64, description="Lower-case letters, digits, `.`, `_`, `-`; what a provision names"
    )
    source_url: str = Field(
        max_length=2048, description="http(s) URL the provisioner downloads the image from"
    )
    format: ImageFormat = Field(
        description="raw, raw.zst, raw.xz, raw.gz, qcow2 (whole-disk images; qcow2 and raw are converted "
        "once to raw.zst) or tar.zst (a root archive)"
    )
    sha256: str = Field("", max_length=64, description="The source's SHA-256 (hex); or sha512")
    sha512: str = Field("", max_length=128, description="The source's SHA-512 (hex); or sha256")
    os_family: OsFamily = "other"
    boot_modes: list[BootMode] = Field(default_factory=lambda: ["bios", "uefi"], min_length=1, max_length=2)


def _validated(body: RegisterImageBody, by: str) -> RegisterImage:
    if not _NAME.match(body.name):
        raise ValidationFailed(
            "name: 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit",
            field="name",
        )
    url = urlsplit(body.source_url)
    if url.scheme not in ("http", "https") or not url.netloc or any(c.isspace() for c in body.source_url):
        raise ValidationFailed("source_url: an http:// or https:// URL", field="source_url")
    if "@" in url.netloc:  # stored, shown and logged: a password in it would leak
        raise ValidationFailed("source_url: no credentials in the URL", field="source_url")
    given = {a: v for a, v in (("sha256", body.sha256), ("sha512", body.sha512)) if v}
    if len(given) != 1:
        raise ValidationFailed("sha256: give exactly one of sha256 and sha512", field="sha256")
    ((algo, digest),) = given.items()
    if not _HEX[algo].match(digest):
        raise ValidationFailed(f"{algo}: {64 if algo == 'sha256' else 128} hexadecimal digits", field=algo)
    checksum_algo: ChecksumAlgo = "sha256" if algo == "sha256" else "sha512"
    return RegisterImage(
        name=body.name,
        source_url=body.source_url,
        format=body.format,
        checksum_algo=checksum_algo,
        checksum=digest.lower(),
        os_family=body.os_family,
        boot_modes=body.boot_modes,
        requested_by=by,
    )


@router.post(
    "",
    status_code=202,
    response_model=ImageView,
    responses={**_ERRORS, 409: {"description": "IMAGE_EXISTS: the name is taken"}},
    summary="Register an OS image: downloaded, checksum checked, qcow2/raw converted once to raw.zst",
)
async def register_image(
    request: Request,
    body: RegisterImageBody,
    principal: Principal = Depends(require(Role.fabric_admin)),
) -> ImageView:
    rt = request.app.state.runtime
    q = _validated(body, principal.name)
    view: ImageView = await rt.bus.request(
        rt.bus.subjects.request("provision", "register_image"), q, reply=ImageView
    )
    log.info("image registering", image=q.name, format=q.format, by=principal.name)
    return view


@router.get("", response_model=ImageList, responses=_ERRORS, summary="The OS image catalog")
async def list_images(request: Request, _p: Principal = Depends(require(Role.viewer))) -> ImageList:
    rt = request.app.state.runtime
    return await rt.bus.request(  # type: ignore[no-any-return]
        rt.bus.subjects.query("provision", "catalog_images"), CatalogListQuery(), reply=ImageList
    )


@router.get(
    "/{name}",
    response_model=ImageView,
    responses={**_ERRORS, 404: {"description": "IMAGE_NOT_FOUND"}},
    summary="One image: its state (registering, ready, failed), what is served and its checksums",
)
async def get_image(
    request: Request, name: ImageName, _p: Principal = Depends(require(Role.viewer))
) -> ImageView:
    rt = request.app.state.runtime
    return await rt.bus.request(  # type: ignore[no-any-return]
        rt.bus.subjects.query("provision", "catalog_image"), CatalogImageQuery(name=name), reply=ImageView
    )


@router.delete(
    "/{name}",
    response_model=ImageView,
    responses={**_ERRORS, 404: {"description": "IMAGE_NOT_FOUND"}},
    summary="Remove an image from the catalog (a registration in progress is stopped)",
)
async def delete_image(
    request: Request, name: ImageName, principal: Principal = Depends(require(Role.fabric_admin))
) -> ImageView:
    rt = request.app.state.runtime
    view: ImageView = await rt.bus.request(
        rt.bus.subjects.request("provision", "delete_image"),
        DeleteImage(name=name, requested_by=principal.name),
        reply=ImageView,
    )
    log.info("image deleted", image=name, by=principal.name)
    return view
