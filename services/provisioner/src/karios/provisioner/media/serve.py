"""Serving a job's medium (the base ISO streamed with the job's slot patched in) and the plain
files under ``/images``: one response for both (I/O edge).

``GET``/``HEAD``: one byte range, parsed by :func:`karios.common.ranges.parse_range` (206 +
``Content-Range``; a multi-range or malformed ``Range`` gets the whole file with 200, a range
past the end 416 with ``Content-Range: bytes */size``), the full length in ``Content-Length``,
an ``ETag`` and ``Last-Modified`` (``If-Range``, ``If-None-Match``). Nothing per job is read but
its slot record.

The body is a list of pieces (:meth:`ServedMedium.pieces`): spans of one file and, for a medium,
the slot's bytes. :class:`RangedResponse` sends it one of two ways:

- zero copy: when the server offers the ASGI extension ``http.response.zerocopysend``, each file
  span is one such message (the kernel copies page cache → socket with ``sendfile(2)``) and the
  slot's bytes one ``http.response.body``;
- streamed: otherwise (HTTPS — ``KARIOS_PROVISIONER_TLS``: sendfile cannot encrypt —, granian,
  uvicorn's h11), the file is read off the event loop in :data:`CHUNK` pieces, each sent as it is
  read.

uvicorn offers no such extension; :class:`ZeroCopySend` (the provisioner's outermost middleware)
adds it for uvicorn's httptools connections over plain TCP, the way ``karios run`` serves: it
writes those messages to the connection's socket itself (see its docstring for what it relies
on). ``benchmarks/images_serving.py`` measures both against nginx.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from karios.common.ranges import RangeNotSatisfiable, content_range, parse_range
from karios.provisioner.media.slot import BaseLayout, etag, http_date, segments, slot_bytes

#: Bytes read per step when streaming (no zero copy): a read off the loop per MiB.
CHUNK = 1024 * 1024
ISO_TYPE = "application/x-iso9660-image"
#: The ASGI extension (asgiref's "Zero Copy Send") a response uses to send spans of a file.
ZEROCOPY = "http.response.zerocopysend"
#: Bytes one ``sendfile`` call may send (a socket's buffer takes a few MiB at most anyway): what a
#: worker thread may spend reading a file not in the page cache before it hands back.
SENDFILE_MAX = 8 * 1024 * 1024

#: A piece of a body: ``(offset, length)`` of the served file, or bytes sent as they are.
Piece = tuple[int, int] | bytes


def _chunked(pieces: Iterable[Piece], chunk: int = CHUNK) -> Iterator[Piece]:
    """The same pieces, file spans cut into at most ``chunk`` bytes each."""
    for piece in pieces:
        if isinstance(piece, bytes):
            yield piece
            continue
        off, n = piece
        while n > 0:
            k = min(n, chunk)
            yield off, k
            off, n = off + k, n - k


def _pread(f: BinaryIO, off: int, n: int) -> bytes:
    data = os.pread(f.fileno(), n, off)
    while len(data) < n:  # a regular file reads short only at its end
        more = os.pread(f.fileno(), n - len(data), off + len(data))
        if not more:
            break
        data += more
    return data


async def _stream(path: Path, pieces: Iterable[Piece], short: str) -> AsyncIterator[bytes]:
    """The pieces' bytes, the file read in a worker thread :data:`CHUNK` at a time (a cancelled
    read finishes before the file is closed: anyio waits for its thread)."""
    f = await anyio.to_thread.run_sync(open, path, "rb", 0)
    try:
        for piece in _chunked(pieces):
            if isinstance(piece, bytes):
                yield piece
                continue
            data = await anyio.to_thread.run_sync(_pread, f, *piece)
            if len(data) != piece[1]:
                raise OSError(short)
            yield data
    finally:
        f.close()


@dataclass(frozen=True)
class ServedMedium:
    """One job's medium as served: a base ISO, its slot layout and the job's slot payload."""

    base: Path
    layout: BaseLayout
    payload: bytes
    mtime: float  # the later of the base's and the job record's

    @property
    def path(self) -> Path:
        return self.base

    @property
    def size(self) -> int:
        return self.layout.iso_size

    @property
    def etag(self) -> str:
        return etag(self.layout.key, self.payload)

    @property
    def short(self) -> str:
        return f"base medium {self.base.name} is shorter than its layout"

    def pieces(self, start: int, end: int) -> Iterator[Piece]:
        """Bytes ``start..end`` (inclusive): spans of the base, the slot's bytes in between."""
        for kind, off, n in segments(start, end, self.layout, self.payload):
            yield (off, n) if kind == "base" else slot_bytes(self.payload, off, n)

    def stream(self, start: int, end: int) -> AsyncIterator[bytes]:
        return _stream(self.base, self.pieces(start, end), self.short)

    def read(self, start: int = 0, end: int | None = None) -> bytes:
        """The patched bytes ``start..end`` (inclusive), blocking (tests, small ranges)."""
        end = self.size - 1 if end is None else end
        with open(self.base, "rb") as f:
            return b"".join(
                p if isinstance(p, bytes) else _pread(f, *p) for p in _chunked(self.pieces(start, end))
            )

    def write_to(self, path: Path) -> Path:
        """The whole patched medium written to ``path`` (tests and tools; the service never does)."""
        with open(self.base, "rb") as src, open(path, "wb") as out:
            for p in _chunked(self.pieces(0, self.size - 1)):
                out.write(p if isinstance(p, bytes) else _pread(src, *p))
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

    @property
    def short(self) -> str:
        return f"{self.path.name} is shorter than when it was opened"

    def pieces(self, start: int, end: int) -> Iterator[Piece]:
        yield start, end - start + 1

    def stream(self, start: int, end: int) -> AsyncIterator[bytes]:
        return _stream(self.path, self.pieces(start, end), self.short)


class Ranged(Protocol):
    """What :func:`ranged_response` serves: a size, validators and the pieces of a span of one file."""

    @property
    def path(self) -> Path: ...
    @property
    def size(self) -> int: ...
    @property
    def etag(self) -> str: ...
    @property
    def mtime(self) -> float: ...
    @property
    def short(self) -> str: ...
    def pieces(self, start: int, end: int) -> Iterator[Piece]: ...
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
    return RangedResponse(served, start, end, status, headers, media_type)


def _tags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {t.strip().removeprefix("W/") for t in header.split(",")}


class RangedResponse(Response):
    """Bytes ``start..end`` of ``served``: zero copy when the server offers :data:`ZEROCOPY`,
    streamed otherwise (the module's docstring). A client that leaves ends it (its
    ``http.disconnect``, or a send failing with :class:`ConnectionError`)."""

    def __init__(
        self, served: Ranged, start: int, end: int, status_code: int, headers: dict[str, str], media_type: str
    ) -> None:
        super().__init__(None, status_code, headers, media_type)  # Content-Length is in headers
        self.served, self.start, self.end = served, start, end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        zero_copy = ZEROCOPY in (scope.get("extensions") or {})
        to_client = _to_client(send)
        body = asyncio.ensure_future(self._zero_copy(to_client) if zero_copy else self._streamed(to_client))
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait((body, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            body.cancel()  # nothing if it is done
            _, error = await asyncio.gather(gone, body, return_exceptions=True)
        if isinstance(error, Exception) and not isinstance(error, ConnectionError):
            raise error  # e.g. a file shorter than it was (ConnectionError: the client left)

    async def _zero_copy(self, send: Send) -> None:
        pieces = list(self.served.pieces(self.start, self.end))
        f = await anyio.to_thread.run_sync(open, self.served.path, "rb", 0)
        with f:
            needed = max((p[0] + p[1] for p in pieces if not isinstance(p, bytes)), default=0)
            if os.fstat(f.fileno()).st_size < needed:
                raise OSError(self.served.short)
            for piece in pieces:
                if isinstance(piece, bytes):
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                else:
                    off, n = piece
                    await send({"type": ZEROCOPY, "file": f, "offset": off, "count": n, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _streamed(self, send: Send) -> None:
        chunks = self.served.stream(self.start, self.end)
        try:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _to_client(send: Send) -> Send:
    """``send``, its :class:`OSError` (ASGI 2.4: the client is gone) a :class:`ConnectionError`,
    so that it is told apart from an error reading the file."""

    async def to_client(message: Message) -> None:
        try:
            await send(message)
        except ConnectionError:
            raise
        except OSError as exc:
            raise ConnectionResetError(str(exc)) from exc

    return to_client


async def _disconnect(receive: Receive) -> None:
    """Returns once the client is gone (or, on uvicorn, once the response is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ZeroCopySend:
    """ASGI middleware: ``http.response.zerocopysend`` for uvicorn, which has no such extension.

    For a ``GET`` under one of ``prefixes`` on a connection of uvicorn's httptools protocol over
    plain TCP, the scope gets the extension, and this layer writes what is sent with it: after
    the headers (written by uvicorn), each ``zerocopysend`` is ``os.sendfile`` on the socket and
    each later ``http.response.body`` a plain write, both on a duplicate of the socket's file
    descriptor (non-blocking, as uvicorn's), waiting for it to be writable on the event loop; the
    response's last message goes through uvicorn, which then keeps the connection alive (or
    closes it) as for any response.

    Each ``sendfile`` call (at most :data:`SENDFILE_MAX` bytes, in practice what the socket's
    buffer takes) runs in a worker thread: a file not in the page cache is read there, never on
    the event loop, and the kernel's work for many connections (on loopback, the receiving side's
    too) spreads over every core instead of the loop's one — measured with 40 clients, in the
    loop it reached about half of nginx, in threads nginx's figure.

    What it relies on in uvicorn: ``receive`` is bound to the request's
    ``RequestResponseCycle`` (uvicorn/protocols/http/httptools_impl.py), whose ``transport``
    is the connection, whose ``expected_content_length`` counts the body still owed (decreased
    here by what this layer writes) and ``disconnected`` says the client is gone. Anything else
    (h11, HTTPS, granian, a server that wraps ``receive``) gets no extension: the response
    streams. ``tests/integration/provisioner/test_images_zero_copy.py`` pins that the installed
    uvicorn takes this path.
    """

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...] = ("/images/", "/media/")) -> None:
        self.app, self.prefixes = app, prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != "GET"
            or not scope["path"].startswith(self.prefixes)
        ):
            await self.app(scope, receive, send)
            return
        sink = _UvicornSink.of(receive)
        if sink is None:
            await self.app(scope, receive, send)
            return
        scope["extensions"] = {**(scope.get("extensions") or {}), ZEROCOPY: {}}
        try:
            await self.app(scope, receive, sink.wrap(send))
        finally:
            sink.close()


class _UvicornSink:
    """The socket of one uvicorn httptools request (see :class:`ZeroCopySend`)."""

    def __init__(self, cycle: Any, transport: asyncio.Transport, fileno: int) -> None:
        self.cycle, self.transport, self.fileno = cycle, transport, fileno
        self.fd = -1  # the duplicate, made on the first write
        self.raw = False  # the body is being written here (so all of it is)

    @classmethod
    def of(cls, receive: Receive) -> _UvicornSink | None:
        cycle = getattr(receive, "__self__", None)
        if type(cycle).__module__ != "uvicorn.protocols.http.httptools_impl" or not all(
            hasattr(cycle, a)
            for a in ("transport", "expected_content_length", "disconnected", "chunked_encoding")
        ):
            return None
        transport = cycle.transport
        if transport.get_extra_info("sslcontext") is not None:
            return None
        sock = transport.get_extra_info("socket")
        fileno = sock.fileno() if sock is not None else -1
        return cls(cycle, transport, fileno) if fileno >= 0 else None

    def wrap(self, send: Send) -> Send:
        async def zero_copy_send(message: Message) -> None:
            kind = message["type"]
            if kind == ZEROCOPY:
                self.raw = True
                await self.sendfile(message["file"], message.get("offset"), message.get("count"))
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif kind == "http.response.body" and self.raw:
                if message.get("body"):
                    await self.write(memoryview(message["body"]))
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await send(message)

        return zero_copy_send

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    async def _begin(self, n: int) -> None:
        """Ready to write ``n`` bytes of the body: the client still there, the headers flushed."""
        cycle = self.cycle
        if cycle.disconnected or self.transport.is_closing():
            raise ConnectionResetError("the client is gone")
        if cycle.chunked_encoding is not False:
            raise RuntimeError("zerocopysend needs a Content-Length")
        if n > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if self.fd < 0:
            self.fd = os.dup(self.fileno)
        while self.transport.get_write_buffer_size():  # what uvicorn wrote (the headers) goes first
            await self._writable()
            await asyncio.sleep(0)

    async def _writable(self) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        loop.add_writer(self.fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_writer(self.fd)
        if self.cycle.disconnected:
            raise ConnectionResetError("the client is gone")

    async def _lost(self) -> None:
        """The socket failed: close the connection, and let uvicorn see it before the app ends."""
        self.transport.close()
        for _ in range(100):
            if self.cycle.disconnected:
                return
            await asyncio.sleep(0.001)

    async def sendfile(self, file: BinaryIO, offset: int | None, count: int | None) -> None:
        in_fd = file.fileno()
        offset = os.lseek(in_fd, 0, os.SEEK_CUR) if offset is None else offset
        count = os.fstat(in_fd).st_size - offset if count is None else count
        await self._begin(count)
        while count > 0:
            try:
                n = await anyio.to_thread.run_sync(
                    os.sendfile, self.fd, in_fd, offset, min(count, SENDFILE_MAX)
                )
            except BlockingIOError:
                await self._writable()
                continue
            except ConnectionError:
                await self._lost()
                raise
            if n == 0:
                raise RuntimeError("the file is shorter than the span sent from it")
            offset, count = offset + n, count - n
            self.cycle.expected_content_length -= n
            if count and n < SENDFILE_MAX:  # the socket's buffer is full: no call bound to fail
                await self._writable()

    async def write(self, data: memoryview) -> None:
        await self._begin(len(data))
        while data:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                await self._writable()
                continue
            except ConnectionError:
                await self._lost()
                raise
            data = data[n:]
            self.cycle.expected_content_length -= n
