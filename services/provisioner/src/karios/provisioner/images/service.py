"""The OS image catalog's use cases (issue 25 item 2, registration): register, get, list, delete.

A registration is answered at once (state ``registering``) and carried on here:

1. **download** the source into ``<images_dir>/catalog/`` while hashing it with the registered
   algorithm; a mismatch fails the image and keeps nothing;
2. **prepare** what installs stream (:func:`prepare`): a qcow2 is checked to be one (no backing
   or external data file: those would read files of this host into the image) and converted
   **once** to raw, a raw compressed with zstd; a compressed raw or root archive is kept as given
   after decompressing it end to end (a truncated or corrupt file fails here, not in an install);
3. the served file's own sha256, size and, for a whole disk, the disk size; then ``ready``.

A registration whose provisioner died is failed by any replica's sweep once nobody touched it
for :data:`STALE_AFTER` (a running one touches it every :data:`HEARTBEAT_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from karios.common.bus.runtime import Bus
from karios.common.contracts.images import (
    WHOLE_DISK,
    CatalogImageQuery,
    CatalogListQuery,
    DeleteImage,
    ImageExists,
    ImageList,
    ImageNotFound,
    ImageView,
    RegisterImage,
    served_format,
)
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger
from karios.provisioner.images.store import ImageStore

log = get_logger(__name__)

CHUNK = 1 << 20
MAX_SOURCE_BYTES = 128 << 30
HEARTBEAT_S = 30.0
STALE_AFTER = timedelta(minutes=3)
CATALOG_DIR = "catalog"


class ImageFailed(Exception):
    """Why a registration failed (said in the image's ``message``)."""


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _run(argv: list[str], what: str) -> str:
    """Run a tool; its stdout, or :class:`ImageFailed` naming `what` with the tool's last words."""
    if shutil.which(argv[0]) is None:
        raise ImageFailed(f"{what}: {argv[0]} is not installed on the provisioner")
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.returncode}"]
        raise ImageFailed(f"{what}: {tail[0][:300]}")
    return res.stdout


def _pipe_count(decompress: list[str], src: Path, what: str, then: list[str] | None = None) -> int:
    """Decompress `src` end to end (into `then`, e.g. ``tar -t``, or counted); the bytes out."""
    if shutil.which(decompress[0]) is None:
        raise ImageFailed(f"{what}: {decompress[0]} is not installed on the provisioner")
    with subprocess.Popen([*decompress, str(src)], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as dec:
        assert dec.stdout is not None
        if then is not None:
            with subprocess.Popen(
                then, stdin=dec.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            ) as sink:
                dec.stdout.close()
                _, err = sink.communicate()
            total, sink_rc = 0, sink.returncode
        else:
            total, err, sink_rc = 0, b"", 0
            while chunk := dec.stdout.read(CHUNK):
                total += len(chunk)
        dec_err = dec.stderr.read() if dec.stderr else b""
        dec.wait()
    if dec.returncode != 0 or sink_rc != 0:
        words = (dec_err or err).decode(errors="replace").strip().splitlines()[-1:] or ["corrupt"]
        raise ImageFailed(f"{what}: {words[0][:300]}")
    return total


def file_sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def download(url: str, dest: Path, algo: str) -> str:
    """`url` into `dest`, hashed on the way with `algo`; the hex digest."""
    h = hashlib.new(algo)
    got = 0
    try:
        with (
            dest.open("wb") as fh,
            httpx.Client(timeout=httpx.Timeout(60.0), follow_redirects=True) as client,
            client.stream("GET", url) as r,
        ):
            if r.status_code >= 400:
                raise ImageFailed(f"source_url: answered HTTP {r.status_code}")
            for chunk in r.iter_bytes(CHUNK):
                got += len(chunk)
                if got > MAX_SOURCE_BYTES:
                    raise ImageFailed(f"source_url: larger than {MAX_SOURCE_BYTES >> 30} GiB")
                h.update(chunk)
                fh.write(chunk)
    except httpx.HTTPError as exc:
        raise ImageFailed(f"source_url: could not be fetched ({type(exc).__name__})") from None
    return h.hexdigest()


def qcow2_disk_bytes(src: Path) -> int:
    """The qcow2's disk size, after checking it is a self-contained qcow2."""
    info = json.loads(_run(["qemu-img", "info", "--output=json", str(src)], "format"))
    if info.get("format") != "qcow2":
        raise ImageFailed(f"format: the source is {info.get('format', 'unknown')!r}, not qcow2")
    if info.get("backing-filename") or info.get("full-backing-filename"):
        raise ImageFailed("format: the qcow2 has a backing file (refused: it would read files of this host)")
    data = ((info.get("format-specific") or {}).get("data") or {}).get("data-file")
    if data:
        raise ImageFailed("format: the qcow2 has an external data file (refused)")
    return int(info.get("virtual-size") or 0)


def prepare(view: ImageView, src: Path, out: Path) -> int:
    """Make `out` (what installs stream) from the downloaded `src`; the disk size (0: archive)."""
    fmt = view.format
    if fmt == "qcow2":
        disk = qcow2_disk_bytes(src)
        raw = src.with_suffix(".raw")
        try:
            _run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(src), str(raw)], "convert")
            _run(["zstd", "-q", "-f", "-T0", "-3", str(raw), "-o", str(out)], "compress")
        finally:
            raw.unlink(missing_ok=True)
        return disk
    if fmt == "raw":
        _run(["zstd", "-q", "-f", "-T0", "-3", str(src), "-o", str(out)], "compress")
        return src.stat().st_size
    tools = {
        "raw.zst": ["zstd", "-dc"],
        "raw.xz": ["xz", "-dc"],
        "raw.gz": ["gzip", "-dc"],
        "tar.zst": ["zstd", "-dc"],
    }
    then = ["tar", "-t", "-f", "-"] if fmt == "tar.zst" else None
    disk = _pipe_count(tools[fmt], src, f"format: not a valid {fmt}", then)
    src.replace(out)
    return disk if fmt in WHOLE_DISK else 0


class ImageCatalog:
    def __init__(self, store: ImageStore, images_dir: Path | None) -> None:
        self.store = store
        self.images_dir = images_dir
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def catalog_dir(self) -> Path:
        if self.images_dir is None:
            raise ImageFailed("the provisioner has no images directory (KARIOS_PROVISIONER_IMAGES_DIR)")
        return self.images_dir / CATALOG_DIR

    def _file(self, view: ImageView) -> Path:
        return self.catalog_dir / f"{view.name}.{view.served_format}"

    async def register(self, q: RegisterImage) -> ImageView:
        now = _now()
        view = ImageView(
            name=q.name,
            state="registering",
            source_url=q.source_url,
            format=q.format,
            checksum_algo=q.checksum_algo,
            checksum=q.checksum,
            os_family=q.os_family,
            boot_modes=list(dict.fromkeys(q.boot_modes)),
            whole_disk=q.format in WHOLE_DISK,
            served_format=served_format(q.format),
            message="queued",
            requested_by=q.requested_by,
            created_at=now,
            updated_at=now,
        )
        if not await self.store.insert(view):
            raise ImageExists(f"name: an image named {q.name!r} exists (delete it first)", field="name")
        log.info("image registering", image=q.name, format=q.format, by=q.requested_by)
        self._tasks[q.name] = asyncio.create_task(self._register(view))
        return view

    async def get(self, q: CatalogImageQuery) -> ImageView:
        view = await self.store.get(q.name)
        if view is None:
            raise ImageNotFound(f"image {q.name!r} is not in the catalog")
        return view

    async def list(self, _q: CatalogListQuery) -> ImageList:
        return ImageList(items=await self.store.all())

    async def delete(self, q: DeleteImage) -> ImageView:
        task = self._tasks.pop(q.name, None)
        await cancel_and_wait(task)
        view = await self.store.delete(q.name)
        if view is None:
            raise ImageNotFound(f"image {q.name!r} is not in the catalog")
        with contextlib.suppress(OSError, ImageFailed):
            self._file(view).unlink(missing_ok=True)
        log.info("image deleted", image=q.name, by=q.requested_by)
        return view

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks.values())
        self._tasks.clear()

    async def sweep(self) -> list[str]:
        """Fail registrations whose provisioner died (nobody touched them for STALE_AFTER)."""
        return await self.store.abandon_stale(STALE_AFTER)

    async def _move(self, view: ImageView, message: str, **changes: object) -> bool:
        for k, v in changes.items():
            setattr(view, k, v)
        view.message, view.updated_at = message, _now()
        return await self.store.save(view)

    async def _heartbeat(self, view: ImageView) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            await self._move(view, view.message)

    async def _register(self, view: ImageView) -> None:
        try:
            self.catalog_dir.mkdir(parents=True, exist_ok=True)
        except (ImageFailed, OSError) as exc:
            await self._move(view, str(exc), state="failed")
            self._tasks.pop(view.name, None)
            return
        part = self.catalog_dir / f".{view.name}.download"
        out = self.catalog_dir / f".{view.name}.out"
        beat = asyncio.create_task(self._heartbeat(view))
        try:
            await self._move(view, f"downloading {view.source_url}")
            digest = await asyncio.to_thread(download, view.source_url, part, view.checksum_algo)
            if digest != view.checksum:
                raise ImageFailed(
                    f"checksum: the source hashes to {digest} ({view.checksum_algo}), not {view.checksum};"
                    " nothing kept"
                )
            await self._move(view, f"preparing ({view.format} → {view.served_format})")
            disk = await asyncio.to_thread(prepare, view, part, out)
            sha = await asyncio.to_thread(file_sha256, out)
            final = self._file(view)
            out.replace(final)
            await self._move(
                view,
                "ready",
                state="ready",
                path=f"{CATALOG_DIR}/{final.name}",
                size_bytes=final.stat().st_size,
                served_sha256=sha,
                disk_bytes=disk,
            )
            log.info("image ready", image=view.name, bytes=view.size_bytes, disk_bytes=disk)
        except ImageFailed as exc:
            await self._move(view, str(exc), state="failed")
            log.warning("image failed", image=view.name, reason=str(exc))
        except Exception as exc:  # a bug or the disk: the image says so, the service goes on
            await self._move(view, f"registration failed ({type(exc).__name__})", state="failed")
            log.exception("image registration failed", image=view.name)
        finally:
            await cancel_and_wait(beat)
            part.unlink(missing_ok=True)
            out.unlink(missing_ok=True)
            self._tasks.pop(view.name, None)


def wire_images(bus: Bus, svc: ImageCatalog) -> None:
    bus.query_responder(bus.subjects.request("provision", "register_image"), RegisterImage, svc.register)
    bus.query_responder(bus.subjects.query("provision", "catalog_image"), CatalogImageQuery, svc.get)
    bus.query_responder(bus.subjects.query("provision", "catalog_images"), CatalogListQuery, svc.list)
    bus.query_responder(bus.subjects.request("provision", "delete_image"), DeleteImage, svc.delete)
