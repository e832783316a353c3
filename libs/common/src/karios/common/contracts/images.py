"""Contracts of the OS image catalog (issue 25 item 2, first part: registration).

``POST /controlnode/images`` (fabric_admin) sends ``req.provision.register_image``
(:class:`RegisterImage`): the provisioner refuses a name in use (409 ``IMAGE_EXISTS``), else
stores the record (state ``registering``) and answers it at once; then, in the provisioner, the
source is downloaded while its checksum (sha256 or sha512) is computed, a mismatch fails the
image (nothing kept), and a ``qcow2`` or plain ``raw`` disk image is converted **once** to a
zstd-compressed raw (``raw.zst``) — what an install streams. A compressed raw (``raw.zst``,
``raw.xz``, ``raw.gz``) or a root archive (``tar.zst``) is kept as given, after its compression
is checked end to end. The image is then ``ready``: served at ``/images/<path>`` with the served
file's own sha256 and size, and, for a whole-disk image, its disk size (what a target disk must
hold).

``GET /controlnode/images`` / ``GET /controlnode/images/{name}`` ask ``q.provision.catalog_images`` /
``q.provision.catalog_image``; ``DELETE /controlnode/images/{name}`` sends ``req.provision.delete_image``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from karios.common.contracts.base import Query
from karios.common.errors import Conflict, NotFound, register_error

ImageFormat = Literal["raw", "raw.zst", "raw.xz", "raw.gz", "qcow2", "tar.zst"]
ImageState = Literal["registering", "ready", "failed"]
OsFamily = Literal["debian", "ubuntu", "rhel", "rocky", "alma", "centos", "fedora", "suse", "other"]
BootMode = Literal["bios", "uefi"]
ChecksumAlgo = Literal["sha256", "sha512"]

#: ``name``: what a provision request will name it by (a path segment, no dots first).
IMAGE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
#: A whole-disk install adds a partition this big (MiB) after the image's last one, for the
#: cloud-init seed (vfat, label CIDATA); with alignment, a target disk needs the image's size and
#: :data:`SEED_NEEDS_BYTES`.
SEED_MIB = 16
SEED_NEEDS_BYTES = (SEED_MIB + 2) << 20
#: Formats that are a whole disk (partition table, boot loader): written to one selected disk.
WHOLE_DISK = frozenset({"raw", "raw.zst", "raw.xz", "raw.gz", "qcow2"})


def served_format(fmt: ImageFormat) -> ImageFormat:
    """What the catalog serves for a source in `fmt`: qcow2 and plain raw become ``raw.zst``."""
    return "raw.zst" if fmt in ("qcow2", "raw") else fmt


class RegisterImage(Query):
    """Register an OS image: where it comes from, its checksum, what it is."""

    TYPE = "karios.provision.register_image.v1"
    name: str = Field(pattern=IMAGE_NAME_PATTERN, description="The image's name (`image` of a provision)")
    source_url: str = Field(max_length=2048, description="http(s) URL the provisioner downloads it from")
    format: ImageFormat
    checksum_algo: ChecksumAlgo
    checksum: str = Field(pattern=r"^[0-9a-f]{64}([0-9a-f]{64})?$", description="Lower-case hex")
    os_family: OsFamily = "other"
    boot_modes: list[BootMode] = Field(default_factory=lambda: ["bios", "uefi"], min_length=1, max_length=2)
    requested_by: str = Field("", max_length=128, description="Who asked (audit), never a secret")


class CatalogImageQuery(Query):
    """One image of the catalog."""

    TYPE = "karios.provision.catalog_image_query.v1"
    name: str = Field(max_length=64)


class CatalogListQuery(Query):
    """Every image of the catalog, by name."""

    TYPE = "karios.provision.catalog_list_query.v1"


class DeleteImage(Query):
    """Remove an image from the catalog (its served file too)."""

    TYPE = "karios.provision.delete_image.v1"
    name: str = Field(max_length=64)
    requested_by: str = Field("", max_length=128)


class ImageView(BaseModel):
    """An image of the catalog: what was registered and what is served."""

    name: str
    state: ImageState
    source_url: str
    format: ImageFormat = Field(description="The source's format, as registered")
    checksum_algo: ChecksumAlgo
    checksum: str = Field(description="The source's checksum, as registered (checked on download)")
    os_family: OsFamily = "other"
    boot_modes: list[BootMode] = Field(default_factory=list)
    whole_disk: bool = Field(description="A whole-disk image (written to one disk), not a root archive")
    served_format: ImageFormat = Field(description="What installs stream: raw.zst for qcow2 and raw sources")
    path: str = Field("", description="Where it is served: /images/<path> ('' until ready)")
    size_bytes: int = Field(0, description="The served file's size")
    served_sha256: str = Field("", description="The served file's own SHA-256 (installs verify it)")
    disk_bytes: int = Field(0, description="A whole-disk image's disk size: a target disk must hold it")
    message: str = Field("", description="Progress, or why it failed")
    requested_by: str = ""
    created_at: str
    updated_at: str


class ImageList(BaseModel):
    items: list[ImageView] = Field(default_factory=list)


@register_error
class ImageExists(Conflict):
    code = "IMAGE_EXISTS"
    http_status = 409


@register_error
class ImageNotFound(NotFound):
    code = "IMAGE_NOT_FOUND"
    http_status = 404
