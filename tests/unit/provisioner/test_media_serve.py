"""The HTTP edge of constant-size media: a real base file served with a job's slot patched in.

GET/HEAD, one range (206 + Content-Range) over every slot boundary, 416 past the end, the whole
medium for multi-range, ETag/If-None-Match/If-Range, Last-Modified — read back over HTTP
(Starlette app on the ASGI transport) and compared with the patched reference; and what a server
offering ``http.response.zerocopysend`` is sent (spans of the base file, the slot as bytes).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from karios.provisioner.media import serve as mediaserve
from karios.provisioner.media.serve import ServedMedium, medium_response
from karios.provisioner.media.slot import BaseLayout

SIZE = 3 * mediaserve.CHUNK + 12345  # several chunks, an odd tail
SLOT_AT, SLOT = mediaserve.CHUNK - 100, 4096  # the slot straddles a chunk boundary


@pytest.fixture
def served(tmp_path: Path) -> ServedMedium:
    base = tmp_path / "base.iso"
    base.write_bytes(os.urandom(SIZE))
    return ServedMedium(base, BaseLayout("b" * 24, SIZE, SLOT_AT, SLOT), b"job-payload" * 50, 1_700_000_000)


def reference(m: ServedMedium) -> bytes:
    raw = m.base.read_bytes()
    slot = m.payload + bytes(SLOT - len(m.payload))
    return raw[:SLOT_AT] + slot + raw[SLOT_AT + SLOT :]


def client(m: ServedMedium) -> httpx.AsyncClient:
    async def route(request: Request):  # type: ignore[no-untyped-def]
        return medium_response(m, request, "job.iso")

    app = Starlette(routes=[Route("/media/job.iso", route, methods=["GET", "HEAD"])])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_whole_medium_and_head(served: ServedMedium) -> None:
    ref = reference(served)
    async with client(served) as c:
        r = await c.get("/media/job.iso")
        h = await c.head("/media/job.iso")
    assert r.status_code == 200 and r.content == ref
    assert r.headers["content-length"] == str(SIZE) == h.headers["content-length"]
    assert (
        r.headers["accept-ranges"] == "bytes" and r.headers["content-type"] == "application/x-iso9660-image"
    )
    assert r.headers["etag"] == h.headers["etag"] == served.etag
    assert r.headers["last-modified"] == "Tue, 14 Nov 2023 22:13:20 GMT"
    assert 'filename="job.iso"' in r.headers["content-disposition"]
    assert h.status_code == 200 and h.content == b""
    assert served.read() == ref  # the blocking reader agrees


EDGES = [0, SLOT_AT - 1, SLOT_AT, SLOT_AT + 549, SLOT_AT + 550, SLOT_AT + SLOT - 1, SLOT_AT + SLOT, SIZE - 1]


@pytest.mark.parametrize(("start", "end"), [(a, b) for a in EDGES for b in EDGES if a <= b])
async def test_one_range_over_every_slot_boundary(served: ServedMedium, start: int, end: int) -> None:
    async with client(served) as c:
        r = await c.get("/media/job.iso", headers={"Range": f"bytes={start}-{end}"})
    assert r.status_code == 206
    assert r.headers["content-range"] == f"bytes {start}-{end}/{SIZE}"
    assert r.headers["content-length"] == str(end - start + 1)
    assert r.content == reference(served)[start : end + 1]


async def test_suffix_open_ended_unsatisfiable_and_multi_range(served: ServedMedium) -> None:
    ref = reference(served)
    async with client(served) as c:
        tail = await c.get("/media/job.iso", headers={"Range": "bytes=-5000"})
        rest = await c.get("/media/job.iso", headers={"Range": f"bytes={SLOT_AT}-"})
        past = await c.get("/media/job.iso", headers={"Range": f"bytes={SIZE}-"})
        multi = await c.get("/media/job.iso", headers={"Range": "bytes=0-1,5-9"})
        head = await c.head("/media/job.iso", headers={"Range": "bytes=10-19"})
    assert tail.status_code == 206 and tail.content == ref[-5000:]
    assert rest.status_code == 206 and rest.content == ref[SLOT_AT:]
    assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{SIZE}"
    assert multi.status_code == 200 and multi.content == ref
    assert head.status_code == 206 and head.headers["content-length"] == "10" and head.content == b""


async def test_conditional_requests(served: ServedMedium) -> None:
    async with client(served) as c:
        same = await c.get("/media/job.iso", headers={"If-None-Match": served.etag})
        other = await c.get("/media/job.iso", headers={"If-None-Match": '"x"'})
        if_range_ok = await c.get("/media/job.iso", headers={"Range": "bytes=0-9", "If-Range": served.etag})
        if_range_old = await c.get("/media/job.iso", headers={"Range": "bytes=0-9", "If-Range": '"old"'})
    assert same.status_code == 304 and same.content == b""
    assert other.status_code == 200 and len(other.content) == SIZE
    assert if_range_ok.status_code == 206 and len(if_range_ok.content) == 10
    assert if_range_old.status_code == 200 and len(if_range_old.content) == SIZE


async def test_another_job_differs_only_in_the_slot_and_has_another_etag(served: ServedMedium) -> None:
    other = ServedMedium(served.base, served.layout, b"another job", served.mtime)
    async with client(served) as c1, client(other) as c2:
        a, b = (await c1.get("/media/job.iso")).content, (await c2.get("/media/job.iso")).content
    diff = [i for i in range(SIZE) if a[i] != b[i]]
    assert diff and min(diff) >= SLOT_AT and max(diff) < SLOT_AT + SLOT
    assert served.etag != other.etag


async def test_a_truncated_base_is_an_error_not_a_short_medium(served: ServedMedium) -> None:
    with open(served.base, "r+b") as f:
        f.truncate(SIZE - 10)
    with pytest.raises(OSError, match="shorter than its layout"):
        async for _ in served.stream(0, SIZE - 1):
            pass


async def zero_copy_get(m: ServedMedium, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes, list[str]]:
    """GET through a server offering ``http.response.zerocopysend``: the status, the body as the
    server would write it (each span read from the file it was given), and the message kinds."""

    async def route(request: Request):  # type: ignore[no-untyped-def]
        return medium_response(m, request, "job.iso")

    app = Starlette(routes=[Route("/media/job.iso", route, methods=["GET", "HEAD"])])
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/media/job.iso",
        "raw_path": b"/media/job.iso",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "extensions": {mediaserve.ZEROCOPY: {}},
    }
    status, body, kinds = 0, bytearray(), []
    done = asyncio.Event()

    async def receive() -> dict:
        if not kinds:
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status
        kinds.append(message["type"])
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == mediaserve.ZEROCOPY:
            body.extend(os.pread(message["file"].fileno(), message["count"], message["offset"]))
        else:
            body.extend(message.get("body", b""))
        if not message.get("more_body", message["type"] == "http.response.start"):
            done.set()

    await app(scope, receive, send)
    return status, bytes(body), kinds


async def test_a_server_offering_zero_copy_gets_file_spans_and_the_slot_as_bytes(
    served: ServedMedium,
) -> None:
    ref = reference(served)
    status, body, kinds = await zero_copy_get(served, [])
    assert (status, body) == (200, ref)
    zc, data = mediaserve.ZEROCOPY, "http.response.body"
    assert kinds == ["http.response.start", zc, data, zc, data]  # base, slot, base, end
    for start, end in [(0, 9), (SLOT_AT - 1, SLOT_AT), (SLOT_AT + 5, SLOT_AT + 9), (SLOT_AT, SIZE - 1)]:
        status, body, _ = await zero_copy_get(served, [(b"range", f"bytes={start}-{end}".encode())])
        assert (status, body) == (206, ref[start : end + 1]), (start, end)


async def test_a_truncated_base_is_an_error_with_zero_copy_too(served: ServedMedium) -> None:
    with open(served.base, "r+b") as f:
        f.truncate(SIZE - 10)
    with pytest.raises(OSError, match="shorter than its layout"):
        await zero_copy_get(served, [])
