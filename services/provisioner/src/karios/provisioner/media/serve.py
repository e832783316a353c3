"""Serving a job's medium: the base ISO streamed with the job's slot patched in (I/O edge).

``GET``/``HEAD /media/{job}.iso``: one byte range (206 + ``Content-Range``; a multi-range or
malformed ``Range`` gets the whole medium, one past the end 416), the full length in
``Content-Length``, a per-job ``ETag`` and ``Last-Modified`` (``If-Range``, ``If-None-Match``).
The base file is read asynchronously in chunks; nothing per job is read but its slot record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from karios.provisioner.media.slot import (
    BaseLayout,
    RangeNotSatisfiable,
    etag,
    http_date,
    parse_range,
    segments,
    slot_bytes,
)

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


def medium_response(served: ServedMedium, request: Request, filename: str) -> Response:
    tag, total = served.etag, served.size
    headers = {
        "accept-ranges": "bytes",
        "etag": tag,
        "last-modified": http_date(served.mtime),
        "content-disposition": f'attachment; filename="{filename}"',
        "cache-control": "no-store",  # the slot carries the job's token
    }
    if tag in _tags(request.headers.get("if-none-match")):
        return Response(status_code=304, headers=headers)
    rng = request.headers.get("range")
    if_range = request.headers.get("if-range")
    if if_range is not None and if_range.strip() not in (tag, headers["last-modified"]):
        rng = None  # the client's copy is another version: send the whole medium
    try:
        span = parse_range(rng, total)
    except RangeNotSatisfiable:
        return Response(status_code=416, headers={**headers, "content-range": f"bytes */{total}"})
    status, (start, end) = (200, (0, total - 1)) if span is None else (206, span)
    if status == 206:
        headers["content-range"] = f"bytes {start}-{end}/{total}"
    headers["content-length"] = str(end - start + 1)
    if request.method == "HEAD":
        return Response(status_code=status, headers=headers, media_type=ISO_TYPE)
    return StreamingResponse(
        served.stream(start, end), status_code=status, headers=headers, media_type=ISO_TYPE
    )


def _tags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {t.strip().removeprefix("W/") for t in header.split(",")}
