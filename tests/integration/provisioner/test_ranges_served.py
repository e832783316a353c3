"""``/media/<job>.iso`` and ``/images/<path>`` of a running provisioner answer every ``Range``
header the same way (one parser, ``karios.common.ranges``): hostile headers that answered 500
from ``/media`` and 400 from ``/images`` are ignored (200, the whole file); past the end is 416
with ``Content-Range: bytes */size``.

The medium here is a per-job ISO file (``MediaBuilder.legacy_iso``), served by the same response
function as a slot-patched medium; ``test_media_served.py`` covers the patched one. It is fetched
by its signed URL (a job in ``booting``), as a BMC does (``test_media_signed.py``).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from karios.provisioner.app import create_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.provision import insert_media_job

pytestmark = pytest.mark.integration

BODY = bytes((i * 13 + 7) % 256 for i in range(10_000))
SIZE = len(BODY)

# header → (status, the bytes served or None for none, Content-Range)
CASES: dict[str, tuple[int, bytes | None, str | None]] = {
    "bytes=0-99": (206, BODY[:100], f"bytes 0-99/{SIZE}"),
    "bytes=9990-": (206, BODY[9990:], f"bytes 9990-9999/{SIZE}"),
    "bytes=-10": (206, BODY[-10:], f"bytes 9990-9999/{SIZE}"),
    "bytes=5-999999": (206, BODY[5:], f"bytes 5-9999/{SIZE}"),
    "bytes=0-" + "9" * 100: (206, BODY, f"bytes 0-9999/{SIZE}"),
    "bytes=²-5": (200, BODY, None),
    "bytes=1-³": (200, BODY, None),
    "bytes=-¹": (200, BODY, None),
    "bytes=" + "1" * 5000 + "-": (200, BODY, None),
    "bytes=5-1": (200, BODY, None),
    "bytes=abc": (200, BODY, None),
    "bytes=0-1,5-6": (200, BODY, None),
    "items=0-5": (200, BODY, None),
    "bytes=10000-": (416, None, f"bytes */{SIZE}"),
    "bytes=" + "9" * 100 + "-": (416, None, f"bytes */{SIZE}"),
    "bytes=-0": (416, None, f"bytes */{SIZE}"),
}


@pytest.fixture
async def prov(settings, serve, tmp_path: Path) -> tuple[str, str]:
    """The provisioner's URL and the medium's signed path (+ query)."""
    media, images = tmp_path / "media", tmp_path / "images"
    media.mkdir()
    (images / "debian").mkdir(parents=True)
    (media / "job-ranges.iso").write_bytes(BODY)
    (images / "debian" / "rootfs.tar").write_bytes(BODY)
    cfg = ProvisionerConfig(cache_dir=tmp_path / "cache", media_dir=media, images_dir=images)
    app = create_app(settings, cfg)
    running = await serve(app)
    svc = app.state.jobs
    await insert_media_job(svc, "job-ranges", "10.250.1.1")
    signed = urlsplit(svc.media_url("job-ranges"))
    return running.url, f"{signed.path}?{signed.query}"


@pytest.mark.parametrize("header", list(CASES), ids=lambda h: h[:24])
async def test_media_and_images_answer_a_range_the_same(prov: tuple[str, str], header: str) -> None:
    status, body, crange = CASES[header]
    raw = header.encode("utf-8")  # what a client on the wire sends (the report's ², ³, ¹)
    base, medium = prov
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        answers = [
            await c.request(method, url, headers=[(b"Range", raw)])
            for url in (medium, "/images/debian/rootfs.tar")
            for method in ("GET", "HEAD")
        ]
    for r in answers:
        where = (r.request.method, r.request.url.path, header[:40])
        assert r.status_code == status, (where, r.text[:200])
        assert r.headers.get("content-range") == crange, where
        assert r.headers["accept-ranges"] == "bytes", where
        if body is not None:
            assert int(r.headers["content-length"]) == len(body), where
            if r.request.method == "GET":
                assert r.content == body, where


async def test_if_range_with_another_validator_sends_the_whole_file(prov: tuple[str, str]) -> None:
    base, medium = prov
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        for url in (medium, "/images/debian/rootfs.tar"):
            tag = (await c.head(url)).headers["etag"]
            same = await c.get(url, headers={"Range": "bytes=0-9", "If-Range": tag})
            other = await c.get(url, headers={"Range": "bytes=0-9", "If-Range": '"not-it"'})
            assert (same.status_code, same.content) == (206, BODY[:10]), url
            assert (other.status_code, other.content) == (200, BODY), url
            assert (await c.get(url, headers={"If-None-Match": tag})).status_code == 304, url
