"""``/media`` and ``/images`` by ``sendfile(2)`` (issue 25 item 6): the same answers, byte for byte,
whether the body leaves zero copy or streamed.

One provisioner app, served by three real uvicorn servers on ports at once:

- httptools on the test's loop: zero copy (``ZeroCopySend`` gives the response the
  ``http.response.zerocopysend`` extension; a spy counts the ``sendfile`` spans);
- httptools on uvloop (``karios run``'s loop, in a thread): zero copy too (``/images`` only: the
  app's database belongs to the test's loop);
- h11: no extension, the response streams (the fallback path).

The medium is a real one: a base ISO built by ``MediaBuilder`` with a job's slot (the preseed
overlay with its token), fetched by its signed URL. Its bytes are compared with an independent
reference (the base file with the slot's payload and zeros written over it at the layout's
offset), whole and in ranges over every edge of the slot; the token is read back from the
downloaded ISO as the installer reads it. Range semantics (206, 416, multi-range → 200,
If-Range, If-None-Match, HEAD) are asked of every server. A client that leaves mid-body costs
no error and no file descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn

from karios.provisioner.app import create_app
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.install import HostContext
from karios.provisioner.install.preseed import PreseedMethod
from karios.provisioner.install.preseed.render import hash_password
from karios.provisioner.media import serve as mediaserve
from karios.provisioner.media.serve import ServedMedium
from tests.fixtures.apps import free_port
from tests.fixtures.provision import insert_media_job, medium_token
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.integration

#: Base ISOs are built once per machine (the unit tests' cache: tests/unit/provisioner/test_media.py).
MEDIA_CACHE = Path("/tmp/karios-test-media-cache")
JOB = "job-zero-copy"
TOKEN = "tok-zero-copy-" + "z" * 24
IMAGE_SIZE = 5 * mediaserve.CHUNK + 4321  # several chunks, an odd tail


class Server:
    """One more uvicorn server of an app already started (lifespan off), on the test's loop or on
    uvloop in a thread."""

    def __init__(self, app: Any, *, http: str = "httptools", uvloop: bool = False) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, http=http, lifespan="off", log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread: threading.Thread | None = None
        self.task: asyncio.Task[None] | None = None
        if uvloop:
            import uvloop as uv

            self.thread = threading.Thread(target=lambda: uv.run(self.server.serve()), daemon=True)
            self.thread.start()
        else:
            self.task = asyncio.create_task(self.server.serve())

    async def started(self) -> Server:
        await wait_until(lambda: self.server.started, timeout=20, what="uvicorn to start")
        return self

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await asyncio.wait_for(self.task, 20)
        if self.thread is not None:
            await asyncio.to_thread(self.thread.join, 20)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every span ``ZeroCopySend`` sent with sendfile."""
    sent: list[int] = []
    original = mediaserve._UvicornSink.sendfile

    async def counted(self, file, offset, count):  # type: ignore[no-untyped-def]
        sent.append(count)
        await original(self, file, offset, count)

    monkeypatch.setattr(mediaserve._UvicornSink, "sendfile", counted)
    return sent


@pytest.fixture
async def prov(settings, serve, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The app (with a real medium and an image) on three servers: (urls by name, signed media
    path, served medium, image bytes)."""
    try:
        PreseedMethod().prepare("12", "bookworm")
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"Debian netboot/xorriso/grub tooling not installed: {exc}")
    images = tmp_path / "images"
    (images / "debian").mkdir(parents=True)
    image = os.urandom(IMAGE_SIZE)
    (images / "debian" / "rootfs.tar").write_bytes(image)
    cfg = ProvisionerConfig(cache_dir=MEDIA_CACHE, media_dir=tmp_path / "media", images_dir=images)
    app = create_app(settings, cfg)
    running = await serve(app)  # httptools on the test's loop (tests/fixtures/apps.py)
    svc = app.state.jobs
    ctx = HostContext(
        job_id=JOB,
        token=TOKEN,
        callback_base="http://10.0.0.1:8080/controlnode",
        hostname="zero-copy",
        bmc_ip="10.250.3.1",
        os_username="debian",
        password_hash=hash_password("adminadmin", salt="karios12"),
        disks=["/dev/sda"],
    )
    await svc.media.build_async(JOB, PreseedMethod().medium(ctx))
    await insert_media_job(svc, JOB, ctx.bmc_ip)
    served = svc.media.open(JOB)
    assert served is not None
    signed = urlsplit(svc.media_url(JOB))
    extra = [await Server(app, http="h11").started(), await Server(app, uvloop=True).started()]
    urls = {"httptools": running.url, "h11": extra[0].url, "uvloop": extra[1].url}
    yield urls, f"{signed.path}?{signed.query}", served, image
    for s in extra:
        await s.stop()


def reference(m: ServedMedium) -> bytes:
    """The medium as it must be, computed apart from the serving code: the base with the slot's
    payload and zeros written over it."""
    raw = bytearray(m.base.read_bytes())
    at, size = m.layout.offset, m.layout.size
    raw[at : at + size] = m.payload + bytes(size - len(m.payload))
    assert len(raw) == m.size
    return bytes(raw)


def edges(at: int, size: int, total: int) -> list[tuple[int, int]]:
    """(start, end) pairs over every edge of the slot [at, at + size) and of the file."""
    points = sorted({0, at - 1, at, at + 1, at + size - 1, at + size, at + size + 1, total - 1})
    return [(a, b) for a in points for b in points if a <= b]


async def test_the_medium_is_the_same_byte_for_byte_zero_copy_and_streamed(prov, spans, tmp_path) -> None:  # type: ignore[no-untyped-def]
    urls, medium, served, _ = prov
    ref = reference(served)
    at, size = served.layout.offset, served.layout.size
    bodies = {}
    async with httpx.AsyncClient(timeout=120) as c:
        for name in ("httptools", "h11"):
            before = len(spans)
            r = await c.get(urls[name] + medium)
            assert r.status_code == 200 and r.headers["content-length"] == str(served.size), name
            bodies[name] = r.content
            sent = spans[before:]
            if name == "httptools":  # base, slot (written), base: two spans by sendfile
                assert sent == [at, served.size - at - size], sent
            else:
                assert sent == [], sent
            for a, b in edges(at, size, served.size):
                part = await c.get(urls[name] + medium, headers={"Range": f"bytes={a}-{b}"})
                assert part.status_code == 206, (name, a, b)
                assert part.headers["content-range"] == f"bytes {a}-{b}/{served.size}", (name, a, b)
                assert part.content == ref[a : b + 1], (name, a, b)
    assert bodies["httptools"] == bodies["h11"] == ref == served.read()
    # The job's own slot, read from the downloaded ISO as the installer reads it (second initrd).
    iso = tmp_path / "downloaded.iso"
    iso.write_bytes(bodies["httptools"])
    token, files = await asyncio.to_thread(medium_token, iso)
    assert token == TOKEN and b"zero-copy" in files["preseed.cfg"]


async def test_images_zero_copy_on_both_loops(prov, spans) -> None:  # type: ignore[no-untyped-def]
    urls, _, _, image = prov
    async with httpx.AsyncClient(timeout=120) as c:
        for name in ("httptools", "uvloop", "h11"):
            before = len(spans)
            r = await c.get(urls[name] + "/images/debian/rootfs.tar")
            assert r.status_code == 200 and r.content == image, name
            assert spans[before:] == ([] if name == "h11" else [IMAGE_SIZE]), name
            for a, b in ((0, 0), (1, mediaserve.CHUNK + 1), (IMAGE_SIZE - 10, IMAGE_SIZE + 99)):
                part = await c.get(
                    urls[name] + "/images/debian/rootfs.tar", headers={"Range": f"bytes={a}-{b}"}
                )
                assert part.status_code == 206 and part.content == image[a : b + 1], (name, a, b)


async def test_range_semantics_are_the_same_on_every_server(prov) -> None:  # type: ignore[no-untyped-def]
    urls, medium, served, image = prov
    ref = reference(served)
    async with httpx.AsyncClient(timeout=120) as c:
        for name in ("httptools", "h11"):
            for path, body in ((medium, ref), ("/images/debian/rootfs.tar", image)):
                url, total = urls[name] + path, len(body)
                tag = (await c.head(url)).headers["etag"]
                tail = await c.get(url, headers={"Range": "bytes=-1000"})
                assert (tail.status_code, tail.content) == (206, body[-1000:]), (name, path)
                past = await c.get(url, headers={"Range": f"bytes={total}-"})
                assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{total}"
                assert past.content == b"", (name, path)
                multi = await c.get(url, headers={"Range": "bytes=0-1,5-9"})
                assert (multi.status_code, multi.content) == (200, body), (name, path)
                same = await c.get(url, headers={"Range": "bytes=100-199", "If-Range": tag})
                assert (same.status_code, same.content) == (206, body[100:200]), (name, path)
                other = await c.get(url, headers={"Range": "bytes=100-199", "If-Range": '"another"'})
                assert (other.status_code, other.content) == (200, body), (name, path)
                assert (await c.get(url, headers={"If-None-Match": tag})).status_code == 304
                head = await c.head(url, headers={"Range": "bytes=10-19"})
                assert head.status_code == 206 and head.headers["content-length"] == "10"
                assert head.headers["content-range"] == f"bytes 10-19/{total}", (name, path)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_client_leaving_mid_body_costs_no_error_and_no_descriptor(prov, spans, caplog) -> None:  # type: ignore[no-untyped-def]
    urls, medium, served, _ = prov
    caplog.set_level(logging.WARNING)
    async with httpx.AsyncClient(timeout=60) as c:
        assert (await c.get(urls["httptools"] + medium, headers={"Range": "bytes=0-0"})).status_code == 206
    baseline = _open_fds()
    port = int(urls["httptools"].rsplit(":", 1)[1])
    for linger in (False, True):  # a plain close (FIN), then a reset (RST)
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {medium} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            got = 0
            while got < 4 * 1024 * 1024:
                got += len(await reader.read(256 * 1024))
            if linger:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
    await wait_until(lambda: _open_fds() <= baseline, timeout=10, what="the server's descriptors closed")
    async with httpx.AsyncClient(timeout=120) as c:  # and the next client gets the whole medium
        r = await c.get(urls["httptools"] + medium)
    assert r.status_code == 200 and len(r.content) == served.size
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not errors, [rec.getMessage()[:300] for rec in errors]
