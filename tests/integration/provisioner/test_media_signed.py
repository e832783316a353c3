"""The install medium is fetchable only by its signed URL (issue 24, S2), on the real provisioner
app (PostgreSQL, NATS, uvicorn): unsigned, tampered, another job's or an expired URL is 403 for
GET and HEAD without a byte of the medium; the URL the job service mints is 200 with ranges (206)
while the job consumes its medium, and refused (MEDIA_JOB_ENDED) once the job has ended.

The medium is a per-job ISO file (``MediaBuilder.legacy_iso``): the same gate and response
function as a slot-patched medium, without the ISO tools.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from karios.provisioner.app import create_app
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.statemachine import State
from tests.fixtures.provision import insert_media_job

pytestmark = pytest.mark.integration

BODY = bytes((i * 31 + 3) % 256 for i in range(50_000))


async def _job(svc, job_id: str, bmc_ip: str, state: State) -> None:  # type: ignore[no-untyped-def]
    await insert_media_job(svc, job_id, bmc_ip, state.value)
    (svc.cfg.media_dir / f"{job_id}.iso").write_bytes(BODY)


@pytest.fixture
async def prov(settings, serve, tmp_path: Path):  # type: ignore[no-untyped-def]
    # A long lease: no sweep of this replica takes the hand-made worker-phase jobs.
    cfg = ProvisionerConfig(
        media_url="http://bmc-view.example:8082",
        cache_dir=tmp_path / "cache",
        media_dir=tmp_path / "media",
        images_dir=tmp_path / "images",
        lease_seconds=3600,
        claim_interval=3600,
    )
    cfg.media_dir.mkdir()
    app = create_app(settings, cfg)
    running = await serve(app)
    return running.url, app.state.jobs


def _local(url: str, base: str) -> str:
    """The signed URL as minted for the BMC (media_url), sent to the test's server instead."""
    parts = urlsplit(url)
    return f"{base}{parts.path}?{parts.query}"


def _refused(r: httpx.Response, code: str) -> None:
    assert r.status_code == 403, (r.request.method, r.status_code, r.text[:200])
    assert BODY[:64] not in r.content
    if r.request.method == "GET":
        assert r.json()["code"] == code, r.text


async def test_only_the_signed_url_of_a_live_job_gets_the_medium(prov) -> None:  # type: ignore[no-untyped-def]
    base, svc = prov
    job, other = "media-signed-1", "media-signed-2"
    await _job(svc, job, "10.250.0.1", State.building_media)
    await _job(svc, other, "10.250.0.2", State.building_media)
    minted = svc.media_url(job)
    assert minted.startswith(
        f"http://bmc-view.example:8082/media/{job}.iso?expires="
    )  # what InsertMedia gets
    url = _local(minted, base)
    q = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    plain = f"{base}/media/{job}.iso"

    async with httpx.AsyncClient(timeout=30) as c:
        for method in ("GET", "HEAD"):
            _refused(await c.request(method, plain), "MEDIA_URL_INVALID")  # unsigned
            _refused(await c.request(method, f"{plain}?expires={q['expires']}"), "MEDIA_URL_INVALID")
            bad = q["signature"][:-2] + ("AA" if not q["signature"].endswith("AA") else "BB")
            _refused(
                await c.request(method, f"{plain}?{urlencode({**q, 'signature': bad})}"), "MEDIA_URL_INVALID"
            )
            later = {**q, "expires": str(int(q["expires"]) + 86400)}  # a longer life is not signed
            _refused(await c.request(method, f"{plain}?{urlencode(later)}"), "MEDIA_URL_INVALID")
            # job's signature on another job's medium
            _refused(await c.request(method, f"{base}/media/{other}.iso?{urlencode(q)}"), "MEDIA_URL_INVALID")
            expired = _local(svc.media_access.url(svc.cfg.media_url, job, -1), base)
            _refused(await c.request(method, expired), "MEDIA_URL_EXPIRED")

        whole = await c.get(url)
        assert whole.status_code == 200 and whole.content == BODY
        assert whole.headers["cache-control"] == "no-store"
        part = await c.get(url, headers={"Range": "bytes=1000-1999"})
        assert part.status_code == 206 and part.content == BODY[1000:2000]
        assert part.headers["content-range"] == f"bytes 1000-1999/{len(BODY)}"
        head = await c.head(url, headers={"Range": "bytes=-10"})
        assert head.status_code == 206 and head.headers["content-length"] == "10"

        # The job ends: its URL is refused at once, though not expired.
        await svc.move(job, State.cancelled, "cancelled by the test")
        for method in ("GET", "HEAD"):
            _refused(await c.request(method, url), "MEDIA_JOB_ENDED")
        # and a medium whose file outlived its (ended) job is not served either
        (svc.cfg.media_dir / f"{job}.iso").write_bytes(BODY)
        _refused(await c.get(url), "MEDIA_JOB_ENDED")

        # A failed job too; and a signed URL of a job that never existed.
        await svc.move(other, State.failed, "failed by the test")
        _refused(await c.get(_local(svc.media_url(other), base)), "MEDIA_JOB_ENDED")
        _refused(await c.get(_local(svc.media_url("never-a-job"), base)), "MEDIA_JOB_ENDED")
