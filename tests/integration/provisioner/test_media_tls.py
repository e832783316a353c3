"""Media and images over HTTPS (issue 24 item 2): ``karios run provisioner`` with
``KARIOS_PROVISIONER_TLS`` and the deployment's certificate (a test CA, trustme) serves ``/media``
and ``/images`` over HTTPS only.

- The signed URL the job service mints for the BMC is ``https://`` (the media URL follows the
  setting), and it is fetched as minted from the HTTPS provisioner.
- Every answer — whole body, ranges over each edge of the job's slot, suffix and open ranges,
  multi-range (200), malformed (200), past the end (416), HEAD — is the same, status, headers and
  bytes, as the same app's over plain HTTP, where the body leaves by ``sendfile``: over TLS it
  streams (sendfile cannot encrypt), and what it streams is the same medium.
- A client without the CA is refused at the handshake; plain HTTP to the port gets no HTTP answer;
  ``karios ready provisioner`` probes it over HTTPS.
- The medium carries the CA (``KARIOS_TLS_CA_BUNDLE`` → ``/karios/ca.pem`` of the image method's
  overlay): inside the built live environment (its own curl and trust store), curl refuses the
  HTTPS ``/images`` URL, then — after the line the rendered install script runs first — fetches
  it and gets the image's bytes.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trustme

from karios.common.settings import KariosSettings
from karios.provisioner.app import create_app
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.install import CA_PATH, HostContext
from karios.provisioner.install.image import ImageMethod
from karios.provisioner.install.preseed import PreseedMethod
from karios.provisioner.install.preseed.render import hash_password
from karios.provisioner.media import serve as mediaserve
from tests.fixtures.apps import free_port
from tests.fixtures.installs import LIVE_PATH, in_live, live_root  # noqa: F401 (fixture)
from tests.fixtures.provision import insert_media_job
from tests.fixtures.wait import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Base ISOs are built once per machine (as tests/integration/provisioner/test_images_zero_copy.py).
MEDIA_CACHE = Path("/tmp/karios-test-media-cache")
JOB = "job-media-tls"
IMAGE = "debian/rootfs.tar"
IMAGE_SIZE = 3 * mediaserve.CHUNK + 777


@dataclass
class TlsProvisioner:
    url: str  # the HTTPS provisioner (karios run provisioner)
    plain: str  # the same app over plain HTTP (uvicorn httptools: zero copy)
    ca: Path
    minted: str  # the signed media URL the job service mints for the BMC
    size: int  # the medium's
    slot: tuple[int, int]  # (offset, size) of the job's slot in it, (0, 0) for a plain ISO file
    image: bytes
    env: dict[str, str]

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def _pki(tmp: Path) -> tuple[Path, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, cafile = tmp / "prov.pem", tmp / "prov.key", tmp / "ca.pem"
    cert.private_key_pem.write_to_path(str(keyfile))
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(certfile), append=i > 0)
    ca.cert_pem.write_to_path(str(cafile))
    return certfile, keyfile, cafile


async def _medium(svc, cfg: ProvisionerConfig) -> tuple[int, tuple[int, int]]:  # type: ignore[no-untyped-def]
    """The job's medium: a slot-patched base ISO when the ISO tools are here, else a plain ISO file
    (the same response either way; the slot's pieces are what makes the streamed path non-trivial)."""
    ctx = HostContext(
        job_id=JOB,
        token="tok-media-tls-" + "t" * 24,
        callback_base="https://127.0.0.1:9/controlnode",
        hostname="media-tls",
        bmc_ip="10.250.4.1",
        os_username="debian",
        password_hash=hash_password("adminadmin", salt="karios12"),
        disks=["/dev/sda"],
    )
    try:
        PreseedMethod().prepare("12", "bookworm")
        await svc.media.build_async(JOB, PreseedMethod().medium(ctx))
    except Exception:  # no xorriso/netboot files here: a plain per-job ISO file
        body = bytes((i * 131 + 7) % 256 for i in range(2 * mediaserve.CHUNK + 12345))
        (cfg.media_dir / f"{JOB}.iso").write_bytes(body)
    await insert_media_job(svc, JOB, ctx.bmc_ip)
    served = svc.media.open(JOB)
    if served is None:
        return (cfg.media_dir / f"{JOB}.iso").stat().st_size, (0, 0)
    return served.size, (served.layout.offset, served.layout.size)


@pytest.fixture
async def tls_prov(settings: KariosSettings, serve, tmp_path: Path) -> AsyncIterator[TlsProvisioner]:  # type: ignore[no-untyped-def]
    certfile, keyfile, cafile = _pki(tmp_path)
    port = free_port()
    images = tmp_path / "images"
    (images / "debian").mkdir(parents=True)
    image = os.urandom(IMAGE_SIZE)
    (images / IMAGE).write_bytes(image)
    tls = settings.model_copy(
        update={
            "tls_certfile": certfile,
            "tls_keyfile": keyfile,
            "tls_ca_bundle": cafile,
            "provisioner_tls": True,
            "provisioner_port": port,
            "host": "127.0.0.1",
        }
    )
    cfg = ProvisionerConfig.from_env(tls)  # the media URL and the CA as the service derives them
    assert cfg.media_url == f"https://127.0.0.1:{port}" and cfg.ca_bundle == cafile
    cfg.cache_dir, cfg.media_dir, cfg.images_dir = MEDIA_CACHE, tmp_path / "media", images
    cfg.media_dir.mkdir()
    cfg.lease_seconds = cfg.claim_interval = 3600  # no sweep takes the hand-made job
    app = create_app(settings, cfg)
    plain = await serve(app)
    svc = app.state.jobs
    size, slot = await _medium(svc, cfg)

    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env.update(
        KARIOS_DEV_MODE="1",
        KARIOS_SECRET_KEY=settings.secret_key.get_secret_value(),
        KARIOS_NATS_URL=settings.nats_url,
        KARIOS_DATABASE_URL=settings.database_url,
        KARIOS_BUS_PREFIX=settings.bus_prefix,
        KARIOS_LOG_JSON="false",
        KARIOS_HOST="127.0.0.1",
        KARIOS_PROVISIONER_PORT=str(port),
        KARIOS_STATE_DIR=str(tmp_path / "state"),
        KARIOS_TLS_CERTFILE=str(certfile),
        KARIOS_TLS_KEYFILE=str(keyfile),
        KARIOS_TLS_CA_BUNDLE=str(cafile),
        KARIOS_PROVISIONER_TLS="1",
        KARIOS_PROVISIONER_CACHE_DIR=str(cfg.cache_dir),
        KARIOS_PROVISIONER_MEDIA_DIR=str(cfg.media_dir),
        KARIOS_PROVISIONER_IMAGES_DIR=str(images),
        KARIOS_PROVISIONER_LEASE_SECONDS="3600",
        KARIOS_PROVISIONER_CLAIM_INTERVAL="3600",
    )
    log = tmp_path / "provisioner.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "karios.cli", "run", "provisioner"], env=env, stdout=out, stderr=out
        )
    prov = TlsProvisioner(
        f"https://127.0.0.1:{port}", plain.url, cafile, svc.media_url(JOB), size, slot, image, env
    )
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                return httpx.get(f"{prov.url}/readyz", verify=prov.verify(), timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until_sync(ready, timeout=60, interval=0.2, what="the HTTPS provisioner to be ready")
        yield prov
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:  # pragma: no cover - a hung shutdown
            proc.kill()
            proc.wait()


def _ranges(size: int, slot: tuple[int, int]) -> list[str | None]:
    """Range headers to ask both servers: none, each edge of the slot and of the file, suffix and
    open ranges, a multi-range and a malformed one (200), one past the end (416)."""
    at, n = slot
    points = sorted(
        {p for p in (0, at - 1, at, at + 1, at + n - 1, at + n, at + n + 1, size - 1) if 0 <= p < size}
    )
    spans = [f"bytes={a}-{b}" for a in points for b in points if a <= b]
    return [None, *spans, "bytes=-10", f"bytes={size - 5}-", "bytes=0-1,5-6", "bytes=x-1", f"bytes={size}-"]


def _same(tls: httpx.Response, plain: httpx.Response, what: str) -> None:
    assert tls.status_code == plain.status_code, (what, tls.status_code, plain.status_code)
    for h in ("content-range", "content-length", "etag", "last-modified", "accept-ranges", "cache-control"):
        assert tls.headers.get(h) == plain.headers.get(h), (what, h, tls.headers.get(h), plain.headers.get(h))
    assert tls.content == plain.content, what


async def test_media_and_images_over_https_answer_as_plain_http(tls_prov: TlsProvisioner) -> None:
    p = tls_prov
    minted = urlsplit(p.minted)
    assert p.minted.startswith(f"{p.url}/media/{JOB}.iso?expires="), p.minted  # what InsertMedia gets
    local = f"{minted.path}?{minted.query}"
    image = f"/images/{IMAGE}"
    statuses: set[int] = set()
    async with (
        httpx.AsyncClient(verify=p.verify(), timeout=120) as https,
        httpx.AsyncClient(timeout=120) as http,
    ):
        whole = await https.get(p.minted)  # the URL as minted, over HTTPS
        assert whole.status_code == 200 and len(whole.content) == p.size
        for path, size, slot in ((local, p.size, p.slot), (image, IMAGE_SIZE, (0, 0))):
            for rng in _ranges(size, slot):
                headers = {"Range": rng} if rng else {}
                for method in ("GET", "HEAD"):
                    t = await https.request(method, p.url + path, headers=headers)
                    _same(
                        t,
                        await http.request(method, p.plain + path, headers=headers),
                        f"{method} {path} {rng}",
                    )
                    statuses.add(t.status_code)
        assert (await https.get(p.url + image)).content == p.image
        assert whole.content == (await http.get(p.plain + local)).content
        # An unsigned medium request is refused over HTTPS as over HTTP.
        assert (await https.get(f"{p.url}/media/{JOB}.iso")).json()["code"] == "MEDIA_URL_INVALID"
    assert statuses == {200, 206, 416}, statuses

    # A client that does not trust the deployment's CA is refused at the handshake.
    async with httpx.AsyncClient(timeout=10) as untrusting:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await untrusting.get(p.url + image)
    # Plain HTTP to the HTTPS port gets no HTTP answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(p.url.replace("https:", "http:") + image, timeout=10)
    # karios up's readiness check (and `karios ready provisioner`) speak HTTPS to it.
    ready = subprocess.run(
        [sys.executable, "-m", "karios.cli", "ready", "provisioner"],
        env=p.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ready.returncode == 0, ready.stdout + ready.stderr


async def test_the_live_environment_verifies_images_with_the_medium_ca(
    tls_prov: TlsProvisioner,
    live_root: Path,  # noqa: F811
) -> None:
    p = tls_prov
    ctx = HostContext(
        job_id="job-ca",
        token="t",
        callback_base=f"{p.url}/controlnode",
        hostname="ca",
        bmc_ip="10.250.4.2",
        os_username="debian",
        password_hash="x",
        image_url=f"{p.url}/images/{IMAGE}",
        ca_bundle=p.ca.read_text(),
    )
    method = ImageMethod(ProvisionerConfig(cache_dir=Path("/nonexistent"), images_dir=Path("/nonexistent")))
    script = method.render_install_script(ctx)
    trust = [line for line in script.splitlines() if f"/{CA_PATH}" in line and "ca-certificates.crt" in line]
    assert trust == [f"cat /{CA_PATH} >> /etc/ssl/certs/ca-certificates.crt"], trust
    lines = [line.strip() for line in script.splitlines()]
    first_curl = next(i for i, line in enumerate(lines) if "curl " in line and not line.startswith("#"))
    assert lines.index(trust[0]) < first_curl  # trusted before any request is written

    bundle = live_root / "etc/ssl/certs/ca-certificates.crt"
    saved = bundle.read_bytes()
    (live_root / "karios").mkdir(exist_ok=True)
    shutil.copyfile(p.ca, live_root / CA_PATH)
    fetch = 'rc=0; curl -sS -o /run/image "$1" || rc=$?; echo "rc=$rc"; [ "$rc" != 0 ] || wc -c < /run/image'
    env = {"PATH": LIVE_PATH}
    try:
        before = subprocess.run(
            in_live(live_root, fetch, ctx.image_url), env=env, capture_output=True, text=True, timeout=60
        )
        assert "rc=60" in before.stdout, before.stdout + before.stderr  # curl: peer certificate not verified
        after = subprocess.run(
            in_live(live_root, f"{trust[0]}; {fetch}", ctx.image_url),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert after.stdout.split() == ["rc=0", str(IMAGE_SIZE)], after.stdout + after.stderr
        assert (live_root / "run/image").read_bytes() == p.image
    finally:
        bundle.write_bytes(saved)
        (live_root / CA_PATH).unlink(missing_ok=True)
        (live_root / "run/image").unlink(missing_ok=True)
