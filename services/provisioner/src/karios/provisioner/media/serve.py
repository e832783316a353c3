"""Serving a job's medium (the base ISO streamed with the job's slot patched in) and the plain
files under ``/images``: one response for both (I/O edge).

``GET``/``HEAD``: one byte range, parsed by :func:`karios.common.ranges.parse_range` (206 +
``Content-Range``; a multi-range or malformed ``Range`` gets the whole file with 200, a range
past the end 416 with ``Content-Range: bytes */size``), the full length in ``Content-Length``,
an ``ETag`` and ``Last-Modified`` (``If-Range``, ``If-None-Match``). Files are read
asynchronously in chunks; nothing per job is read but its slot record.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from karios.common.ranges import RangeNotSatisfiable, content_range, parse_range
from karios.provisioner.media.slot import BaseLayout, etag, http_date, segments, slot_bytes

CHUNK = 256 * 1024
ISO_TYPE = "application/x-iso9660-image"


@dataclass(frozen=True)
class ServedMedium:
    """One job's medium as served: a base ISO, its slot layout and the job's slot payload."""

    base: Path
    layout: BaseLayout
    payload: bytes
    mtime: float  # the later of the base's and the job record's

    @property
    def size(self) -> int:
        return self.layout.iso_size

    @property
    def etag(self) -> str:
        return etag(self.layout.key, self.payload)

    def _pieces(self, start: int, end: int) -> Iterator[tuple[str, int, int]]:
        for kind, off, n in segments(start, end, self.layout, self.payload):
            while n > 0:  # bounded chunks, whatever the piece
                k = min(n, CHUNK)
                yield kind, off, k
                off, n = off + k, n - k

    async def stream(self, start: int, end: int) -> AsyncIterator[bytes]:
        async with await anyio.open_file(self.base, "rb") as f:
            for kind, off, n in self._pieces(start, end):
                if kind == "slot":
                    yield slot_bytes(self.payload, off, n)
                    continue
                await f.seek(off)
                data = await f.read(n)
                if len(data) != n:
                    raise OSError(f"base medium {self.base.name} is shorter than its layout")
                yield data

    def read(self, start: int = 0, end: int | None = None) -> bytes:
        """The patched bytes ``start..end`` (inclusive), blocking (tests, small ranges)."""
        end = self.size - 1 if end is None else end
        out = bytearray()
        with open(self.base, "rb") as f:
            for kind, off, n in self._pieces(start, end):
                if kind == "slot":
                    out += slot_bytes(self.payload, off, n)
                else:
                    f.seek(off)
                    out += f.read(n)
        return bytes(out)

    def write_to(self, path: Path) -> Path:
        """The whole patched medium written to ``path`` (tests and tools; the service never does)."""
        with open(self.base, "rb") as src, open(path, "wb") as out:
            for kind, off, n in self._pieces(0, self.size - 1):
                if kind == "slot":
                    out.write(slot_bytes(self.payload, off, n))
                else:
                    src.seek(off)
                    out.write(src.read(n))
        return path


@dataclass(frozen=True)
class ServedFile:
    """A plain file served as is (``/images``, a legacy per-job ISO)."""

    path: Path
    size: int
    mtime: float
    etag: str

    @classmethod
    def of(cls, path: Path) -> ServedFile:
        st = path.stat()
        key = f"{path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()
        return cls(path, st.st_size, st.st_mtime, f'"{hashlib.sha256(key).hexdigest()[:32]}"')

    async def stream(self, start: int, end: int) -> AsyncIterator[bytes]:
        async with await anyio.open_file(self.path, "rb") as f:
            await f.seek(start)
            left = end - start + 1
            while left > 0:
                data = await f.read(min(left, CHUNK))
                if not data:
                    raise OSError(f"{self.path.name} is shorter than when it was opened")
                left -= len(data)
                yield data


class Ranged(Protocol):
    """What :func:`ranged_response` serves: a size, a validator and the bytes of a span."""

    @property
    def size(self) -> int: ...
    @property
    def etag(self) -> str: ...
    @property
    def mtime(self) -> float: ...
    def stream(self, start: int, end: int) -> AsyncIterator[bytes]: ...


def medium_response(served: Ranged, request: Request, filename: str) -> Response:
    # no-store: the slot carries the job's token
    return ranged_response(served, request, filename, ISO_TYPE, cache_control="no-store")


def ranged_response(
    served: Ranged, request: Request, filename: str, media_type: str, *, cache_control: str | None = None
) -> Response:
    tag, total = served.etag, served.size
    headers = {
        "accept-ranges": "bytes",
        "etag": tag,
        "last-modified": http_date(served.mtime),
        "content-disposition": f'attachment; filename="{filename}"',
    }
    if cache_control:
        headers["cache-control"] = cache_control
    if tag in _tags(request.headers.get("if-none-match")):
        return Response(status_code=304, headers=headers)
    rng = request.headers.get("range")
    if_range = request.headers.get("if-range")
    if if_range is not None and if_range.strip() not in (tag, headers["last-modified"]):
        rng = None  # the client's copy is another version: send the whole medium
    try:
        span = parse_range(rng, total)
    except RangeNotSatisfiable:
        return Response(status_code=416, headers={**headers, "content-range": content_range(None, total)})
    status, (start, end) = (200, (0, total - 1)) if span is None else (206, span)
    if status == 206:
        headers["content-range"] = content_range(span, total)
    headers["content-length"] = str(end - start + 1)
    if request.method == "HEAD" or end < start:  # HEAD, or an empty file
        return Response(status_code=status, headers=headers, media_type=media_type)
    return StreamingResponse(
        served.stream(start, end), status_code=status, headers=headers, media_type=media_type
    )


def _tags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {t.strip().removeprefix("W/") for t in header.split(",")}
